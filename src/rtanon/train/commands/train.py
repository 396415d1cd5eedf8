"""``rtanon train MODEL ...``: training recipes for rtanon's own models.

Each model has its own module ``rtanon.train.commands.train_<name>`` with
``register(subparsers)``; add its name to ``TRAIN_TARGETS`` (e.g. a
``vocoder`` recipe later). Training needs ``pip install 'rtanon[train]'``.
"""

from __future__ import annotations

import importlib

#: Trainable models, in the order ``rtanon train --help`` lists them.
TRAIN_TARGETS = ["content", "vocoder"]


def register(sub) -> None:
    p = sub.add_parser("train", help="train rtanon's own models (needs the [train] extra)",
                       description="Training recipes for rtanon's models. Every recipe reads Kaldi-style "
                                   "data directories, fixes its seeds, logs to a file in --out and resumes "
                                   "from the checkpoint there when rerun.")
    tsub = p.add_subparsers(dest="model", metavar="MODEL", required=True)
    for name in TRAIN_TARGETS:
        importlib.import_module(f"rtanon.train.commands.train_{name}").register(tsub)
