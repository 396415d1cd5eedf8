"""`pip install .` without setup.sh (issue "a new user's first hour"): the wheel builds from the source
tree with pip's own build isolation (scikit-build-core, pybind11, CMake and Ninja from the configured
indexes), with the C++ extension where a compiler is, without it where none is (the F0 tracker then runs
its Numba kernel, the live loop a Python ring buffer), and the installed `rtanon` anonymizes the demo
sample and lists the devices.

What this proves, and what not: the wheel is built as `pip install .` builds it (the same PEP 517 build, the
same CMakeLists.txt), then installed with --no-deps into a fresh venv that sees the test run's
site-packages through a .pth file for the dependencies; resolving and downloading the dependencies (pip's
job, 2-3 minutes here) is not repeated. Slow: about 1.5 minutes with a compiler, 20 s without, on 2 cores.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    return {**env, **extra}


def _wheel(out: Path, **env) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the source tree (git) to build from")
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(out), "-v"],
                         capture_output=True, text=True, env=_clean_env(**env), timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    said = [line.strip() for line in (run.stdout + run.stderr).splitlines() if "rtanon: building" in line]
    assert len(said) == 1, run.stdout[-3000:] + run.stderr[-3000:]  # the one line saying which F0 kernel
    assert ("without the C++ extension" in said[0]) == ("CXX" in env), said
    (wheel,) = out.glob("rtanon-*.whl")
    return wheel


def _venv(tmp: Path, wheel: Path) -> Path:
    """A fresh venv with ``wheel`` installed, the dependencies seen from this run's site-packages."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   env=_clean_env(), timeout=300)
    # afterwards: pip would take the runner's rtanon for this one; a .pth comes after the venv's own packages
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "rtanon-test-deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    where = subprocess.run([str(py), "-c", "import rtanon; print(rtanon.__file__)"], capture_output=True,
                           text=True, env=_clean_env(), cwd=tmp, check=True).stdout
    assert where.startswith(str(venv)), where  # the installed rtanon, not the source tree's or the runner's
    return venv


def _rtanon(venv: Path, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "rtanon"), *args], capture_output=True, text=True,
                          env=_clean_env(), cwd=cwd, timeout=600)


def _anonymizes_the_demo(venv: Path, tmp: Path) -> None:
    demo = _rtanon(venv, "demo", "--method", "mcadams", "--out", str(tmp / "demo.wav"), cwd=tmp)
    assert demo.returncode == 0, demo.stderr[-2000:]
    out = _rtanon(venv, "file", "--seed", "1", str(tmp / "demo-original.wav"), str(tmp / "out.wav"), cwd=tmp)
    assert out.returncode == 0, out.stderr[-2000:]  # the neural method: it runs the F0 kernel
    assert (tmp / "out.wav").stat().st_size > 1000


def test_pip_install_builds_the_cpp_kernel_and_runs(tmp_path):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler here")
    venv = _venv(tmp_path, _wheel(tmp_path / "wheel"))
    version = _rtanon(venv, "--version", cwd=tmp_path)
    assert "F0 kernel C++" in version.stdout, version.stdout + version.stderr
    _anonymizes_the_demo(venv, tmp_path)
    devices = _rtanon(venv, "devices", cwd=tmp_path)
    # PortAudio is libportaudio2 here (sounddevice's Linux wheel does not bundle it): the devices listed, or
    # (a machine without any, exit 1) what to check; without PortAudio, one line naming it (exit 2)
    assert "Traceback" not in devices.stderr and devices.returncode in (0, 1, 2), devices.stderr
    assert (devices.stdout + devices.stderr).strip()


def test_pip_install_without_a_compiler_runs_the_numba_kernel(tmp_path):
    """CXX names no compiler: CMake finds none, the wheel has no extension, the same commands run."""
    wheel = _wheel(tmp_path / "wheel", CXX=str(tmp_path / "no-such-c++"))
    venv = _venv(tmp_path, wheel)
    assert not list(venv.glob("lib/python*/site-packages/rtanon/_core*.so"))
    version = _rtanon(venv, "--version", cwd=tmp_path)
    assert "F0 kernel Numba" in version.stdout, version.stdout + version.stderr
    _anonymizes_the_demo(venv, tmp_path)
