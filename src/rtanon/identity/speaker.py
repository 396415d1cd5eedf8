"""Session identities: ``PseudoSpeaker`` and ``new_identity``.

A ``PseudoSpeaker`` is what a session's voice is made from: the embedding the
vocoder is conditioned on, the F0 quantiles the pitch mapping targets, the
gender of the pool it came from, the strategy that made it and when. It never
holds the user's own embedding. ``PseudoSpeaker.save/load`` read and write a
small JSON file (``rtanon identity new --out``; ``--identity FILE`` pins one).

``IdentityModel`` is the shared part (pool, selector with its PLDA and
clusters, per-gender GMMs), built once; ``model.new_identity(...)`` (or the
module-level ``new_identity``) is called once per session and draws from the
OS random source unless an ``rng`` is given.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from rtanon import atomic
from rtanon.identity.generate import Generator, GmmConfig
from rtanon.identity.pool import SpeakerPool, unit_norm
from rtanon.identity.select import DISTANCES, GENDER_CHOICES, PROXIMITIES, SelectionConfig, Selector

IDENTITY_FORMAT_VERSION = 1
STRATEGIES = PROXIMITIES + ("gmm",)
#: Strategies that cannot run without the user's embedding.
NEEDS_USER = ("near", "far")


class IdentityError(ValueError):
    """An identity file is unreadable, or a strategy lacks what it needs."""


@dataclass(frozen=True)
class PseudoSpeaker:
    """One pseudo-voice. ``embedding``: (D,) float32 unit norm; ``f0_quantiles_hz``:
    (Q,) float32 Hz at ``quantile_levels`` (fractions 0..1); ``strategy``: how it was made."""

    embedding: np.ndarray
    f0_quantiles_hz: np.ndarray
    gender: str
    strategy: dict
    created_utc: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    encoder: str = ""
    quantile_levels: tuple = tuple(np.linspace(0.0, 1.0, 101).round(4))

    @property
    def median_f0_hz(self) -> float:
        return float(np.interp(0.5, self.quantile_levels, self.f0_quantiles_hz))

    def to_json(self) -> dict:
        d = asdict(self)
        d["embedding"] = [round(float(v), 7) for v in self.embedding]
        d["f0_quantiles_hz"] = [round(float(v), 3) for v in self.f0_quantiles_hz]
        d["quantile_levels"] = list(self.quantile_levels)
        d["format_version"] = IDENTITY_FORMAT_VERSION
        return d

    def save(self, path: str | Path) -> None:
        path = Path(path)
        body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in self.to_json().items())
        atomic.write_text(path, "{\n" + body + "\n}\n")

    @classmethod
    def load(cls, path: str | Path) -> "PseudoSpeaker":
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise IdentityError(f"{path}: no such identity file; make one with "
                                f"`rtanon identity new --strategy gmm --out {path}`") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IdentityError(f"{path}: not an rtanon identity file ({exc})") from None
        if not isinstance(d, dict) or "embedding" not in d or "f0_quantiles_hz" not in d:
            raise IdentityError(f"{path}: an identity file needs 'embedding' and 'f0_quantiles_hz'")
        if d.get("format_version", IDENTITY_FORMAT_VERSION) != IDENTITY_FORMAT_VERSION:
            raise IdentityError(f"{path}: identity format {d.get('format_version')}, this rtanon reads "
                                f"{IDENTITY_FORMAT_VERSION}")
        emb = np.asarray(d["embedding"], dtype=np.float32)
        f0 = np.asarray(d["f0_quantiles_hz"], dtype=np.float32)
        levels = tuple(d.get("quantile_levels") or np.linspace(0.0, 1.0, f0.shape[0]).round(4))
        if emb.ndim != 1 or not np.isfinite(emb).all() or np.linalg.norm(emb) == 0:
            raise IdentityError(f"{path}: 'embedding' must be a non-zero list of finite numbers")
        if f0.shape != (len(levels),) or not (f0 > 0).all() or np.any(np.diff(f0) < 0):
            raise IdentityError(f"{path}: 'f0_quantiles_hz' must be {len(levels)} increasing positive values")
        return cls(unit_norm(emb), f0, str(d.get("gender", "")), dict(d.get("strategy", {})),
                   str(d.get("created_utc", "")), str(d.get("encoder", "")), levels)


class IdentityModel:
    """Shared identity machinery over one pool: paper 000 selection and paper 003 generation.
    Built once (cheap: PCA/GMM fits and clustering take well under a second each)."""

    def __init__(self, pool: SpeakerPool | None = None, selection: SelectionConfig | None = None,
                 gmm: GmmConfig | None = None) -> None:
        self.pool = pool if pool is not None else SpeakerPool.load_default()
        self.selector = Selector(self.pool, selection)
        self._gmm_config = gmm or GmmConfig()
        self._gmm_config.validate()

    @cached_property
    def generator(self) -> Generator:
        return Generator(self.pool, self._gmm_config)

    def infer_gender(self, embedding: np.ndarray, k: int = 9) -> str:
        """The majority gender of the ``k`` pool speakers nearest (cosine) to ``embedding``."""
        sims = self.pool.embeddings @ unit_norm(embedding).reshape(-1)
        nearest = np.argsort(-sims)[:k]
        return "f" if (self.pool.genders[nearest] == "f").sum() * 2 > k else "m"

    def new_identity(self, strategy: str = "gmm", *, distance: str = "cosine", gender: str = "random",
                     user_embedding: np.ndarray | None = None, user_gender: str | None = None,
                     theta_fd: float | None = None, rng: np.random.Generator | None = None) -> PseudoSpeaker:
        """A fresh pseudo-speaker.

        ``strategy``: paper 000 proximity (random/near/far/dense/sparse, with
        ``distance`` cosine/plda) or ``gmm`` (paper 003). ``gender``: same /
        opposite as the user (needs ``user_gender`` or ``user_embedding``, from
        which it is inferred) or random. ``user_embedding`` ((D,) float, in
        memory only) is needed by near/far, excludes the user's cluster in
        dense/sparse and enables forced dissimilarity for gmm (``theta_fd``,
        default from GmmConfig). ``rng=None`` draws from the OS random source.
        """
        if strategy not in STRATEGIES:
            raise IdentityError(f"strategy={strategy!r}; choose one of {STRATEGIES}")
        if distance not in DISTANCES:
            raise IdentityError(f"distance={distance!r}; choose one of {DISTANCES}")
        if gender not in GENDER_CHOICES:
            raise IdentityError(f"gender={gender!r}; choose one of {GENDER_CHOICES}")
        if strategy in NEEDS_USER and user_embedding is None:
            raise IdentityError(f"strategy {strategy!r} needs the user's voice: give an enrollment recording "
                                "(--enroll WAV) or use random, dense, sparse or gmm")
        rng = rng if rng is not None else np.random.default_rng()
        if gender == "random":
            target_gender = str(rng.choice(["f", "m"]))
        else:
            if user_gender is None:
                if user_embedding is None:
                    raise IdentityError(f"gender {gender!r} needs the user's gender or voice: give --enroll WAV "
                                        "or --user-gender m|f, or use --gender random")
                user_gender = self.infer_gender(user_embedding)
            target_gender = user_gender if gender == "same" else {"m": "f", "f": "m"}[user_gender]
        desc = {"name": strategy, "gender_choice": gender}
        if strategy == "gmm":
            cfg = self._gmm_config
            fd = cfg.theta_fd if theta_fd is None else theta_fd
            # the redraw count is not kept: it would hint at how close the user is to the pool
            emb, f0, _ = self.generator.models[target_gender].sample(
                1, rng, user_embedding, fd if user_embedding is not None else None)
            emb, f0 = emb[0], f0[0]
            desc.update(pca_variance=cfg.pca_variance, n_components=cfg.n_components,
                        pitch_weight=cfg.pitch_weight, theta_fd=fd if user_embedding is not None else None)
        else:
            sel = self.selector.select(strategy, target_gender, rng, distance=distance,
                                       user_embedding=user_embedding)
            emb, f0 = sel.embedding, sel.f0_quantiles_hz
            desc.update(sel.details)
        return PseudoSpeaker(np.asarray(emb, np.float32), np.asarray(f0, np.float32), target_gender, desc,
                             encoder=str(self.pool.meta.get("encoder", "")),
                             quantile_levels=tuple(np.round(self.pool.quantile_levels, 4)))


def new_identity(strategy: str = "gmm", *, model: IdentityModel | None = None, rng=None, **kwargs) -> PseudoSpeaker:
    """Convenience wrapper: ``IdentityModel`` (built from the shipped pool when
    ``model`` is None; build it once and pass it for repeated calls) then
    :meth:`IdentityModel.new_identity`."""
    return (model or IdentityModel()).new_identity(strategy, rng=rng, **kwargs)


def assign_identities(model: IdentityModel, user_utterance_embeddings: np.ndarray, assignment: str = "speaker",
                      **kwargs) -> list[PseudoSpeaker]:
    """Paper 000 Sec. III-D. ``user_utterance_embeddings``: (U, D) one per user utterance.
    ``speaker``: one identity from their re-normalised mean, for all utterances;
    ``utterance``: one identity per utterance from that utterance's embedding."""
    x = np.atleast_2d(user_utterance_embeddings)
    if assignment == "speaker":
        return [model.new_identity(user_embedding=unit_norm(x.mean(axis=0)), **kwargs)]
    if assignment == "utterance":
        return [model.new_identity(user_embedding=row, **kwargs) for row in x]
    raise IdentityError(f"assignment={assignment!r}; use 'speaker' or 'utterance'")
