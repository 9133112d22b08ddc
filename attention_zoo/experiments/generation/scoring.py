"""Scoring of a trained generation model (Tables 1, 3, 4): image and text metrics, per-sample files, the held-out
validation loss. The metrics are described in ``training``'s docstring and docs/experiments.md §3."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...data import image_tasks as dt
from ...data import seq2seq as s2s
from ...engine.distributed import DistInfo
from ...engine.ensemble import n_members
from ...engine.loop import IGNORE_INDEX, evaluate
from ...engine.members import member_outputs
from ...metrics import images as mi
from ...metrics import text as mt
from ...metrics.topk import feature_top50, mse_top50, nll_top50, score_top50, write_per_sample
from .config import Context, cell_name
from .data import ImageData, TextData

K = 50  # the @Top-50 rules
HELDOUT = {"patch": "mse", "pixel": "nll", "text": "nll"}  # the per-sample held-out metric of each task


def per_sample(task: str, batch: tuple, output) -> torch.Tensor:
    """(B,) the held-out metric of each item of a batch: masked-patch MSE (patch task), mean target-token
    cross-entropy in nats (pixel and text tasks: positions whose target is ``IGNORE_INDEX`` carry none)."""
    logits = (output.logits if hasattr(output, "logits") else output).float()
    if task == "patch":
        _, mask, targets = batch
        return dt.masked_mse_per_sample(logits, targets, mask)
    targets = batch[-1]
    ce = nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=IGNORE_INDEX)
    valid = targets != IGNORE_INDEX
    return (ce * valid).sum(1) / valid.sum(1).clamp_min(1)


@torch.no_grad()
def heldout_scores(model: nn.Module, data, device) -> np.ndarray:
    """(N,) the held-out metric of every scored item (``HELDOUT``; the data's ``heldout`` batches), as the model
    stands."""
    was = model.training
    model.eval()
    out = [per_sample(data.task, b, model(*b[:-1])).double().cpu()
           for b in (tuple(t.to(device) for t in batch) for batch in data.batches("heldout", 64)(None))]
    model.train(was)
    return torch.cat(out).numpy()


@torch.no_grad()
def heldout_member_means(net: nn.Module, data, device) -> list[float]:
    """The mean held-out metric of every member of a grouped model (one grouped forward per batch)."""
    n, sums, count = n_members(net), None, 0
    was = net.training
    net.eval()
    for batch in data.batches("heldout", 64)(None):
        b = tuple(t.to(device) for t in batch)
        outs, _ = member_outputs(net, b[:-1], n)
        vals = torch.stack([per_sample(data.task, b, o).double().sum() for o in outs])
        sums, count = (vals if sums is None else sums + vals), count + b[0].shape[0]
    net.train(was)
    return (sums / count).tolist()


def spread_rows(name: str, values: np.ndarray, unit: str) -> list[dict]:
    """The held-out metric's mean, quartiles, 90th percentile, per-sample standard error and n."""
    se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan
    return [_row(name, values.mean(), unit), _row(f"{name}_q25", np.quantile(values, 0.25), unit),
            _row(f"{name}_q75", np.quantile(values, 0.75), unit), _row(f"{name}_q90", np.quantile(values, 0.9), unit),
            _row(f"{name}_se", se, unit), _row("n_scored", len(values), "samples")]


def _row(metric: str, value, unit: str, status: str = "ok", message: str = "") -> dict:
    return {"metric": metric, "value": float(value), "unit": unit, "status": status, "message": message}


@torch.no_grad()
def score_images(ctx: Context, model: nn.Module, data: ImageData) -> tuple[list[dict], dict]:
    """Rows and per-sample columns of every image metric (see the module docstring)."""
    model.eval()
    recs, mse, nll = [], [], []
    for batch in data.batches("eval", 64)(None):
        b = tuple(t.to(ctx.device) for t in batch)
        logits = model(*b[:-1]).logits.float()
        if data.task == "patch":
            mse.append(dt.masked_mse_per_sample(logits, b[2], b[1]).double().cpu())
            recs.append(data.eval_set.reconstruct(batch, logits.cpu()))
        else:
            nll.append(nn.functional.cross_entropy(logits.transpose(1, 2), b[1], reduction="none").mean(1).cpu())
            recs.append(data.tok.decode(logits.argmax(-1).cpu(), *data.eval_images.shape[2:]))
    recon = mi.as_uint8(torch.cat(recs))
    whole = mi.per_sample_mse(data.eval_images, recon).numpy()
    mse = torch.cat(mse).numpy() if mse else whole
    f_orig = ctx.original_features(data)
    f_rec = mi.extract_features(recon, ctx.extractor, device=str(ctx.device))
    fd = mi.feature_distance(f_orig, f_rec).numpy()
    top, ftop = mse_top50(mse, K, allow_fewer=True), feature_top50(fd, mse, K, allow_fewer=True)
    idx = torch.from_numpy(top.indices)
    unit = "[-1,1]^2 (masked patches)" if data.task == "patch" else "[-1,1]^2"
    # the held-out metric over every scored image; the generative metrics below over the first ``image_eval``
    held = spread_rows("mse", heldout_scores(model, data, ctx.device), unit) if data.task == "patch" else []
    rows = held + [_row("fid", mi.fid_from_features(f_orig, f_rec), "FID"),
            _row("fid_top50", mi.fid_from_features(f_orig[idx], f_rec[idx]), "FID (50-sample)"),
            _row("feature_distance", fd.mean(), "squared L2"), _row("feature_top50_mse", ftop.value, unit),
            _row("mse_top50_mean", top.value, unit), _row("best_mse", mse.min(), unit),
            _row("top50_k", top.k, "samples"), _row("n_eval", len(mse), "samples")]
    cols = {"mse": mse, "mse_image": whole, "feature_distance": fd}
    if nll:  # pixel task: the held-out NLL over every scored image, the whole-image MSE of the generated ones
        cols["nll"] = torch.cat(nll).double().numpy()
        rows += spread_rows("nll", heldout_scores(model, data, ctx.device), "nats/token") + [
            _row("mse", mse.mean(), unit), _row("mse_q25", np.quantile(mse, 0.25), unit),
            _row("mse_q75", np.quantile(mse, 0.75), unit)]
    return rows, cols


def score_text(ctx: Context, model: nn.Module, data: TextData) -> tuple[list[dict], dict]:
    """Rows and per-sample columns of every text metric; unavailable scorers give NaN ``unsupported`` rows."""
    nll = mt.per_example_nll(model, data.eval_set, data.tok, 32, ctx.device)
    gen = s2s.greedy_decode(model, [e.source for e in data.eval_set], data.tok, data.max_new_tokens, 32, ctx.device)
    hyps, refs = [data.tok.decode(g) for g in gen], [t for _, t in data.eval_pairs]
    cols = {"nll": nll, "hypothesis": hyps, "reference": refs}
    # the held-out NLL over every scored pair; the generated texts' metrics over the first ``text_eval``
    rows = spread_rows("nll", heldout_scores(model, data, ctx.device), "nats/token") + [
        _row("nll_low50", np.sort(nll)[:K].mean(), "nats/token"), _row("top50_k", min(K, len(nll)), "samples"),
        _row("n_eval", len(nll), "samples")]
    for name, unit in (("bertscore_f1", "F1 (MiniLM-L6)"), ("bartscore", "log-prob")):
        names = (name, f"{name}_nll_top50", f"{name}_score_top50")
        try:
            s = cols[name] = bertscore_f1(hyps, refs, str(ctx.device)) if name == "bertscore_f1" else \
                bart_scorer(ctx.bart_path, str(ctx.device)).score(hyps, refs)
        except mt.ModelNotAvailableError as exc:
            rows += [_row(m, math.nan, unit, "unsupported", str(exc)) for m in names]
            continue
        values = (s.mean(), nll_top50(nll, s, K, True).value, score_top50(s, K, True).value)
        rows += [_row(m, v, unit) for m, v in zip(names, values)]
    return rows, cols


def bertscore_f1(hyps: list[str], refs: list[str], device: str) -> np.ndarray:
    """Per-example BERTScore F1; empty hypotheses score 0 (bert-score's rule; its own check crashes here)."""
    f1, real = np.zeros(len(hyps)), [i for i, h in enumerate(hyps) if h.strip()]
    if real:
        f1[real] = mt.bertscore([hyps[i] for i in real], [refs[i] for i in real], device=device)["f1"]
    return f1


@functools.lru_cache(maxsize=2)
def bart_scorer(path: str | None, device: str):
    """The BARTScorer (loaded once per process). Raises ModelNotAvailableError with a short message."""
    try:
        return mt.BARTScorer(path, device=device)
    except mt.ModelNotAvailableError:
        raise mt.ModelNotAvailableError(f"{mt.DEFAULT_BART} is not available offline; pass --bart-path DIR or set "
                                        f"${mt.BART_ENV}") from None


def score_cell(ctx: Context, cell: dict, model: nn.Module, data, inference: str = "") -> list[dict]:
    """Score a trained model, write its per-sample file and return the cell's rows (tagged with the file)."""
    rows, cols = (score_images if data.kind == "image" else score_text)(ctx, model, data)
    rel = Path("per_sample") / cell["dataset"] / f"{cell_name(cell, inference)}.jsonl"
    write_per_sample(ctx.out / rel, cols, **{k: cell[k] for k in ("dataset", "variant", "flavor", "setting", "seed")},
                     inference=inference)
    return [{**r, "inference": inference, "per_sample": str(rel)} for r in rows]


VAL_UNIT = {"patch": "[-1,1]^2 (masked patches)", "pixel": "nats/token", "text": "nats/token"}


@torch.no_grad()
def validation_loss(ctx: Context, model: nn.Module, data) -> float:
    """The training loss over the whole held-out validation split (never trained on), as the model stands."""
    model.eval()
    return evaluate(model, data.batches("val", 64)(None), data.loss_fn, DistInfo(device=ctx.device))
