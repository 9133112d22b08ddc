"""What a ladder cell stores beyond Table 5's rows: its training compute (FLOPs and CPU-seconds), why it stopped,
and one set of summary columns on every row of the cell, so the long CSV reads as a table of cells too.

**The FLOP rule**, the same for every arm: ``train_flops`` = 3 × the model's analytic forward FLOPs of one training
batch (``measure.flops.analytic_flops`` at batch × context: every attention module's own closed form with its
extra work — THA's and DCMHA's head mixing, ColMHA's mixing, MoA's router and its k experts per token, DAMCHA's
metric generator once per stack — every other linear layer, and the output layer, the tied unembedding, included;
norms, softmax and element-wise work excluded) × the steps up to the best validation checkpoint (``best_step``).
Up to the best checkpoint because that checkpoint is what is scored: the steps after it (the patience that detects
a plateau) bought nothing the test loss shows. The backward pass is counted as twice the forward. ``train_flops_run``
counts the same up to the stop, and evaluation is in neither. ``best_cpu_s`` reads CPU-seconds the same way:
``train_cpu_s`` (the whole run's training CPU-seconds, ``experiments.charlm``) × best_step / steps_run.
"""

from __future__ import annotations

from ...measure.flops import analytic_flops

SUMMARY = ("params", "train_flops", "train_flops_run", "train_cpu_s", "best_cpu_s", "tokens", "steps_run",
           "best_step", "stop_reason", "val_loss", "test_loss", "trivial_loss")


def stop_reason(res, max_steps: int) -> str:
    """"diverged" (a non-finite loss), "token_budget" (it ran its rung's whole budget) or "patience" (it stopped on
    a validation plateau before it)."""
    if res.status == "nan":
        return "diverged"
    return "token_budget" if res.step >= max_steps else "patience"


def extra_rows(cell: dict, model, res, cpu_s: float) -> list[dict]:
    """The cell's compute rows (``charlm.run_cell``'s ``extra_rows``)."""
    context = getattr(model, "max_seq_len", 64)
    batch = res.tokens_seen // max(1, res.step) // context if res.step else 0
    fwd = analytic_flops(model, max(1, batch), context)
    best = res.best_step if res.best_step is not None else res.step
    share = best / res.step if res.step else 0.0
    return [{"metric": "fwd_flops_per_step", "value": fwd, "unit": "FLOPs"},
            {"metric": "train_flops", "value": 3.0 * fwd * best, "unit": "FLOPs"},
            {"metric": "train_flops_run", "value": 3.0 * fwd * res.step, "unit": "FLOPs"},
            {"metric": "train_cpu_s", "value": cpu_s, "unit": "s"},
            {"metric": "best_cpu_s", "value": cpu_s * share, "unit": "s"},
            {"metric": "tokens_to_best", "value": res.tokens_seen * share, "unit": "tokens"},
            {"metric": "stop", "value": float(res.step < cell["max_steps"]), "unit": "stopped early (1) or not (0)",
             "stop_reason": stop_reason(res, cell["max_steps"])}]


def summarise(cell: dict, rows: list[dict]) -> list[dict]:
    """Every row of a cell with the cell's summary columns (``SUMMARY``: None where the cell has no such row)."""
    own = cell.get("dataset")

    def value(metric: str):
        for r in rows:
            if r.get("metric") == metric and r.get("eval_set", own) in (own, None):
                return r.get("value")
        return None

    summary = {k: value(k) for k in SUMMARY if k not in ("tokens", "stop_reason")}
    summary["tokens"] = value("tokens_seen")
    summary["stop_reason"] = next((r["stop_reason"] for r in rows if "stop_reason" in r), None)
    return [{**r, **summary} for r in rows]


__all__ = ["SUMMARY", "extra_rows", "stop_reason", "summarise"]
