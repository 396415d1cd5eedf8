"""How an evaluation runs its work: ``Pool`` (a spawn process pool over ``jobs`` processes, or this
process), Kaldi subsets and speaker shards, and ``anonymize_sets`` (every set to anonymize, in shards, through
``rtanon.eval._worker``)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from rtanon.io.kaldi import KaldiDir, KaldiDirError, write_map


class Pool:
    """A process pool (``jobs`` > 1, spawn context) or in-process execution."""

    def __init__(self, jobs: int) -> None:
        self._ex = None
        if jobs > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            self._ex = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))

    def run(self, fn, arglist: list[tuple], *, desc: str, weights: list[int] | None = None,
            unit: str = "utt", progress: bool = True) -> list:
        t0 = time.perf_counter()
        results = self._run(fn, arglist, desc=desc, weights=weights or [1] * len(arglist), unit=unit,
                            progress=progress)
        if not progress:  # quiet: one line per stage, so a log shows where a long run is
            print(f"{desc}: {len(arglist)} tasks done in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)
        return results

    def _run(self, fn, arglist: list[tuple], *, desc: str, weights: list[int], unit: str, progress: bool) -> list:
        from tqdm import tqdm

        results: list = [None] * len(arglist)
        with tqdm(total=sum(weights), desc=desc, unit=unit, disable=not progress, dynamic_ncols=True) as bar:
            if self._ex is None:
                for i, args in enumerate(arglist):
                    results[i] = fn(*args)
                    bar.update(weights[i])
                return results
            from concurrent.futures import as_completed

            futures = {self._ex.submit(fn, *args): i for i, args in enumerate(arglist)}
            try:
                for fut in as_completed(futures):
                    i = futures[fut]
                    results[i] = fut.result()
                    bar.update(weights[i])
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise
        return results

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=True)


def subset(kaldi: KaldiDir, utts: list[str]) -> KaldiDir:
    utts = sorted(utts)
    spks = {kaldi.utt2spk[u] for u in utts}
    return KaldiDir(root=kaldi.root, wav={u: kaldi.wav[u] for u in utts},
                    utt2spk={u: kaldi.utt2spk[u] for u in utts},
                    spk2gender={s: g for s, g in kaldi.spk2gender.items() if s in spks},
                    spk2age={s: a for s, a in kaldi.spk2age.items() if s in spks},
                    text={u: kaldi.text[u] for u in utts if u in kaldi.text})


def shards(kaldi: KaldiDir, min_utts: int) -> list[KaldiDir]:
    """Whole speakers grouped into shards of at least ``min_utts`` utterances."""
    shards, cur = [], []
    for spk in kaldi.speakers:
        cur.extend(kaldi.utterances_of(spk))
        if len(cur) >= min_utts:
            shards.append(subset(kaldi, cur))
            cur = []
    if cur:
        shards.append(subset(kaldi, cur))
    return shards


def complete(out: Path, src: KaldiDir) -> bool:
    try:
        done = KaldiDir.load(out)
    except KaldiDirError:
        return False
    return set(done.wav) == set(src.wav) and all(p.is_file() for p in done.wav.values())


def add_cpu(total: dict, part: dict) -> None:
    for k, v in part.items():
        total[k] = total.get(k, 0.0) + v


def anonymize_sets(pool: Pool, jobs: list[tuple], keep_anonymized: bool, progress: bool, cpu_s: dict) -> dict:
    """``jobs``: (key, anonymizer config, source KaldiDir, out dir, assignment, seed).
    Returns key -> anonymized KaldiDir, written as ``out/part*/<utt>.wav`` (with ``keep_anonymized``, a
    set already complete is kept); adds the workers' CPU seconds to ``cpu_s``."""
    from rtanon.eval import _worker

    tasks, weights, todo = [], [], []
    for key, acfg, src, out, assignment, seed in jobs:
        if keep_anonymized and complete(out, src):
            continue
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        todo.append((key, src, out))
        for i, shard in enumerate(shards(src, 8)):
            tasks.append((acfg, shard, str(out / f"part{i:03d}"), assignment, seed))
            weights.append(len(shard.wav))
    if tasks:
        for _, cpu in pool.run(_worker.anonymize_shard, tasks, desc="anonymizing", weights=weights,
                               progress=progress):
            add_cpu(cpu_s, cpu)
    for key, src, out in todo:
        wav = {}
        for part in sorted(out.glob("part*")):
            wav.update({u: f"{part.name}/{u}.wav" for u in KaldiDir.load(part).wav})
        write_map(out / "wav.scp", wav)
        write_map(out / "utt2spk", src.utt2spk)
        write_map(out / "spk2gender", src.spk2gender)
        if src.text:
            write_map(out / "text", src.text)
    return {key: KaldiDir.load(out) for key, _, _, out, _, _ in jobs}
