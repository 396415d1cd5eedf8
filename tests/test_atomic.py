"""rtanon.atomic: a file appears complete under its name, or not at all, and nothing is left behind."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from rtanon import atomic
from rtanon.io.audio import AudioFileError, AudioWriter


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(atomic.PART_SUFFIX))


def test_a_clean_exit_replaces_the_target_with_ordinary_permissions(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with atomic.atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.txt.")
        tmp.write_text("new")
        assert target.read_text() == "old"  # not before the block ends
    assert target.read_text() == "new"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    assert _leftovers(tmp_path) == []


def test_an_exception_leaves_the_target_as_it_was_and_no_temporary_file(tmp_path):
    target = tmp_path / "out.npz"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic.atomic_open(target) as f:
            np.savez(f, x=np.arange(3))
            raise RuntimeError("writer failed")
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_a_signal_inside_mkstemp_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Under load a CI-like loop sent SIGINT just as the temporary file appeared: the exception came out of
    mkstemp after it made the file, before its name was returned. The file is this process's by its name;
    another live process's file of the same target stays."""
    real = atomic.tempfile.mkstemp
    others = tmp_path / ".out.wav.1.abcdefgh.part"  # PID 1 runs: a live writer's
    others.write_bytes(b"")

    def interrupted_mkstemp(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.tempfile, "mkstemp", interrupted_mkstemp)
    with pytest.raises(KeyboardInterrupt):
        with atomic.atomic_path(tmp_path / "out.wav"):
            pass
    assert _leftovers(tmp_path) == [others.name]
    assert not (tmp_path / "out.wav").exists()


def test_a_target_that_is_a_folder_fails_without_leftovers(tmp_path):
    (tmp_path / "out.json").mkdir()
    with pytest.raises(OSError):
        atomic.write_text(tmp_path / "out.json", "{}")
    assert _leftovers(tmp_path) == []


def test_atomic_open_writes_whole_files_only(tmp_path):
    with pytest.raises(ValueError, match="whole files"):
        with atomic.atomic_open(tmp_path / "x", "a"):
            pass


def test_leftovers_of_a_killed_run_are_swept_for_that_name_only(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".a.wav.{dead.pid}.k1ll3d.part").write_bytes(b"x")
    (tmp_path / f".b.wav.{dead.pid}.k1ll3d.part").write_bytes(b"x")
    (tmp_path / "a.wav").write_bytes(b"keep")
    removed = atomic.remove_leftovers(tmp_path, "a.wav")
    assert [p.name for p in removed] == [f".a.wav.{dead.pid}.k1ll3d.part"]
    assert _leftovers(tmp_path) == [f".b.wav.{dead.pid}.k1ll3d.part"] and (tmp_path / "a.wav").exists()


def test_the_audio_writer_sweeps_a_killed_runs_leftover_and_cleans_its_own_failures(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid names a writer that is gone, as after kill -9
    (tmp_path / f".o.wav.{dead.pid}.k1ll3d.part").write_bytes(b"x" * 1000)
    live = tmp_path / f".o.wav.{os.getpid()}.wr1t1ng.part"  # a writer still running: kept
    live.write_bytes(b"x")
    with AudioWriter(tmp_path / "o.wav") as w:
        w.write(np.zeros(1600, np.float32))
    assert (tmp_path / "o.wav").stat().st_size > 3200 and _leftovers(tmp_path) == [live.name]
    live.unlink()
    with pytest.raises(ValueError):
        with AudioWriter(tmp_path / "p.wav") as w:
            w.write(np.zeros(1600, np.float32))
            raise ValueError("a stage failed")
    assert not (tmp_path / "p.wav").exists() and _leftovers(tmp_path) == []
    (tmp_path / "q.wav").mkdir()  # an output that is a folder
    with pytest.raises(OSError):
        with AudioWriter(tmp_path / "q.wav") as w:
            w.write(np.zeros(1600, np.float32))
    assert _leftovers(tmp_path) == []
    with pytest.raises(AudioFileError, match="unknown output format"):
        AudioWriter(tmp_path / "r.xyz")
    with pytest.raises(AudioFileError, match="cannot write RAW"):  # headerless: no default sample format
        with AudioWriter(tmp_path / "r.raw") as w:
            w.write(np.zeros(1600, np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.wav", "q.wav"]
