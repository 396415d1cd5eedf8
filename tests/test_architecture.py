"""The import rules of ``docs/ARCHITECTURE.md``: which part of rtanon may import which, the root of the
package kept to the streaming core and the shared utilities, and no module too long to read.

The graph is ``test_layout``'s (every import statement of every module, function-level ones included)."""

from __future__ import annotations

from test_layout import PACKAGE, _import_graph, _modules  # pytest puts tests/ on sys.path (no __init__.py)

#: the streaming core: what one session runs (``Anonymizer``, ``Session``, the stages and their models)
CORE = ("rtanon.engine", "rtanon.methods", "rtanon.batch", "rtanon.config", "rtanon.constants", "rtanon.stages",
        "rtanon.content", "rtanon.neural", "rtanon.f0", "rtanon.identity")
#: the utilities every part may import: they import nothing but each other (and the native extension)
UTILITIES = ("rtanon.errors", "rtanon.constants", "rtanon.atomic", "rtanon.paths", "rtanon.io", "rtanon._core")
#: the tools the core serves
TOOLS = ("rtanon.live", "rtanon.serve", "rtanon.corpus", "rtanon.eval", "rtanon.ui", "rtanon.bench")
COMMAND_LINE = ("rtanon.cli", "rtanon.commands", "rtanon.__main__")

#: (who, what they may not import, the exceptions to that); ``who`` and the names are module prefixes
RULES = (
    ("the streaming core", CORE, TOOLS + COMMAND_LINE + ("rtanon.train",), ()),
    ("the utilities", UTILITIES, "anything else of rtanon", UTILITIES),
    ("rtanon.live", ("rtanon.live",), ("rtanon.corpus", "rtanon.serve", "rtanon.ui", "rtanon.eval", "rtanon.bench",
                                       "rtanon.train") + COMMAND_LINE, ("rtanon.eval.signal",)),
    ("rtanon.corpus", ("rtanon.corpus",), ("rtanon.live", "rtanon.serve", "rtanon.ui", "rtanon.eval", "rtanon.bench",
                                           "rtanon.train") + COMMAND_LINE, ()),
    ("rtanon.serve", ("rtanon.serve",), ("rtanon.ui", "rtanon.eval", "rtanon.bench", "rtanon.train") + COMMAND_LINE,
     ("rtanon.eval.signal",)),
    ("rtanon.eval", ("rtanon.eval",), ("rtanon.live", "rtanon.serve", "rtanon.ui", "rtanon.bench", "rtanon.train")
     + COMMAND_LINE, ()),
    ("rtanon.ui", ("rtanon.ui",), "anything else of rtanon", UTILITIES),
    ("the run time", ("rtanon",), ("rtanon.commands",), ()),
)
#: modules that may import the command modules: the command line itself
COMMAND_IMPORTERS = COMMAND_LINE + ("rtanon.train.commands",)
MAX_MODULE_LINES = 600
MAX_ROOT_MODULES = 12


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import in ``graph`` (module -> the rtanon modules it imports) that ``RULES`` forbid."""
    out = []
    for what, who, forbidden, allowed in RULES:
        for module, targets in graph.items():
            if not _under(module, who) or _under(module, COMMAND_IMPORTERS):
                continue
            for target in sorted(targets):
                if _under(target, allowed):
                    continue
                if (not _under(target, who) if forbidden == "anything else of rtanon" else _under(target, forbidden)):
                    out.append(f"{module} imports {target} ({what} may not)")
    return out


def test_every_import_keeps_the_rules_of_the_architecture():
    found = violations(_import_graph())
    assert not found, "\n".join(found)


def test_the_rules_catch_a_forbidden_import():
    """The check itself can fail: the engine reaching into the live loop, the corpus tool into training, or a
    utility into the core, is each reported."""
    graph = {"rtanon.engine": {"rtanon.config", "rtanon.live.core"}, "rtanon.corpus.run": {"rtanon.train.shards"},
             "rtanon.io.audio": {"rtanon.engine"}, "rtanon.live.loop": {"rtanon.eval.signal", "rtanon.serve.remote"},
             "rtanon.serve.server": {"rtanon.commands.serve"}}
    assert violations(graph) == [
        "rtanon.engine imports rtanon.live.core (the streaming core may not)",
        "rtanon.io.audio imports rtanon.engine (the utilities may not)",
        "rtanon.live.loop imports rtanon.serve.remote (rtanon.live may not)",
        "rtanon.corpus.run imports rtanon.train.shards (rtanon.corpus may not)",
        "rtanon.serve.server imports rtanon.commands.serve (rtanon.serve may not)",
        "rtanon.serve.server imports rtanon.commands.serve (the run time may not)"]


def test_no_module_is_longer_than_the_layout_allows():
    long = sorted(f"{m}: {n} lines" for m, p in _modules().items()
                  if p.suffix == ".py" and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES)
    assert not long, long


def test_the_package_root_holds_the_core_and_the_shared_utilities_only():
    """At most 12 modules beside the packages, ``__init__`` and ``__main__`` counted."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_each_package_says_what_it_is_and_what_it_may_import():
    for name in ("live", "corpus", "io"):
        doc = (PACKAGE / name / "__init__.py").read_text()
        assert doc.startswith('"""') and "May import" in doc, name
