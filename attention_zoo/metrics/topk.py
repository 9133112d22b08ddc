"""The @Top-50 selection rules (docs/experiments.md §3) and the per-sample score files they are recomputed from.

Rules (k = 50 unless told otherwise):
- ``mse_top50``: indices of the k lowest per-image MSEs (images; old and new code). FID@Top-50 is the FID between
  those k originals and their k reconstructions.
- ``nll_top50``: the k examples with the **lowest target NLL** -> the mean of their scores (new text code).
- ``score_top50``: the k **highest scores** -> their mean (old text code; probably the paper's numbers).
- ``feature_top50``: the k lowest per-image feature distances -> the mean of their MSEs ("Top-50 by feature
  distance -> MSE").

Ties are broken by index (stable sort). With fewer than k samples a rule raises, unless ``allow_fewer=True``:
then it uses all samples and the result says so (``fallback=True``, ``k`` = the number actually used).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io import atomic_write_text, read_jsonl

RULES = ("mse_top50", "nll_top50", "score_top50", "feature_top50")


@dataclass(frozen=True)
class TopK:
    rule: str
    k: int  # samples actually selected
    indices: np.ndarray  # selected sample indices, best first
    value: float  # mean of the reported score over the selection (NaN for mse_top50, whose value is a FID)
    n: int  # samples available
    fallback: bool  # True if fewer than the requested k were available and all were used


def _vector(name: str, values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of per-sample values, got shape {v.shape}")
    if not np.isfinite(v).all():
        raise ValueError(f"{name}: {int((~np.isfinite(v)).sum())} non-finite values (NaN/inf) among {len(v)}")
    return v


def _select(rule: str, key: np.ndarray, k: int, allow_fewer: bool, highest: bool) -> tuple[np.ndarray, int, bool]:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive int, got {k!r}")
    if len(key) < k and not allow_fewer:
        raise ValueError(f"{rule}: needs at least k={k} samples, got {len(key)} (pass allow_fewer=True to use all)")
    order = np.argsort(-key if highest else key, kind="stable")
    return order[:k], min(k, len(key)), len(key) < k


def mse_top50(mse, k: int = 50, allow_fewer: bool = False) -> TopK:
    """The k lowest-MSE images (the authors' FID@Top-50 selection); ``value`` is their mean MSE."""
    mse = _vector("mse", mse)
    idx, used, fb = _select("mse_top50", mse, k, allow_fewer, highest=False)
    return TopK("mse_top50", used, idx, float(mse[idx].mean()), len(mse), fb)


def nll_top50(nll, scores, k: int = 50, allow_fewer: bool = False) -> TopK:
    """Mean score of the k lowest-NLL examples (new code)."""
    nll, scores = _vector("nll", nll), _vector("scores", scores)
    if len(nll) != len(scores):
        raise ValueError(f"scores: expected {len(nll)} values (one per NLL), got {len(scores)}")
    idx, used, fb = _select("nll_top50", nll, k, allow_fewer, highest=False)
    return TopK("nll_top50", used, idx, float(scores[idx].mean()), len(nll), fb)


def score_top50(scores, k: int = 50, allow_fewer: bool = False) -> TopK:
    """Mean of the k highest scores (old code)."""
    scores = _vector("scores", scores)
    idx, used, fb = _select("score_top50", scores, k, allow_fewer, highest=True)
    return TopK("score_top50", used, idx, float(scores[idx].mean()), len(scores), fb)


def feature_top50(feature_distance, mse, k: int = 50, allow_fewer: bool = False) -> TopK:
    """Mean MSE of the k images with the lowest feature distance."""
    fd, mse = _vector("feature_distance", feature_distance), _vector("mse", mse)
    if len(fd) != len(mse):
        raise ValueError(f"mse: expected {len(fd)} values (one per feature distance), got {len(mse)}")
    idx, used, fb = _select("feature_top50", fd, k, allow_fewer, highest=False)
    return TopK("feature_top50", used, idx, float(mse[idx].mean()), len(fd), fb)


def write_per_sample(path: str | os.PathLike, columns: Mapping[str, Sequence], **meta) -> Path:
    """One JSONL line per sample: ``meta`` (variant, dataset, seed, …), its ``index`` and one value per column.
    Written atomically; the Top-k rules and KDE plots are recomputed from these files without retraining.

    Raises:
        ValueError: columns of different lengths, or a column named like a meta key or ``index``.
    """
    lengths = {name: len(v) for name, v in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"columns: expected equal lengths, got {lengths}")
    clash = (set(columns) & set(meta)) | ({"index"} & (set(columns) | set(meta)))
    if clash:
        raise ValueError(f"columns: names {sorted(clash)} clash with meta keys or 'index'")
    cols = {name: np.asarray(v).tolist() for name, v in columns.items()}
    n = next(iter(lengths.values()), 0)
    lines = [json.dumps({**meta, "index": i, **{c: v[i] for c, v in cols.items()}}, sort_keys=True, default=str)
             for i in range(n)]
    return atomic_write_text(path, "".join(line + "\n" for line in lines))


def read_per_sample(path: str | os.PathLike):
    """The records of :func:`write_per_sample` as a pandas DataFrame (empty if the file is missing)."""
    import pandas as pd

    return pd.DataFrame(read_jsonl(path))
