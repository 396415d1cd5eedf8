"""Trained torch models to the ONNX graphs the run time loads, with their state as explicit inputs/outputs
and their configuration in the graph's metadata.

- :func:`export_content_onnx`: the content encoder. Inputs ``audio`` (1, N) float32 at 16 kHz, N a multiple
  of 320 (the number of 20 ms frames is dynamic), then the state tensors in ``ContentEncoder.state_names()``
  order; outputs ``probs`` (1, N/320, K), ``z`` (1, N/320, D), then ``new_<state>``. Metadata key
  ``rtanon_content_config``. From the command line: ``rtanon lab export-content``.
- :func:`export_vocoder_onnx`: the vocoder's streaming step. Inputs ``units, f0_hz, speaker, noise,
  state_c*``, outputs ``audio, new_state_c*``; batch and frame count dynamic. Metadata key
  ``rtanon_vocoder_config``. ``rtanon train vocoder`` calls it at the end of every run.
- :func:`package_vocoder`: a trained generator as the package ships it (float16 weights and the graph
  exported from them). From the command line: ``rtanon lab package-vocoder``.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from pathlib import Path

from rtanon.atomic import atomic_open, atomic_path
from rtanon.constants import FRAME_SAMPLES


def _set_metadata(path: Path, entries: dict[str, str]) -> None:
    """Stores ``entries`` in the graph's metadata (read back with ONNX Runtime's ``custom_metadata_map``)."""
    import onnx

    model = onnx.load(str(path))
    for key, value in entries.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))


def store_exact_float16(path: Path) -> int:
    """Stores every float32 weight of the graph at ``path`` whose values float16 holds exactly as float16,
    cast back to float32 when the session loads (ONNX Runtime folds the casts): the same outputs from
    about half the bytes. For weights that were float16 to begin with (Whisper's, as CTranslate2 ships
    them). Returns the bytes saved."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    graph, kept, casts, saved = model.graph, [], [], 0
    for init in graph.initializer:
        w = numpy_helper.to_array(init)
        if w.dtype == np.float32 and w.size > 1 and np.array_equal(w.astype(np.float16).astype(np.float32), w):
            half = numpy_helper.from_array(w.astype(np.float16), f"{init.name}.float16")
            kept.append(half)
            casts.append(helper.make_node("Cast", [half.name], [init.name], to=TensorProto.FLOAT,
                                          name=f"{init.name}.cast"))
            saved += w.nbytes // 2
        else:
            kept.append(init)
    nodes = casts + list(graph.node)
    del graph.initializer[:], graph.node[:]
    graph.initializer.extend(kept)
    graph.node.extend(nodes)
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))
    return saved


def export_content_onnx(model, path: str | Path, opset: int = 17) -> Path:
    """Writes ``model`` (a ``ContentEncoder``) to ``path`` as ONNX; returns ``path``."""
    import torch

    from rtanon.content.stream import CONFIG_METADATA_KEY

    model = model.eval()
    names = model.state_names()
    state = model.init_state(1)
    audio = torch.zeros(1, FRAME_SAMPLES * 2)
    dynamic = {"audio": {1: "n_samples"}, "probs": {1: "n_frames"}, "z": {1: "n_frames"}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), atomic_path(path) as tmp:
        torch.onnx.export(model, (audio, *state), str(tmp), input_names=["audio", *names],
                          output_names=["probs", "z", *[f"new_{n}" for n in names]],
                          dynamic_axes=dynamic, opset_version=opset, dynamo=False)
    _set_metadata(path, {CONFIG_METADATA_KEY: json.dumps(model.cfg.to_dict())})
    return path


