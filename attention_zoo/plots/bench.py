"""The benchmark's figures (``attention_zoo.bench.plot``): a bar chart for one shape, lines over T for several."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..io import atomic_savefig
from . import _plt, themed, variant_colour


@themed
def plot(df: pd.DataFrame, path: str | Path, mode: str = "fwd_bwd") -> Path:
    """Latency and peak memory of ``mode``'s rows: bars for one shape (``_bars``), else against the sequence length,
    one line per variant/flavour (log-log)."""

    plt, sns = _plt()
    ok = df[(df["status"] == "ok") & (df["mode"] == mode) & ~df["compiled"]].copy()
    ok["case"] = ok["variant"] + "/" + ok["flavor"]
    shape = [c for c in ("batch", "seq_len", "d_model", "n_heads") if c in ok]
    if len(shape) == 4 and len(ok[shape].drop_duplicates()) == 1:
        return _bars(ok, path, mode, plt)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (col, label) in zip(axes, (("latency_median_ms", f"{mode} latency, ms (median)"),
                                       ("peak_mib", f"{mode} peak memory, MiB"))):
        data = ok[pd.to_numeric(ok[col], errors="coerce") > 0]
        if not data.empty:
            sns.lineplot(data=data, x="seq_len", y=col, hue="case", marker="o", errorbar=None, ax=ax)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_ylabel(label)
    fig.tight_layout()
    out = atomic_savefig(fig, path, dpi=120)
    return out


def _bars(ok: pd.DataFrame, path: str | Path, mode: str, plt) -> Path:
    """One shape: a bar per case (median of the interleaved rounds, q25–q75 whiskers; a hatched, faded bar's timing
    was flagged unstable), each variant in its fixed colour (``plots.variant_colour``), latency and peak memory."""
    if ok["dtype"].nunique() > 1:
        ok = ok.assign(case=ok["case"] + " " + ok["dtype"])
    ok = ok.sort_values(["variant", "flavor", "dtype"])
    r = ok.iloc[0]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(ok) + 2.5))
    memory = f"{mode} peak memory, MiB ({r.get('memory_kind') or 'not measured'})"
    for ax, col, label in ((axes[0], "latency_median_ms", f"{mode} latency, ms (median, q25–q75)"),
                           (axes[1], "peak_mib", memory)):
        vals = pd.to_numeric(ok[col], errors="coerce")
        shaky = ok["unstable"].fillna(False).astype(bool) if col == "latency_median_ms" else pd.Series(False,
                                                                                                     index=ok.index)
        err = None
        if col == "latency_median_ms":
            err = [vals - pd.to_numeric(ok["latency_q25_ms"], errors="coerce"),
                   pd.to_numeric(ok["latency_q75_ms"], errors="coerce") - vals]
        bars = ax.barh(ok["case"], vals, xerr=err, color=[variant_colour(v) for v in ok["variant"]], capsize=3)
        for bar, bad in zip(bars, shaky):
            if bad:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
        ax.invert_yaxis()
        ax.set_xlabel(label)
    dtypes = ", ".join(sorted(ok["dtype"].unique()))
    fig.suptitle(f"B={r['batch']} T={r['seq_len']} D={r['d_model']} H={r['n_heads']}, {dtypes}, "
                 f"{r['device_name']} ({r['device']}); hatched: unstable timing", fontsize=9)
    fig.tight_layout()
    return atomic_savefig(fig, path, dpi=120)
