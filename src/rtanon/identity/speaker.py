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
from rtanon.errors import UserError
from rtanon.paths import InputPathError, printable, read_capped
from rtanon.identity.generate import Generator, GmmConfig
from rtanon.identity.pool import SpeakerPool, unit_norm
from rtanon.identity.select import DISTANCES, GENDER_CHOICES, PROXIMITIES, SelectionConfig, Selector

IDENTITY_FORMAT_VERSION = 1
STRATEGIES = PROXIMITIES + ("gmm",)
#: Strategies that cannot run without the user's embedding.
NEEDS_USER = ("near", "far")


#: A pseudo-speaker's F0 quantiles must lie in this range (Hz), its median in the next: the pool's
#: voices span 35 to 630 Hz from their lowest to their highest quantile (300 gmm and random draws).
F0_QUANTILE_RANGE_HZ = (20.0, 1000.0)
F0_MEDIAN_RANGE_HZ = (50.0, 500.0)
#: An identity file is about 6 kB; anything larger than this is not one.
MAX_IDENTITY_BYTES = 1 << 20


class IdentityError(ValueError, UserError):
    """An identity file is unreadable or does not fit the model, or a strategy lacks what it needs."""


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
        atomic.write_text(path, "{\n" + body + "\n}\n", private=True)  # 0600, as a token: a voice to keep

    @classmethod
    def load(cls, path: str | Path) -> "PseudoSpeaker":
        path = Path(path)
        try:
            d = json.loads(read_capped(path, MAX_IDENTITY_BYTES, "identity file").decode("utf-8"))
        except FileNotFoundError:
            raise IdentityError(f"{printable(path)}: no such identity file; make one with "
                                f"`rtanon identity new --strategy gmm --out {printable(path)}`") from None
        except InputPathError as exc:
            raise IdentityError(str(exc)) from None
        except (OSError, ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, too deep, too many digits
            raise IdentityError(f"{printable(path)}: not an rtanon identity file "
                                f"({printable(exc, 120)})") from None
        return cls.from_json(d, printable(path))

    @classmethod
    def from_json(cls, d, where: str = "identity") -> "PseudoSpeaker":
        """An identity from its parsed JSON (what ``load`` reads), checked; ``where`` names it in errors."""
        if not isinstance(d, dict) or "embedding" not in d or "f0_quantiles_hz" not in d:
            raise IdentityError(f"{where}: an identity file needs 'embedding' and 'f0_quantiles_hz'")
        for key, kind in (("strategy", dict), ("gender", str), ("created_utc", str), ("encoder", str)):
            if not isinstance(d.get(key, kind()), kind):
                raise IdentityError(f"{where}: {key!r} must be a JSON "
                                    f"{'object' if kind is dict else 'string'}; make a new identity with "
                                    "`rtanon identity new`")
        version = d.get("format_version", IDENTITY_FORMAT_VERSION)
        if not isinstance(version, int) or isinstance(version, bool):
            raise IdentityError(f"{where}: 'format_version' must be the JSON number "
                                f"{IDENTITY_FORMAT_VERSION}, not a {type(version).__name__} "
                                f"({printable(json.dumps(version), 20)}); make a new identity with `rtanon identity new`")
        if version != IDENTITY_FORMAT_VERSION:
            raise IdentityError(f"{where}: identity format {printable(d.get('format_version'), 20)}, "
                                f"this rtanon reads {IDENTITY_FORMAT_VERSION}")
        emb = _numbers(d["embedding"], "embedding", where)
        f0 = _numbers(d["f0_quantiles_hz"], "f0_quantiles_hz", where)
        levels = (_numbers(d["quantile_levels"], "quantile_levels", where) if d.get("quantile_levels") is not None
                  else np.linspace(0.0, 1.0, f0.shape[0]).round(4))
        with np.errstate(all="ignore"):
            emb = unit_norm(emb)
        if not np.isfinite(emb).all() or not np.any(emb):  # zeros, or squares beyond float32 (values over 1e19)
            raise IdentityError(f"{where}: 'embedding' is all zeros or too large for float32; make a "
                                "new identity with `rtanon identity new`")
        if levels.shape[0] < 2 or levels[0] < 0.0 or levels[-1] > 1.0 or np.any(np.diff(levels) <= 0):
            raise IdentityError(f"{where}: 'quantile_levels' must be increasing fractions from 0 to 1")
        if f0.shape != levels.shape:
            raise IdentityError(f"{where}: 'f0_quantiles_hz' has {f0.shape[0]} values for "
                                f"{levels.shape[0]} quantile levels")
        lo, hi = F0_QUANTILE_RANGE_HZ
        median = float(np.interp(0.5, levels, f0))
        if (f0.min() < lo or f0.max() > hi or np.any(np.diff(f0) < 0)
                or not F0_MEDIAN_RANGE_HZ[0] <= median <= F0_MEDIAN_RANGE_HZ[1]):
            raise IdentityError(f"{where}: 'f0_quantiles_hz' must be non-decreasing voice pitches "
                                f"from {lo:.0f} to {hi:.0f} Hz with a median from {F0_MEDIAN_RANGE_HZ[0]:.0f} to "
                                f"{F0_MEDIAN_RANGE_HZ[1]:.0f} Hz (got {f0.min():.4g} to {f0.max():.4g} Hz, "
                                f"median {median:.4g})")
        return cls(emb, f0, d.get("gender", ""), d.get("strategy", {}), d.get("created_utc", ""),
                   d.get("encoder", ""), tuple(float(v) for v in levels))


def _numbers(value, name: str, where: str) -> np.ndarray:
    """``value`` as a 1-D float32 array of numbers finite in float32 (what the model computes in), or an
    IdentityError naming the field."""
    ok = isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                   for v in value)
    try:
        arr = np.asarray([float(v) for v in value], dtype=np.float64) if ok else None
    except OverflowError:  # an integer of hundreds of digits
        arr = None
    with np.errstate(over="ignore"):
        arr = None if arr is None else arr.astype(np.float32)
    if arr is None or not np.isfinite(arr).all():
        raise IdentityError(f"{where}: {name!r} must be a list of finite numbers; make a new identity "
                            "with `rtanon identity new`")
    return arr


def check_fits(identity: "PseudoSpeaker", speaker_dim: int) -> None:
    """Raises IdentityError unless ``identity`` can drive a vocoder conditioned on ``speaker_dim`` values."""
    if identity.embedding.shape != (speaker_dim,):
        raise IdentityError(f"the identity's embedding has {identity.embedding.shape[0]} values, this vocoder "
                            f"takes {speaker_dim}: make the identity with this rtanon (`rtanon identity new`)")


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
