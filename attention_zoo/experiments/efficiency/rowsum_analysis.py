"""DAMCHA under RowSum: evidence that the D×D "cross-head" metric carries no more function than H·dh·dh outputs.

Head i only sees m_i = Σ_j M_ij, so in ``mlp`` mode the loss depends on the generator's D² output rows only through
their block-row sums (docs/variants.md §7.4). Four measured sections:

- ``gradient_identity``: spread of the final-layer gradient across the H block columns of each block-row
  (0 up to rounding in mlp mode, fused or explicit; not 0 where the identity stops: separate_B, linear_comb).
- ``equivalence``: a full and a collapsed generator (``collapsed_generator=True``) trained side by side in float64
  with AdamW: exact with eps·H for the collapsed layer and no clipping; approximate with global-norm clipping or
  the same eps.
- ``diag_vs_full``: during training, diagonal-only inference (block scales (1, 0), Table 3) compared with the full
  metric scaled by 1/H: the blocks of a block-row differ only by their initial values, so the relative distance
  shrinks as the learned part grows.
- ``costs``: parameters, fwd+bwd latency and peak memory of the full vs the collapsed generator (DAMCHA layer,
  non-causal and causal) next to MHA.
"""

from __future__ import annotations

import math
import time

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ...data.text import WindowSampler, load_char_corpus
from ...envinfo import environment_record, resolve_device
from ...measure import build_workload, count_params, guarded, measure_memory, measure_model_latency, workload_spec
from ...models import Decoder
from ...plots import line_plot
from ...registry import create_attention
from ...report import markdown_table, write_tables
from ...results import ResultStore, ensure_out_dir
from ...variants.damcha import metric_generator, set_block_scales
from ...variants.damcha_collapse import adam_param_groups
from ..common import ListAction, base_parser, experiment_main, open_store, setup_threads
from ..launchers import run_whole
from ..protocol import add_launcher_arguments

PRESETS = {
    # d_model/heads/layers of the trained char-LM, steps of each training section, cost-section shapes
    "smoke": dict(d_model=64, n_heads=8, n_layers=2, hidden=(64, 128), context=64, batch=16, diag_steps=300,
                  probes=6, eq=dict(d_model=32, n_layers=1, hidden=(32,), context=32, batch=8, steps=12),
                  cost=dict(batch=4, seq_len=512, d_model=256, n_heads=8), repeats=3),
    "paper": dict(d_model=128, n_heads=8, n_layers=4, hidden=(256, 512), context=128, batch=32, diag_steps=3000,
                  probes=10, eq=dict(d_model=64, n_layers=2, hidden=(64, 128), context=64, batch=16, steps=200),
                  cost=dict(batch=4, seq_len=512, d_model=256, n_heads=8), repeats=10),
}


def _char_model(p: dict, dtype=torch.float32, seed: int = 0, **opts) -> Decoder:
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in the target dtype so a collapsed init is folded without rounding
    try:
        torch.manual_seed(seed)
        return Decoder(p["vocab"], p["d_model"], p["n_layers"], p["n_heads"], attention="damcha",
                       attention_options={"hidden_dims": p["hidden"], "gen_dropout": 0.0, **opts},
                       max_seq_len=p["context"])
    finally:
        torch.set_default_dtype(default)


def _loss(model: Decoder, batch) -> torch.Tensor:
    x, y = batch
    out = model(x)
    return F.cross_entropy(out.logits.flatten(0, 1).float(), y.flatten()) + out.aux_loss


def gradient_identity(p: dict, sampler) -> list[dict]:
    rows = []
    configs = {"mlp (fused)": {}, "mlp (explicit)": {"fused_rowsum": False},
               "linear_comb": {"off_diag_mode": "linear_comb"}, "separate_B": {"off_diag_mode": "separate_B"}}
    for label, opts in configs.items():
        model = _char_model(p, **opts)
        _loss(model, sampler(0)).backward()
        g = metric_generator(model).final_layer_grad_blocks()  # (i, a, j, c, w)
        spread = (g - g[:, :, :1]).abs().amax() / g.abs().amax()
        rows.append({"section": "gradient_identity", "config": label, "metric": "block_column_spread",
                     "value": float(spread), "unit": "max|g_j - g_0| / max|g|"})
    return rows


