"""Export a trained content encoder to ONNX with its state as explicit inputs/outputs.

    python -m rtanon.content.export CKPT OUT.onnx [--weights OUT.pt]

Graph inputs: ``audio`` (1, N) float32 16 kHz with N a multiple of 320 (the
number of 20 ms frames is dynamic), then the state tensors in
``ContentEncoder.state_names()`` order (``wav_state`` (1, 240), ``mel_state``
(1, 80, 2), ``res<i>_state`` (1, C, 2), ``gru_state`` (1, 1, H)). Outputs:
``probs`` (1, N/320, K) soft units, ``z`` (1, N/320, D) their projection, then
``new_<state>`` for every state input, same shapes. The model's
configuration is stored in the ONNX metadata (``rtanon_content_config``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def export_onnx(model, path: Path, opset: int = 17) -> Path:
    """Writes ``model`` (a ``ContentEncoder``) to ``path`` as ONNX; returns ``path``."""
    import onnx
    import torch

    from rtanon.content.stream import CONFIG_METADATA_KEY

    model = model.eval()
    names = model.state_names()
    state = model.init_state(1)
    audio = torch.zeros(1, 320 * 2)
    dynamic = {"audio": {1: "n_samples"}, "probs": {1: "n_frames"}, "z": {1: "n_frames"}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(model, (audio, *state), str(path), input_names=["audio", *names],
                          output_names=["probs", "z", *[f"new_{n}" for n in names]],
                          dynamic_axes=dynamic, opset_version=opset, dynamo=False)
    m = onnx.load(str(path))
    meta = m.metadata_props.add()
    meta.key, meta.value = CONFIG_METADATA_KEY, json.dumps(model.cfg.to_dict())
    onnx.save(m, str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    import torch

    from rtanon.content.train import load_checkpoint

    ap = argparse.ArgumentParser(prog="python -m rtanon.content.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="ckpt.pt written by `rtanon train content`")
    ap.add_argument("output", type=Path, help="ONNX file to write")
    ap.add_argument("--weights", type=Path, default=None,
                    help="also write a small weights-only torch checkpoint (model + config, no optimizer)")
    args = ap.parse_args(argv)
    model = load_checkpoint(args.checkpoint)
    export_onnx(model, args.output)
    print(f"wrote {args.output}")
    if args.weights:
        ck = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
        torch.save({"model": model.state_dict(), "model_config": model.cfg.to_dict(), "step": ck.get("step"),
                    "train_s": ck.get("train_s")}, args.weights)
        print(f"wrote {args.weights}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
