"""What a set-up installs, for tests that run rtanon as a user would after it (not collected: no ``test_``
prefix).

``setup_extras(job)`` asks ``setup.sh`` itself which extras a job installs (``setup.sh`` runs in a copy with
a fake ``.venv`` that records its pip command); ``env_without_extras(tmp, extras)`` is an environment for
``python -m rtanon`` in which the modules that only those extras' packages provide cannot be imported, as
in a ``.venv`` that never installed them (a ``sitecustomize`` on ``PYTHONPATH`` hides them from the import
system, ``importlib.util.find_spec`` included)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Installed by setup.sh beside the [identity] extra, outside pyproject.toml (its metadata is stale).
SETUP_EXTRA_MODULES = {"identity": ("resemblyzer",)}

_SITECUSTOMIZE = '''\
import os
import sys

_HIDDEN = set(filter(None, os.environ.get("RTANON_TEST_HIDDEN_MODULES", "").split(",")))


class _Hide:
    """Wraps a finder: the hidden top-level modules (and everything under them) are not found."""

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _HIDDEN:
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [_Hide(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
'''


def _dist(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def setup_packages(job: str, tmp: Path) -> list[str]:
    """The Debian packages ``./setup.sh JOB`` installs on a machine that has none of them (its apt-get and
    dpkg recorded, not run)."""
    _, calls = setup_extras(job, tmp, dpkg_has_all=False)
    installs = [c.split() for c in calls if c.startswith("apt-get ") and " install " in c]
    assert len(installs) == 1, calls
    return [w for w in installs[0][installs[0].index("install") + 1:] if not w.startswith("-")]


def setup_extras(job: str, tmp: Path, extra_env: dict | None = None,
                 dpkg_has_all: bool = True) -> tuple[list[str], list[str]]:
    """(extras that ``./setup.sh JOB`` installs into .venv, every command its .venv python, apt-get and sudo
    were given), from a run of setup.sh in a copy under ``tmp`` whose ``.venv/bin/python`` and ``rtanon`` only
    record their arguments and whose ``dpkg`` says every system package is there (``dpkg_has_all``; otherwise
    none is, and apt-get records what it is asked)."""
    root = tmp / f"setup-{job or 'plain'}"
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / "bin").mkdir()
    shutil.copy(REPO / "setup.sh", root / "setup.sh")
    log = root / "calls.log"
    for tool in (root / ".venv" / "bin" / "python", root / ".venv" / "bin" / "rtanon"):
        tool.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> "{log}"\n')
        tool.chmod(0o755)
    record = f'echo "$(basename "$0") $*" >> "{log}"'
    fakes = (("dpkg", "exit 0"), ("apt-get", "echo apt-get must not run >&2; exit 1"),
             ("sudo", "echo sudo must not run >&2; exit 1")) if dpkg_has_all else \
        (("dpkg", "exit 1"), ("apt-get", record), ("sudo", 'exec "$@"'))
    for tool, body in fakes:
        (root / "bin" / tool).write_text(f"#!/bin/sh\n{body}\n")
        (root / "bin" / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{root / 'bin'}:{os.environ['PATH']}", "PYTHON": sys.executable,
           "RTANON_EXTRAS": "", **(extra_env or {})}
    proc = subprocess.run(["bash", str(root / "setup.sh"), *([job] if job else [])], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    installs = [c for c in calls if re.match(r"python -m pip install -q \.(\[|$)", c)]
    assert len(installs) == 1, calls
    m = re.search(r"\.\[([^\]]*)\]", installs[0])
    return (m.group(1).split(",") if m else []), calls


def hidden_modules(installed_extras) -> list[str]:
    """The top-level modules that only the extras not in ``installed_extras`` bring (names as imported)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    keep = {_dist(r) for r in project["dependencies"]}
    for extra in installed_extras:
        keep |= {_dist(r) for r in project["optional-dependencies"].get(extra, ())}
    modules = set()
    for extra, reqs in project["optional-dependencies"].items():
        if extra in installed_extras:
            continue
        for dist in {_dist(r) for r in reqs} - keep:
            modules.add(dist.replace("-", "_"))
            if dist.endswith("-prebuilt"):  # pyworld-prebuilt installs pyworld
                modules.add(dist.removesuffix("-prebuilt").replace("-", "_"))
        modules.update(SETUP_EXTRA_MODULES.get(extra, ()))
    return sorted(modules)


def env_without_extras(tmp: Path, installed_extras, base_env: dict | None = None) -> dict:
    """An environment for ``python -m rtanon`` (the rtanon this process imports) where only ``installed_extras`` are
    importable of rtanon's extras."""
    site = tmp / "hide-extras"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = dict(base_env or os.environ)
    # the rtanon this process imports (the source tree, or the installed package with its built extension)
    package_parent = Path(__import__("rtanon").__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(package_parent)])
    env["RTANON_TEST_HIDDEN_MODULES"] = ",".join(hidden_modules(installed_extras))
    return env