def _train_pair(p: dict, sampler, steps: int, clip: float | None, scale_eps: bool, eps: float = 1e-8):
    """Full and collapsed float64 models trained on the same batches; per-step |Δloss| and final Δm."""
    models = [_char_model(p, torch.float64, collapsed_generator=c) for c in (False, True)]
    opts = [torch.optim.AdamW(adam_param_groups(m, eps=eps) if scale_eps else [{"params": list(m.parameters()),
                              "eps": eps}], lr=3e-3, weight_decay=0.01) for m in models]
    gaps, losses = [], []
    for step in range(steps):
        batch = sampler(step)
        pair = []
        for m, opt in zip(models, opts):
            loss = _loss(m, batch)
            opt.zero_grad()
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
            opt.step()
            pair.append(loss.item())
        gaps.append(abs(pair[0] - pair[1]))
        losses.append(pair)
    # One-token inputs: each probe row is its own context, so the metrics are f_θ(probe) summed by block row.
    probe = torch.randn(8, 1, p["d_model"], dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    ms = [metric_generator(m).head_metrics(probe, causal=False) for m in models]
    rel_m = float((ms[0] - ms[1]).detach().norm() / ms[0].detach().norm())
    return gaps, losses, rel_m


def equivalence(p: dict, corpus) -> list[dict]:
    """Float64 is slow on CPU, so this section trains a smaller char-LM (preset ``eq``)."""
    p = {**p, **p["eq"]}
    sampler = WindowSampler(corpus.train, p["context"], p["batch"], seed=2)
    rows = []
    settings = {"exact: AdamW, eps·H, no clipping": dict(clip=None, scale_eps=True),
                "global-norm clipping 0.05": dict(clip=0.05, scale_eps=True),
                "same eps (1e-4) for both": dict(clip=None, scale_eps=False, eps=1e-4)}
    for label, kw in settings.items():
        gaps, losses, rel_m = _train_pair(p, sampler, p["steps"], **kw)
        rows += [{"section": "equivalence", "config": label, "metric": "max_abs_loss_gap", "value": max(gaps),
                  "unit": "nats"},
                 {"section": "equivalence", "config": label, "metric": "final_metric_rel_diff", "value": rel_m,
                  "unit": "‖m_full − m_collapsed‖/‖m_full‖"},
                 {"section": "equivalence", "config": label, "metric": "first_last_loss_full",
                  "value": losses[-1][0] - losses[0][0], "unit": "nats (training moved the model)"}]
    return rows


@torch.no_grad()
def _inference_losses(model: Decoder, batches, H: int) -> dict[str, float]:
    out = {}
    for label, scales in {"full": (1.0, 1.0), "diagonal-only": (1.0, 0.0), "full/H": (1 / H, 1 / H),
                          "off-diagonal-only": (0.0, 1.0)}.items():
        set_block_scales(model, *scales)
        out[label] = sum(_loss(model, b).item() for b in batches) / len(batches)
    set_block_scales(model, 1.0, 1.0)
    return out


def diag_vs_full(p: dict, sampler, val_batches, progress: bool) -> list[dict]:
    H = p["n_heads"]
    model = _char_model(p)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    gen = metric_generator(model)
    probe = torch.randn(32, 1, p["d_model"], generator=torch.Generator().manual_seed(3)) * 0.5
    checkpoints = sorted({round(p["diag_steps"] * k / (p["probes"] - 1)) for k in range(p["probes"])})
    rows = []
    for step in tqdm(range(p["diag_steps"] + 1), desc="diag vs full/H", disable=not progress, leave=False):
        if step in checkpoints:
            model.eval()
            with torch.no_grad():
                m_full = gen.head_metrics(probe, causal=False)
                set_block_scales(model, 1.0, 0.0)
                m_diag = gen.head_metrics(probe, causal=False)
                set_block_scales(model, 1.0, 1.0)
            rel = float((m_diag - m_full / H).norm() / (m_full / H).norm())
            rel_full = float((m_diag - m_full).norm() / m_full.norm())
            rows += [{"section": "diag_vs_full", "step": step, "metric": "rel_dist_diag_vs_full_over_H", "value": rel,
                      "unit": "‖m_diag − m_full/H‖/‖m_full/H‖"},
                     {"section": "diag_vs_full", "step": step, "metric": "rel_dist_diag_vs_full",
                      "value": rel_full, "unit": "‖m_diag − m_full‖/‖m_full‖"}]
            for label, v in _inference_losses(model, val_batches, H).items():
                rows.append({"section": "diag_vs_full", "step": step, "metric": f"val_loss[{label}]", "value": v,
                             "unit": "nats/char"})
            model.train()
        if step < p["diag_steps"]:
            loss = _loss(model, sampler(step))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    return rows


def costs(p: dict, device: torch.device) -> list[dict]:
    rows = []
    shape = p["cost"]
    cases = [("mha", {}), ("damcha (full generator)", {}), ("damcha (collapsed generator)",
                                                             {"collapsed_generator": True})]
    for causal in (False, True):
        for label, opts in cases:
            spec = workload_spec(attention=label.split()[0], options=opts, causal=causal, **shape)
            wl = build_workload(spec, device)
            params = count_params(wl.model)["total_params"]
            lat = guarded(lambda wl=wl: {"lat": measure_model_latency(wl, "fwd_bwd", device, warmup=1,
                                                                       repeats=p["repeats"])}, device)
            del wl
            mem = measure_memory(spec, device, mode="train")
            base = {"section": "costs", "config": label, "causal": causal, **shape}
            rows += [{**base, "metric": "params", "value": params, "unit": "count"},
                     {**base, "metric": "fwd_bwd_latency_median", "unit": "ms", "status": lat["status"],
                      "message": lat["message"], "value": lat["lat"].median_ms if "lat" in lat else math.nan,
                      "threads": torch.get_num_threads()},
                     {**base, "metric": "analytic_fwd_flops", "value": create_attention(
                         label.split()[0], d_model=shape["d_model"], n_heads=shape["n_heads"], causal=causal,
                         **opts).analytic_flops(shape["batch"], shape["seq_len"]) / 1e9, "unit": "GFLOP"}]
            key = "peak_alloc_mib" if device.type == "cuda" else "peak_rss_mib"
            rows.append({**base, "metric": f"train_step_{key}", "value": mem.get(key, math.nan), "unit": "MiB",
                         "status": mem["status"], "message": mem["message"]})
    return rows


SECTIONS = ("gradient_identity", "equivalence", "diag_vs_full", "costs")


def check(args) -> list[str]:
    """The sections of ``--sections``, checked before any work (also by a dry run).

    Raises:
        ValueError: an unknown section, or none.
    """
    chosen = [s.strip() for s in args.sections.split(",")]
    for name in chosen:
        if name not in SECTIONS:
            raise ValueError(f"sections: unknown {name!r}; available: {', '.join(SECTIONS)}")
    return chosen


def run(args) -> dict:
    check(args)
    ensure_out_dir(args.out)  # before the corpus is loaded
    setup_threads(args.threads)
    device = resolve_device(args.device)
    p = dict(PRESETS[args.preset])
    corpus = load_char_corpus("shakespeare")
    p["vocab"] = corpus.vocab_size
    sampler = WindowSampler(corpus.train, p["context"], p["batch"], seed=0)
    val = [WindowSampler([corpus.val["shakespeare"]], p["context"], p["batch"], seed=1)(i) for i in range(4)]
    store = open_store(args, "rowsum_analysis", device, environment_record(device, preset=args.preset),
                       selection=("sections",), variants=("damcha", "mha"), settings=p)
    sections = {"gradient_identity": lambda: gradient_identity(p, sampler),
                "equivalence": lambda: equivalence(p, corpus),
                "diag_vs_full": lambda: diag_vs_full(p, sampler, val, not args.quiet),
                "costs": lambda: costs(p, device)}
    chosen = [s.strip() for s in args.sections.split(",")]
    for name in chosen:
        if name not in sections:
            raise ValueError(f"sections: unknown {name!r}; available: {', '.join(sections)}")
        cell = {"section": name, "preset": args.preset, "device": str(device)}
        if not store.claim(cell):
            print(f"skip {name} (done)")
            continue
        t0 = time.perf_counter()
        rows = [{**r, "preset": args.preset, "device": str(device), "status": r.get("status", "ok")}
                for r in sections[name]()]
        store.add(cell, rows)
        print(f"{name}: {time.perf_counter() - t0:.1f} s")
    return write_report(store, args, device)


def write_report(store: ResultStore, args, device) -> dict:
    df = store.frame()
    env = store.environment(environment_record(device, preset=args.preset), df)
    diag = df[df["section"] == "diag_vs_full"]
    final = diag[diag["step"] == diag["step"].max()] if not diag.empty else diag  # the curves' last point
    summary = pd.concat([df[df["section"] != "diag_vs_full"], final]).copy()
    cols = [c for c in ("section", "config", "causal", "step", "metric", "value", "unit") if c in summary]
    wide = summary[cols]
    paths = write_tables(args.out, "rowsum_analysis", df, wide, env, "DAMCHA under RowSum: evidence",
                         notes=__doc__.split("\n\n", 1)[1], floatfmt=".4g")
    if not diag.empty:
        where = f"{args.preset} preset, {device.type}, one seed: no interval"
        dist = diag[diag["metric"].str.startswith("rel_dist")]
        paths["diag_png"] = line_plot(dist, "step", "value", "metric", args.out / "diag_vs_full_over_H.png",
                                      f"Diagonal-only metric vs full (and full/H) during training ({where})",
                                      "relative distance (dimensionless)", errorbar=None, xlabel="training step",
                                      nested=True)
        losses = diag[diag["metric"].str.startswith("val_loss")]
        paths["loss_png"] = line_plot(losses, "step", "value", "metric", args.out / "block_inference_losses.png",
                                      f"Validation loss under block-scale inference ({where})",
                                      "validation loss (nats/char)", errorbar=None, xlabel="training step",
                                      nested=True)
        last = losses[losses["step"] == losses["step"].max()][["metric", "value"]]
        print(markdown_table(last))
    print(markdown_table(wide, floatfmt=".4g"))
    return paths


def build_parser():
    p = base_parser("rowsum_analysis", __doc__.split("\n\n")[0], seeds=False, variants=False)  # DAMCHA only
    p.add_argument("--sections", action=ListAction, join=True,
                   default="gradient_identity,equivalence,diag_vs_full,costs", help="sections to run")
    return add_launcher_arguments(p)


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run_whole(build_parser().parse_args(argv), "rowsum_analysis", lambda a: (run(a), 0)[1], check)
