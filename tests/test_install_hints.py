"""Install hints name the command that works here: rtanon is not on a package index, so every missing
extra points at ``setup.sh`` in the checkout (or pip from the source folder), and a recipe checks what it
imports before any work (exit 2, never an internal error)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from rtanon.cli import main
from rtanon.errors import install_hint


def test_the_hint_is_setup_sh_in_the_checkout_of_this_venv(tmp_path, monkeypatch):
    checkout = tmp_path / "rtanon"
    (checkout / ".venv").mkdir(parents=True)
    (checkout / "setup.sh").write_text("")
    (checkout / "pyproject.toml").write_text("")
    monkeypatch.setattr(sys, "prefix", str(checkout / ".venv"))
    assert install_hint("eval") == f"cd {checkout} && RTANON_EXTRAS=eval ./setup.sh"
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere" / "venv"))
    assert install_hint("eval") == "pip install '.[eval]' in the rtanon source folder"


def test_a_recipe_missing_resemblyzer_is_a_usage_error_with_the_install_line(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "resemblyzer" else real(name, *a))
    (tmp_path / "d").mkdir()
    assert main(["train", "vocoder", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rtanon train: error: rtanon train vocoder needs resemblyzer (the [train] extra): "
                   f"{install_hint('train')}"]
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("module", ["ctranslate2", "torch"])
def test_the_content_recipe_checks_its_imports_first(tmp_path, monkeypatch, capsys, module):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    assert main(["train", "content", "--data", str(tmp_path), "--out", str(tmp_path / "c")]) == 2
    assert f"needs {module} (the [train] extra)" in capsys.readouterr().err