def export_vocoder_onnx(model, path: str | Path, frames: int = 1, opset: int = 17) -> Path:
    """Writes the streaming step of ``model`` (a ``HarmonicNoiseVocoder``) to ONNX. The model is copied and
    its weight norm folded; the caller's model is left as it is. Uses the TorchScript-based exporter
    (``dynamo=False``: the dynamo exporter needs ``onnxscript``, which rtanon does not depend on)."""
    import torch
    from torch import nn

    from rtanon.neural.vocoder import state_names

    path = Path(path)
    m = model.folded().cpu()
    cfg = m.config
    b = 1
    args = (torch.zeros(b, frames, cfg.units_dim), torch.full((b, 2 * frames), 120.0),
            torch.zeros(b, cfg.speaker_dim), torch.zeros(b, FRAME_SAMPLES * frames), *m.init_state(b))
    names = state_names(m)
    inputs = ["units", "f0_hz", "speaker", "noise", *names]
    outputs = ["audio", *[f"new_{n}" for n in names]]
    dyn = {"units": {0: "batch", 1: "frames"}, "f0_hz": {0: "batch", 1: "f0_frames"}, "speaker": {0: "batch"},
           "noise": {0: "batch", 1: "samples"}, "audio": {0: "batch", 1: "samples"}}
    dyn.update({n: {0: "batch"} for n in inputs[4:] + outputs[1:]})

    class _Step(nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *a: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.inner.forward_stream(*a)

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad(), atomic_path(path) as tmp:
        warnings.simplefilter("ignore")
        torch.onnx.export(_Step(m), args, str(tmp), input_names=inputs, output_names=outputs,
                          dynamic_axes=dyn, opset_version=opset, dynamo=False, do_constant_folding=True)
    _set_metadata(path, {"rtanon_vocoder_config": json.dumps(asdict(cfg))})
    return path


def package_vocoder(checkpoint: str | Path, out_dir: str | Path,
                    content: str | Path | None = None) -> tuple[Path, Path]:
    """A trained ``generator.pt`` as the package ships it, in ``out_dir``: ``generator.pt`` with its weights
    stored in float16 (half the bytes: the repository's weights budget) and ``vocoder.onnx`` exported from
    exactly those weights, so the torch and ONNX backends run the same model. ``content``: a content graph
    to record as the one the vocoder reads instead of the one it was trained on (a re-export of that graph
    that computes the same ``z``, as its bytes may differ); its width must be the vocoder's. Returns both
    paths."""
    import torch

    from rtanon.neural.vocoder import load_generator

    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    if content is not None:
        from rtanon.config import ConfigError
        from rtanon.content.stream import ContentEncoderModel

        encoder = ContentEncoderModel(content)
        if encoder.output_dim != ckpt["config"]["units_dim"]:
            raise ConfigError(f"{content} gives {encoder.output_dim}-dim content; the vocoder reads "
                              f"{ckpt['config']['units_dim']}")
        ckpt = {**ckpt, "config": {**ckpt["config"], "content_sha256": encoder.sha256}}
    half = {k: v.half() if v.is_floating_point() else v for k, v in ckpt["generator"].items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pt = out_dir / "generator.pt"
    with atomic_open(pt) as f:
        torch.save({**ckpt, "generator": half}, f)
    return pt, export_vocoder_onnx(load_generator(pt), out_dir / "vocoder.onnx")


def main_package_vocoder(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``rtanon lab package-vocoder CKPT DIR``."""
    import argparse

    ap = argparse.ArgumentParser(prog=prog, description="Write a trained vocoder as the package ships it: "
                                 "DIR/generator.pt (float16 weights) and DIR/vocoder.onnx exported from those "
                                 "weights. The balanced point's files were made so: rtanon lab package-vocoder "
                                 "runs/vBal/checkpoints/generator_stepN.pt src/rtanon/models/neural/balanced")
    ap.add_argument("checkpoint", type=Path, help="a generator.pt of `rtanon train vocoder` (or one of its "
                                                  "checkpoints/)")
    ap.add_argument("out_dir", type=Path, help="folder to write generator.pt and vocoder.onnx to")
    ap.add_argument("--content", type=Path, default=None, metavar="GRAPH",
                    help="record this content graph as the one the vocoder reads, instead of the one it was "
                         "trained on: for a re-export of that graph that computes the same z (check that first: "
                         "the run time refuses any other pairing)")
    args = ap.parse_args(argv)
    for path in package_vocoder(args.checkpoint, args.out_dir, args.content):
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``rtanon lab export-content CKPT OUT.onnx [--weights OUT.pt]``."""
    import argparse

    ap = argparse.ArgumentParser(prog=prog, description="Export a content encoder checkpoint of `rtanon train "
                                                        "content` to the ONNX graph the run time loads.")
    ap.add_argument("checkpoint", type=Path, help="ckpt.pt written by `rtanon train content`")
    ap.add_argument("output", type=Path, help="ONNX file to write")
    ap.add_argument("--weights", type=Path, default=None,
                    help="also write a small weights-only torch checkpoint (model + config, no optimizer), what "
                         "`rtanon train vocoder --content-weights` reads")
    args = ap.parse_args(argv)
    import torch

    from rtanon.train.content import load_checkpoint

    model = load_checkpoint(args.checkpoint)
    export_content_onnx(model, args.output)
    print(f"wrote {args.output}")
    if args.weights:
        ck = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
        with atomic_open(args.weights) as f:
            torch.save({"model": model.state_dict(), "model_config": model.cfg.to_dict(), "step": ck.get("step"),
                        "train_s": ck.get("train_s")}, f)
        print(f"wrote {args.weights}")
    return 0
