"""`rtanon f0-bench` on one file per corpus: the report has every figure the issue asks for."""

from __future__ import annotations

import pytest

pytest.importorskip("amfm_decompy")


def test_benchmark_reports_accuracy_speed_parity_and_stream_cost(shared_data):
    from rtanon.f0.bench import format_report, run_benchmark
    from rtanon.f0.config import F0Config

    rep = run_benchmark(shared_data, 1, progress=lambda s: None, other_references=False)
    assert {c for c, _ in rep.accuracy} == {"so762_dev", "libri_clips"}
    assert rep.audio_s > 1.0 and rep.cpu_seconds["pyaapt"] > 0 and rep.parity_frames > 100
    assert rep.parity_voicing_same == rep.parity_frames  # the two kernels agree on these files
    assert "harvest, Praat: not asked for" in " ".join(rep.skipped)
    text = format_report(rep, F0Config(), 20)
    for needle in ("GPE", "VDE", "speed-up", "p99", "parity"):
        assert needle in text
