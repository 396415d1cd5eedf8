"""The package's layout: what ships (the run time) never imports the training package, no module imports
itself back through others, and every tool is an ``rtanon`` subcommand rather than a ``python -m`` module.

The graph is built from the import statements of every module under ``src/rtanon`` (top-level and
function-level alike: a late import is still a dependency)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "rtanon"


def _modules() -> dict[str, Path]:
    """Python modules, and the native extension by its stub (``_core.pyi``: a leaf of the graph)."""
    out = {}
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi")]:
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _import_graph() -> dict[str, set[str]]:
    """module -> the rtanon modules its import statements name (the deepest existing module of each)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        if path.suffix == ".pyi":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("rtanon"):
                targets = [resolve(f"{node.module}.{a.name}") for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names if a.name.startswith("rtanon")]
            else:
                continue
            graph[module].update(t for t in targets if t and t != module)
    return graph


def test_the_run_time_never_imports_the_training_package():
    offenders = sorted(f"{m} imports {t}" for m, targets in _import_graph().items()
                       if not m.startswith("rtanon.train") for t in targets if t.startswith("rtanon.train"))
    assert not offenders, offenders


def test_the_import_graph_has_no_cycles():
    graph = _import_graph()
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " -> ".join(cycle)


def test_no_python_m_entry_points_beside_the_cli():
    """One entry point: the ``rtanon`` command (``python -m rtanon`` runs the same)."""
    mains = sorted(m for m, p in _modules().items()
                   if m != "rtanon.__main__" and '__name__ == "__main__"' in p.read_text())
    assert not mains, mains


def test_running_the_neural_method_loads_nothing_of_the_training_package():
    code = ("import sys, numpy as np\n"
            "from rtanon import Anonymizer, AnonymizerConfig\n"
            "s = Anonymizer(AnonymizerConfig(method='neural')).open_session(seed=0)\n"
            "s.process_signal(np.zeros(16000, np.float32))\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('rtanon.train'))\n"
            "assert not loaded, loaded\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_the_error_base_is_a_leaf_and_every_user_error_derives_from_it():
    """``rtanon.errors`` imports nothing of rtanon (any module may raise its errors), and the CLI's one-line
    errors are exactly the subclasses of ``UserError``."""
    assert _import_graph()["rtanon.errors"] == set()
    from rtanon.io.audio import AudioFileError
    from rtanon.config import ConfigError
    from rtanon.errors import CliError, UserError
    from rtanon.io.kaldi import KaldiDirError
    from rtanon.neural.backends import BackendUnavailable
    from rtanon.stages.neural import VocoderMissing

    for cls in (AudioFileError, ConfigError, CliError, KaldiDirError, BackendUnavailable, VocoderMissing):
        assert issubclass(cls, UserError), cls


def test_files_are_replaced_through_the_one_atomic_writer():
    """Only ``rtanon.atomic`` renames a temporary file into place; every other writer goes through it."""
    offenders = []
    for module, path in _modules().items():
        if module == "rtanon.atomic" or path.suffix == ".pyi":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("replace", "rename", "mkstemp")
                    and not (isinstance(node.func.value, ast.Constant) or node.args and
                             isinstance(node.args[0], ast.Constant))):
                if node.func.attr == "replace" and len(node.args) == 2 and not node.keywords:
                    # str.replace(old, new) takes two strings; os.replace / Path.replace take paths
                    if isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
                        offenders.append(f"{module}:{node.lineno} os.replace")
                    continue
                if node.func.attr == "replace" and len(node.args) == 1:
                    offenders.append(f"{module}:{node.lineno} Path.replace")
                elif node.func.attr in ("rename", "mkstemp"):
                    offenders.append(f"{module}:{node.lineno} {node.func.attr}")
    assert not offenders, offenders
