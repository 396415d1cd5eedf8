"""Corpus anonymization for release (rtanon.corpus.run, `rtanon anonymize-dir`): checks before the first
write, outputs confined to --out, resume after kill -9, per-utterance failures, pseudo-speaker assignment.
These run in this process (--workers 0); tests/test_corpus_ray.py runs the same on Ray."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rtanon.errors import install_hint
from rtanon.corpus.run import CorpusError, CorpusPlan, InProcessExecutor, check_utterance_id, run_corpus
from rtanon.config import AnonymizerConfig
from rtanon.engine import Anonymizer
from rtanon.io.kaldi import KaldiDir, KaldiDirError

REPO = Path(__file__).resolve().parents[1]


def _rtanon(*args, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "rtanon", *args], capture_output=True, text=True, timeout=300,
                          env=env, **kw)


def make_corpus(root: Path, shared_data: Path, n_files: int = 4, copies: int = 1) -> Path:
    """A Kaldi dir in ``root/data`` with ``n_files`` so762_dev files (from 2 speakers) copied into ``root``;
    each file appears ``copies`` times under different utterance ids (a longer corpus from few files)."""
    src = shared_data / "so762_dev"
    utt2spk = dict(line.split() for line in (src / "utt2spk").read_text().splitlines())
    wav = dict(line.split() for line in (src / "wav.scp").read_text().splitlines())
    gender = dict(line.split() for line in (src / "spk2gender").read_text().splitlines())
    spks = sorted(set(utt2spk.values()))[:2]
    utts = [u for s in spks for u in sorted(u for u, v in utt2spk.items() if v == s)[: n_files // 2]]
    d = root / "data"
    (d / "audio").mkdir(parents=True)
    scp, u2s = [], []
    for u in utts:
        shutil.copy(src / wav[u], d / "audio" / f"{u}.flac")
        for c in range(copies):
            uid = u if copies == 1 else f"{u}-{c}"
            scp.append(f"{uid} audio/{u}.flac\n")
            u2s.append(f"{uid} {utt2spk[u]}\n")
    (d / "wav.scp").write_text("".join(scp))
    (d / "utt2spk").write_text("".join(u2s))
    (d / "spk2gender").write_text("".join(f"{s} {gender[s]}\n" for s in spks))
    return d


def tree(d: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``d`` (hidden ones included)."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def anonymizer():
    # McAdams: a redone utterance gives the same bytes again (the neural method batches a worker's
    # utterances, and a rerun that regroups them may move a sample by 1 LSB; its own tests say so)
    return Anonymizer(AnonymizerConfig(method="mcadams"))


def run(anonymizer, data: Path, out: Path, **kw):
    plan = CorpusPlan(KaldiDir.load(data), out, anonymizer.config, progress=False, **kw)
    return run_corpus(plan, lambda: InProcessExecutor(anonymizer.config, kw.get("identity"), anonymizer))


# ---- issue 27 item 2: outputs confined, inputs checked first ----------------------------------------

@pytest.mark.parametrize("utt", ["../../../escaped", "a/b", "..", ".hidden", "x\\y", "a..b"])
def test_an_utterance_id_that_could_leave_the_output_is_refused_before_any_write(tmp_path, shared_data,
                                                                               anonymizer, utt):
    d = make_corpus(tmp_path, shared_data, 2)
    first = (d / "wav.scp").read_text().splitlines()[0].split()[1]
    with open(d / "wav.scp", "a") as f:
        f.write(f"{utt} {first}\n")
    with open(d / "utt2spk", "a") as f:
        f.write(f"{utt} {(d / 'utt2spk').read_text().split()[1]}\n")
    out = tmp_path / "deep" / "er" / "out"
    before = tree(tmp_path)
    with pytest.raises(CorpusError, match="cannot name an output file"):
        run(anonymizer, d, out)
    assert tree(tmp_path) == before and not out.exists()


def test_plain_ids_pass_the_check():
    for utt in ("so000920002", "spk1-utt_2.a", "A-b"):
        check_utterance_id(utt)


def test_a_duplicate_utterance_id_is_refused(tmp_path, shared_data):
    d = make_corpus(tmp_path, shared_data, 2)
    line = (d / "wav.scp").read_text().splitlines()[0]
    with open(d / "wav.scp", "a") as f:
        f.write(line.split()[0] + " audio/other.flac\n")
    with pytest.raises(KaldiDirError, match="duplicate key"):
        KaldiDir.load(d)


def test_out_may_not_be_or_contain_the_input(tmp_path, shared_data, anonymizer):
    d = make_corpus(tmp_path, shared_data, 2)
    before = tree(tmp_path)
    with pytest.raises(CorpusError, match="is the input directory"):
        run(anonymizer, d, d)
    with pytest.raises(CorpusError, match="contains the input directory"):
        run(anonymizer, d, tmp_path)
    # an input file listed by absolute path inside --out
    other = tmp_path / "o"
    (other / "x").mkdir(parents=True)
    shutil.copy(d / "audio" / sorted(os.listdir(d / "audio"))[0], other / "x" / "in.flac")
    (d / "wav.scp").write_text((d / "wav.scp").read_text() + f"zz {other / 'x' / 'in.flac'}\n")
    (d / "utt2spk").write_text((d / "utt2spk").read_text() + f"zz {(d / 'utt2spk').read_text().split()[1]}\n")
    with pytest.raises(CorpusError, match="contains input audio"):
        run(anonymizer, d, other)
    before.update({k: v for k, v in tree(tmp_path).items() if k.startswith("o/") or k.endswith(("wav.scp", "utt2spk"))})
    assert tree(tmp_path) == before


def test_out_inside_the_input_folder_is_refused_and_the_input_left_as_it_was(tmp_path, shared_data, anonymizer):
    d = make_corpus(tmp_path, shared_data, 2)
    before = tree(d)
    with pytest.raises(CorpusError, match="lies inside the input directory"):
        run(anonymizer, d, d / "anon", seed=1)
    assert tree(d) == before and not (d / "anon").exists()


@pytest.mark.parametrize("problem", ["missing", "not audio", "folder"])
def test_every_input_is_checked_before_the_first_output(tmp_path, shared_data, anonymizer, problem):
    d = make_corpus(tmp_path, shared_data, 4)
    bad = d / "audio" / "zz-last.flac"  # sorted last: earlier utterances would be written first
    if problem == "not audio":
        bad.write_bytes(b"this is not a FLAC file" * 100)
    elif problem == "folder":
        bad.mkdir()
    (d / "wav.scp").write_text((d / "wav.scp").read_text() + "zz-last audio/zz-last.flac\n")
    (d / "utt2spk").write_text((d / "utt2spk").read_text() + f"zz-last {(d / 'utt2spk').read_text().split()[1]}\n")
    out = tmp_path / "out"
    with pytest.raises(CorpusError, match="utterance zz-last"):
        run(anonymizer, d, out)
    assert not out.exists()


def test_cli_errors_are_one_line_with_exit_2(tmp_path, shared_data):
    d = make_corpus(tmp_path, shared_data, 2)
    for args in (["--out", str(d)], ["--out", str(tmp_path / "o"), "--workers", "-1"]):
        proc = _rtanon("anonymize-dir", "--data", str(d), "--workers", "0", *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rtanon anonymize-dir: error:"), proc.stderr


# ---- resumable and safe ----------------------------------------------------------------------------

def test_a_run_killed_with_sigkill_resumes_to_exactly_the_files_of_an_uninterrupted_run(tmp_path, shared_data):
    d = make_corpus(tmp_path, shared_data, 4, copies=4)  # 16 utterances
    n = len((d / "wav.scp").read_text().splitlines())
    cmd = ["anonymize-dir", "--data", str(d), "--seed", "7", "--workers", "0", "--batch", "1", "--no-progress"]
    whole = tmp_path / "whole"
    assert _rtanon(*cmd, "--out", str(whole)).returncode == 0

    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "rtanon", *cmd, "--out", str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(killed.glob("*.wav")):
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_at_kill = len(list(killed.glob("*.wav")))
    assert 1 <= done_at_kill < n, f"the kill came at {done_at_kill} of {n} outputs, not mid-corpus"
    assert not (killed / "wav.scp").exists()

    resumed = _rtanon(*cmd, "--out", str(killed))
    assert resumed.returncode == 0, resumed.stderr
    assert tree(killed) == tree(whole)  # same names, same bytes: audio, manifest, run.json, maps; no .part left


def test_a_rerun_verifies_done_work_and_redoes_what_changed(tmp_path, shared_data, anonymizer):
    d = make_corpus(tmp_path, shared_data, 4)
    out = tmp_path / "out"
    first = run(anonymizer, d, out)  # no seed: voices from the OS random source, kept in run.json
    assert first.ok and first.done == 4 and first.skipped == 0
    before = tree(out)
    again = run(anonymizer, d, out)
    assert again.done == 0 and again.skipped == 4 and tree(out) == before

    manifest = json.loads((out / "manifest.json").read_text())["utterances"]
    utts = sorted(manifest)
    # an input that changed since, and an output that was damaged: both redone, the rest kept
    audio = sorted((d / "audio").iterdir())
    shutil.copy(audio[1], audio[0])
    (out / f"{utts[3]}.wav").write_bytes(b"damaged")
    third = run(anonymizer, d, out)
    assert third.skipped == 2 and third.done == 2
    now = json.loads((out / "manifest.json").read_text())["utterances"]
    changed = next(u for u in utts if manifest[u]["input"].endswith(audio[0].name))
    assert now[changed]["input_sha256"] != manifest[changed]["input_sha256"]
    assert now[utts[3]]["output_sha256"] == manifest[utts[3]]["output_sha256"]  # same voice: same bytes again
    assert now[changed]["pseudo_speaker"] == manifest[changed]["pseudo_speaker"]
    rec = now[utts[0]]
    assert set(rec) >= {"utt", "input_sha256", "output", "output_sha256", "pseudo_speaker", "method", "models"}

    with pytest.raises(CorpusError, match="other settings"):
        run(anonymizer, d, out, assignment="utterance")


def test_a_failing_utterance_is_reported_and_the_others_finish(tmp_path, shared_data):
    d = make_corpus(tmp_path, shared_data, 4)
    audio = sorted((d / "audio").iterdir())
    broken = audio[2]
    data = broken.read_bytes()
    broken.write_bytes(data[: len(data) // 3])  # header intact, audio data cut: fails while decoding
    out = tmp_path / "out"
    args = ["anonymize-dir", "--data", str(d), "--out", str(out), "--workers", "0", "--no-progress"]
    proc = _rtanon(*args)
    assert proc.returncode == 1, proc.stderr
    assert f"{broken.stem}: AudioFileError" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.stem for p in out.glob("*.wav")) == sorted(a.stem for a in audio if a != broken)
    assert (out / "failed").read_text().startswith(broken.stem + " ")
    assert broken.stem not in (out / "wav.scp").read_text()

    broken.write_bytes(data)  # repaired: the rerun does that one only
    proc = _rtanon(*args)
    assert proc.returncode == 0, proc.stderr
    assert "1 utterances anonymized" in proc.stdout and "3 already done" in proc.stdout
    assert not (out / "failed").exists() and not list(out.glob(".*.part"))


# ---- assignment (paper 000 Sec. IV) and the spk2pseudo key -------------------------------------------

def _maps(out: Path, name: str) -> dict[str, str]:
    return dict(line.split(maxsplit=1) for line in (out / name).read_text().splitlines())


def test_speaker_and_utterance_assignment_and_unlinkable_runs(tmp_path, shared_data, anonymizer):
    d = make_corpus(tmp_path, shared_data, 4)
    u2s = _maps(d, "utt2spk")
    ids = {}
    for name, kw in (("spk", {"assignment": "speaker"}), ("spk2", {"assignment": "speaker"}),
                     ("utt", {"assignment": "utterance"}), ("s1", {"seed": 1}), ("s2", {"seed": 2}),
                     ("s1b", {"seed": 1})):
        assert run(anonymizer, d, tmp_path / name, **kw).ok
        ids[name] = _maps(tmp_path / name, "utt2pseudo")
    spk = ids["spk"]
    for u, v in u2s.items():  # one pseudo-speaker per speaker, a different one per speaker
        assert spk[u] == next(spk[x] for x in u2s if u2s[x] == v)
    assert len(set(spk.values())) == len(set(u2s.values()))
    assert _maps(tmp_path / "spk", "spk2pseudo") == {u2s[u]: spk[u] for u in u2s}
    assert len(set(ids["utt"].values())) == len(u2s)  # one per utterance
    # fresh OS randomness: two unseeded runs share no pseudo-speaker; different seeds neither; a seed pins them
    assert not set(ids["spk"].values()) & set(ids["spk2"].values())
    assert not set(ids["s1"].values()) & set(ids["s2"].values())
    assert ids["s1"] == ids["s1b"]
    assert tree(tmp_path / "s1") == tree(tmp_path / "s1b")


# ---- the neural method batches a worker's utterances ------------------------------------------------

def test_batched_vocoder_gathers_steps_and_lets_threads_leave():
    import threading

    import numpy as np

    from rtanon.neural.batching import BatchedVocoder

    class Doubling:  # a stand-in backend: audio = 2 * noise, state counts steps; records batch sizes
        name, device, sizes = "fake", "cpu", []

        def init_state(self, batch):
            return [np.zeros((batch, 1), np.float32)]

        def step(self, units, f0, spk, noise, state):
            self.sizes.append(units.shape[0])
            if np.isnan(noise).any():
                raise FloatingPointError("nan in")
            return 2 * noise, [state[0] + 1]

    back = Doubling()
    batched = BatchedVocoder(back, 3)
    out = {}

    def worker(k, steps):
        try:
            state = batched.init_state(1)
            for i in range(steps):
                noise = np.full((1, 4), np.nan if (k, i) == (2, 1) else k, np.float32)
                try:
                    audio, state = batched.step(np.zeros((1, 1, 2)), np.zeros((1, 2)), np.zeros((1, 3)), noise, state)
                    out.setdefault(k, []).append(float(audio[0, 0]))
                except FloatingPointError:
                    out.setdefault(k, []).append("error")
            out[k].append(float(state[0][0, 0]))
        finally:
            batched.leave()

    threads = [threading.Thread(target=worker, args=(k, n)) for k, n in ((0, 5), (1, 2), (2, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "a thread still waits: deadlock"
    assert out[0] == [0.0] * 5 + [5.0] and out[1] == [2.0, 2.0, 2.0]
    assert out[2] == [4.0, "error", 4.0, 2.0]  # the failed step changed nothing of this session's state
    assert back.sizes[0] == 3 and max(back.sizes) == 3 and batched.rows == 9  # the failed step is no row


def test_the_neural_method_batches_a_workers_utterances_with_the_same_audio(tmp_path, shared_data):
    import numpy as np
    import soundfile as sf

    from rtanon.config import AnonymizerConfig
    from rtanon.corpus.run import process_batch

    pytest.importorskip("onnxruntime", reason="the neural method needs onnxruntime")
    d = KaldiDir.load(make_corpus(tmp_path, shared_data, 4))
    neural = Anonymizer(AnonymizerConfig(method="neural"))
    outs = {}
    for name, size in (("one", 1), ("batched", 4)):
        (tmp_path / name).mkdir()
        jobs = [{"utt": u, "src": str(d.wav[u]), "dst": str(tmp_path / name / f"{u}.wav"), "voice": k,
                 "seconds": 1.0} for k, u in enumerate(sorted(d.wav))]
        results = [r for i in range(0, 4, size) for r in process_batch(neural, None, jobs[i:i + size])]
        assert all("error" not in r for r in results), results
        outs[name] = {u: sf.read(tmp_path / name / f"{u}.wav", dtype="int16")[0] for u in d.wav}
    assert results[0]["vocoder_batch"] > 2  # four sessions' steps in one backend call, most of the time
    for u in d.wav:  # the same audio: batched matrix products may round the last bit differently
        diff = np.abs(outs["one"][u].astype(int) - outs["batched"][u].astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (u, diff.max(), (diff > 0).mean())


def _without_ray(*args, timeout=300):
    """`rtanon ARGS` in a Python where ``import ray`` fails as it does without the [corpus] extra."""
    block = ("import sys\n"
             "class NoRay:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] == 'ray':\n"
             "            raise ImportError('ray is blocked in this test')\n"
             "sys.meta_path.insert(0, NoRay())\n"
             "from rtanon.cli import main\n"
             f"sys.exit(main({list(args)!r}))\n")
    return subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})


def test_without_ray_the_run_goes_on_in_this_process_and_says_so_in_one_line(tmp_path, shared_data):
    d = make_corpus(tmp_path, shared_data, 2)
    for workers in ([], ["--workers", "2"]):
        out = tmp_path / f"o{len(workers)}"
        proc = _without_ray("anonymize-dir", "--data", str(d), "--out", str(out), "--method", "mcadams",
                            "--seed", "1", "--no-progress", *workers)
        assert proc.returncode == 0, proc.stderr
        asked = "--workers 2" if workers else "one worker per core"
        assert proc.stderr.strip().splitlines() == [
            f"rtanon anonymize-dir: Ray is not installed, so this runs in this process ({asked} needs "
            f"{install_hint('corpus')}, ray==2.60.0)"]
        assert "2 utterances anonymized in this process" in proc.stdout
        assert sorted(p.name for p in out.glob("*.wav")) == sorted(f"{u}.wav" for u in KaldiDir.load(d).wav)
    assert tree(tmp_path / "o0") == tree(tmp_path / "o2")  # the same seed: the same release
    # a given cluster cannot be reached without Ray: that stays a one-line usage error
    proc = _without_ray("anonymize-dir", "--data", str(d), "--out", str(tmp_path / "o"), "--ray-address",
                        "127.0.0.1:6380")
    assert proc.returncode == 2 and not (tmp_path / "o").exists()
    assert proc.stderr.strip().splitlines() == [
        f"rtanon anonymize-dir: error: Ray is not installed: {install_hint('corpus')} (ray==2.60.0), or run in "
        "this process with --workers 0"]


def test_a_manifest_nested_too_deep_is_refused_in_one_line(tmp_path, shared_data, anonymizer):
    d, out = make_corpus(tmp_path, shared_data, 1), tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CorpusError, match="nested too deep"):
        run(anonymizer, d, out)


def test_the_bench_cpu_meter_keeps_what_a_process_that_left_the_tree_used():
    """``anonymize-dir --bench`` counts the CPU of every process below it (a local Ray's); a process that
    leaves that tree during the run (as Ray's killed actors do, reaped by nobody in it) keeps what it used
    while it was there, so the total is never negative, as it was when only the two ends were summed."""
    from rtanon.corpus.bench import CpuMeter

    if not Path("/proc/self/stat").exists():
        pytest.skip("the meter reads /proc")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"
    # the child starts a grandchild that burns CPU, then exits: the grandchild leaves this process's tree
    child = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time\n"
                              f"subprocess.Popen([sys.executable, '-c', {burn!r}])\ntime.sleep(0.8)\n"])
    time.sleep(0.4)
    meter = CpuMeter(tree=True, every_s=0.05).start()
    child.wait()
    time.sleep(0.3)
    used = meter.stop()
    assert used is not None and 0.05 < used < 5.0, used
