"""Files that hold a secret or a voice are their owner's alone: identity files are written 0600 (a token's
mode), and a token file other users may read is named with the fix."""

from __future__ import annotations

import os
import stat

import numpy as np

from rtanon.atomic import write_text
from rtanon.commands.serve import load_token, read_token
from rtanon.identity.speaker import PseudoSpeaker


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_an_identity_file_is_written_for_its_owner_alone(tmp_path):
    old = os.umask(0o022)
    try:
        voice = PseudoSpeaker(np.ones(4, np.float32) / 2, np.linspace(80, 200, 101).astype(np.float32), "f",
                              {"name": "test"})
        voice.save(tmp_path / "me.json")
        write_text(tmp_path / "plain.txt", "x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "me.json") == 0o600
    assert _mode(tmp_path / "plain.txt") == 0o644  # what is not private keeps the usual mode
    assert PseudoSpeaker.load(tmp_path / "me.json").gender == "f"


def test_a_token_file_others_can_read_is_warned_about(tmp_path):
    said: list[str] = []
    new = tmp_path / "token"
    token = read_token(str(new), said.append)
    assert _mode(new) == 0o600 and said == [f"wrote a new token to {new}"]
    said.clear()
    assert load_token(str(new), "fix", said.append) == token and said == []
    os.chmod(new, 0o644)
    assert read_token(str(new), said.append) == token
    assert len(said) == 1 and "readable by other users (mode 0644)" in said[0] and f"chmod 600 {new}" in said[0]


def test_loading_a_model_leaves_no_onnx_runtime_telemetry_on_disk(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / ".cache"))  # rtanon as this run imports it
    code = "import rtanon.content.stream as s; s.ContentEncoderModel()"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / ".cache" / "Microsoft").exists(), sorted(p.name for p in tmp_path.rglob("*"))
