"""Issue 45: reliability, round two.

Each test reproduces a finding of the issue: outputs that are device nodes or FIFOs replaced by regular
files, identities that overflow float32, names too long for the temporary file, bad input reported as an
internal error, reads that never end, untrusted text reaching the terminal, the control page's unchecked
actions, and the Ray runs' interrupts, bindings and sweeps."""

from __future__ import annotations

import os
import stat

import pytest
import soundfile as sf

from rtanon import atomic
from test_cli_errors import _one_line_error, _rtanon

RATE = 16000


@pytest.fixture(scope="module")
def wav(tmp_path_factory, speech):
    path = tmp_path_factory.mktemp("in") / "in.wav"
    sf.write(path, speech[: 2 * RATE], RATE)
    return path


# -- 1. an output that is a device node or a FIFO is refused, never replaced ----------------------------

def _special(tmp_path, kind):
    path = tmp_path / f"{kind}.wav"
    if kind == "fifo":
        os.mkfifo(path)
    else:  # a copy of /dev/null: only root may make one
        if os.geteuid() != 0:
            pytest.skip("making a character device needs root")
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return path


def _still_special(path, kind):
    mode = path.lstat().st_mode
    return stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_the_atomic_writer_refuses_a_special_target_and_leaves_it(tmp_path, kind):
    path = _special(tmp_path, kind)
    with pytest.raises(atomic.OutputPathError, match="not a regular file"):
        atomic.write_text(path, "x")
    assert _still_special(path, kind)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
@pytest.mark.parametrize("writer", ["f0", "file", "identity new"])
def test_every_writer_refuses_a_special_output_in_one_line(tmp_path, wav, writer, kind):
    path = _special(tmp_path, kind)
    args = {"f0": ["f0", str(wav), str(path)],
            "file": ["file", str(wav), str(path), "--method", "mcadams"],
            "identity new": ["identity", "new", "--seed", "1", "--out", str(path)]}[writer]
    _one_line_error(_rtanon(*args, timeout=120), contains="not a regular file")
    assert _still_special(path, kind)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
