"""Appendices F, G, H: how DAMCHA's metric evolves, static vs adaptive, and block-wise gradient flow.

Three DAMCHA models are trained on the masked-patch reconstruction task (smoke: scikit-learn digits; paper:
CIFAR-10) with the generation experiments' model and data (experiments/generation.py):
``adaptive`` (shared generator f(x)), ``unshared`` (one generator per layer) and ``static`` (w/o f(x): a learnable
M0 per layer, identity init). At chosen epochs each model's ``get_M_matrices()`` (generated from the last batch's
contexts, batch-averaged; the final prefix for this causal model) is saved and drawn as heatmaps (App. F: the
adaptive metric's evolution; App. H: static next to adaptive). App. G: the H×H grid of ‖∂L/∂M_ij‖_F on the explicit
path, with vs without sharing, on a fixed validation batch. Under RowSum every block of a block-row receives the same
gradient (docs/variants.md §7.4), so each grid row is constant — the figure shows that, it does not assume it.
Pure sharing without a layer bias gives the same M in every layer (docs/experiments.md §5).
"""

from __future__ import annotations

import math
import time

import torch
from tqdm.auto import tqdm

from ..envinfo import environment_record, resolve_device, set_seed
from ..io import atomic_write_json
from ..report import write_tables
from ..results import ensure_out_dir
from .common import base_parser, cli_main, open_store, positive_int, seed_int, setup_threads
from .generation import PRESETS, DataOptions, build_model, load_data
from .metric_figures import block_gradient_norms, gradient_grid_plot, metric_heatmaps

MODELS = {"adaptive": ({}, True), "unshared": ({}, False), "static": ({"use_mlp": False}, True)}
SETTINGS = {"smoke": dict(dataset="digits", steps=200, snapshots=(0, 50, 200), batch=32, lr=2e-3),
            "paper": dict(dataset="cifar10", steps=None, snapshots=(1, 10, 25, 50), batch=64, lr=3e-4)}


def _train_with_snapshots(model, data, s: dict, snap_steps: list[int], device, progress: bool) -> dict[int, list]:
    sampler = data.sampler(s["batch"], seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=0.0)
    snaps = {}
    last = max(snap_steps)
    for step in tqdm(range(last + 1), desc="train", disable=not progress, leave=False):
        batch = tuple(t.to(device) for t in sampler(step))
        if step in snap_steps:
            model.eval()
            with torch.no_grad():
                model(*batch[:-1])  # the last batch's contexts define the visualised metric
            snaps[step] = [(name, M.clone()) for name, M in model.stack.get_M_matrices()]
            model.train()
        if step == last:
            break
        out = model(*batch[:-1])
        loss = data.loss_fn(batch, out) + out.aux_loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return snaps


def run(args) -> dict:
    ensure_out_dir(args.out)  # before the data is loaded
    setup_threads(args.threads)
    device = resolve_device(args.device)
    s = dict(SETTINGS[args.preset])
    if args.steps is not None:  # a short run: snapshots at the start, a quarter and the end
        s.update(steps=args.steps, snapshots=tuple(sorted({0, args.steps // 4, args.steps})))
    p = PRESETS[args.preset]
    data = load_data(s["dataset"], DataOptions(image_task="patch", data_dir=args.data_dir, image_eval=64))
    steps_per_epoch = math.ceil(data.n_train / s["batch"])
    snap_steps = list(s["snapshots"]) if s["steps"] else [e * steps_per_epoch for e in s["snapshots"]]
    env = environment_record(device, preset=args.preset)
    store = open_store(args, "appendix_fgh", device, env, variants=("damcha",), settings=s)
    val_batch = tuple(t.to(device) for t in next(iter(data.batches("val", 16)())))
    paths = {}
    for label, (opts, share) in MODELS.items():
        cell = {"model": label, "preset": args.preset, "seed": args.seed, "snapshots": snap_steps}
        if not store.claim(cell):
            print(f"skip {label} (done)")
            continue
        t0 = time.perf_counter()
        set_seed(args.seed)
        model = build_model(data, "damcha", "paper", p, options=opts, share_mlp=share).to(device)
        snaps = _train_with_snapshots(model, data, s, snap_steps, device, not args.quiet)
        H = p.n_heads
        rows = []
        for step, mats in snaps.items():
            epoch = step / steps_per_epoch
            metric_heatmaps(mats, args.out / f"appF_{label}_step{step}.png",
                            f"DAMCHA {label}: get_M_matrices() at step {step} (epoch {epoch:.2f})", n_heads=H)
            for name, M in mats:
                off = M.reshape(H, -1, H, M.shape[0] // H).clone()
                diag = torch.stack([off[i, :, i] for i in range(H)])
                for i in range(H):
                    off[i, :, i] = 0
                rows += [{"step": step, "layer": name, "metric": "diag_block_fro", "value": float(diag.norm()),
                          "unit": "Frobenius"},
                         {"step": step, "layer": name, "metric": "offdiag_block_fro", "value": float(off.norm()),
                          "unit": "Frobenius"}]
        if label != "static":
            grids = block_gradient_norms(model, lambda m: data.loss_fn(val_batch, m(*val_batch[:-1])))
            gradient_grid_plot(grids, args.out / f"appG_grad_{label}.png",
                               f"‖∂L/∂M_ij‖_F, {'with' if share else 'without'} sharing (explicit path)")
            atomic_write_json(args.out / f"appG_grad_{label}.json", {k: v.tolist() for k, v in grids.items()})
            for name, g in grids.items():
                rows.append({"step": max(snaps), "layer": name, "metric": "grad_row_spread",
                             "value": float((g - g[:, :1]).abs().max() / g.abs().max()), "unit": "relative"})
        store.add(cell, [{**r, "status": "ok", "device": str(device)} for r in rows])
        print(f"{label}: {time.perf_counter() - t0:.1f} s")
    df = store.frame()
    env = store.environment(env, df)
    wide = df[df["metric"] != "grad_row_spread"].pivot_table(index=["model", "layer", "step"], columns="metric",
                                                              values="value").reset_index()
    paths.update(write_tables(args.out, "appendix_fgh", df, wide, env, "Appendices F–H: DAMCHA metrics",
                              notes=__doc__.split("\n\n", 1)[1], floatfmt=".4g"))
    return paths


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = base_parser("appendix_fgh", __doc__.split("\n\n")[0], seeds=False, variants=False)  # DAMCHA only
    p.add_argument("--seed", type=seed_int, default=0, help="random seed of the three models, in 0 … 2**32 − 1")
    p.add_argument("--data-dir", default=None, help="CIFAR-10 location for the paper preset")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="override the training length (optimizer steps)")
    run(p.parse_args(argv))
    return 0
