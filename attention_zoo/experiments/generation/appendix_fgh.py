"""Appendices F, G, H: how DAMCHA's metric evolves, static vs adaptive, and block-wise gradient flow.

Three DAMCHA models are trained on the masked-patch reconstruction task (smoke: scikit-learn digits; paper:
CIFAR-10) with the generation experiments' model and data (experiments/generation/):
``adaptive`` (shared generator f(x)), ``unshared`` (one generator per layer) and ``static`` (w/o f(x): a learnable
M0 shared by the stack, identity init), each over ``--seeds`` (the figures show the first seed). At chosen epochs
each model's ``get_M_matrices()`` (generated from the last batch's contexts, batch-averaged; the final prefix for
this causal model) is saved and drawn as heatmaps (App. F: the
adaptive metric's evolution; App. H: static next to adaptive). App. G: the H×H grid of ‖∂L/∂M_ij‖_F on the explicit
path, with vs without sharing, on a fixed validation batch. Under RowSum every block of a block-row receives the same
gradient (docs/variants.md §7.4), so each grid row is constant — the figure shows that, it does not assume it.
Pure sharing without a layer bias gives the same M in every layer (docs/experiments.md §5): such panels are drawn
once. Per snapshot and layer the rows record the block Frobenius norms normalised per block (diagonal: over H blocks,
off-diagonal: over H² − H, so equal blocks give a ratio of 1 — unnormalised totals would give √(H − 1)), their ratio
and the coefficient of variation of the H×H block norms (``block_norm_cv``: 0 for a uniform metric, the "structure"
of App. F), the relative change since the previous snapshot (``metric_drift``: the "stability" of App. H); for the
gradients, the coefficient of variation over the whole H×H grid (``grad_grid_cv``: under
RowSum each row is constant, so it compares heads — "uniform" in App. G is a low value) and the largest in-row
spread (``grad_row_spread``, ≈ 0 under RowSum). The claims F.structure, G.sharing_grads and H.adaptive are decided
from these rows, seed-paired.
"""

from __future__ import annotations

import functools
import math
import time

import torch
from tqdm.auto import tqdm

from ... import report
from ...claims import frame_verdicts, verdict_lines, verdict_markdown
from ...envinfo import environment_record, resolve_device, set_seed
from ...io import atomic_write_json
from ...report import write_tables
from ...results import ensure_out_dir
from ..common import base_parser, experiment_main, open_store, positive_int, setup_threads
from ..protocol import Plan, add_launcher_arguments, execute
from .config import PRESETS
from .data import DataOptions, load_data
from .metric_figures import block_gradient_norms, gradient_grid_plot, metric_heatmaps
from .training import build_model

NAME = "appendix_fgh"
MODELS = {"adaptive": ({}, True), "unshared": ({}, False), "static": ({"use_mlp": False}, True)}
SETTINGS = {"smoke": dict(dataset="digits", steps=200, snapshots=(0, 50, 200), batch=32, lr=2e-3),
            "paper": dict(dataset="cifar10", steps=None, snapshots=(1, 10, 25, 50), batch=64, lr=3e-4)}


def _layer_index(name: str) -> int:
    """The stack position in a metric's name ("layers.3.attn.M" -> 3)."""
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1]) if "layers" in parts else 0


def block_rows(M: torch.Tensor, H: int) -> list[dict]:
    """Rows of one D×D metric: per-block normalised diagonal / off-diagonal norms, their ratio, block-norm CV."""
    blocks = M.reshape(H, M.shape[0] // H, H, M.shape[1] // H).permute(0, 2, 1, 3)  # (H, H, dh, dh)
    norms = blocks.flatten(2).norm(dim=-1)  # (H, H): ‖M_ij‖_F
    eye = torch.eye(H, dtype=torch.bool)
    diag = float(norms[eye].square().mean().sqrt())  # RMS over the H diagonal blocks
    off = float(norms[~eye].square().mean().sqrt())  # RMS over the H² − H off-diagonal blocks
    return [{"metric": "diag_block_fro", "value": diag, "unit": "Frobenius per block (RMS)"},
            {"metric": "offdiag_block_fro", "value": off, "unit": "Frobenius per block (RMS)"},
            {"metric": "offdiag_to_diag", "value": off / diag if diag else math.nan, "unit": "ratio (1: equal blocks)"},
            {"metric": "block_norm_cv", "value": float(norms.std() / norms.mean()), "unit": "std / mean"}]


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


def settings_of(args) -> tuple[dict, list[int], int]:
    """(training settings, snapshot steps, steps per epoch) of the run."""
    s = dict(SETTINGS[args.preset])
    if args.steps is not None:  # a short run: snapshots at the start, a quarter and the end
        s.update(steps=args.steps, snapshots=tuple(sorted({0, args.steps // 4, args.steps})))
    data = _data(s["dataset"], args.data_dir)
    steps_per_epoch = math.ceil(data.n_train / s["batch"])
    snap_steps = list(s["snapshots"]) if s["steps"] else [e * steps_per_epoch for e in s["snapshots"]]
    return s, snap_steps, steps_per_epoch


def _data(name: str, data_dir):
    return load_data(name, DataOptions(image_task="patch", data_dir=data_dir, image_eval=64))


def cell_rows(unit: list[dict], args) -> list[list[dict]]:
    """A work unit (protocol.Plan.work): train each (model, seed) cell with its snapshots and gradient grids; the
    first seed also draws the figures."""
    device = resolve_device(args.device)
    s, snap_steps, steps_per_epoch = settings_of(args)
    p, data = PRESETS[args.preset], _data(s["dataset"], args.data_dir)
    val_batch = tuple(t.to(device) for t in next(iter(data.batches("val", 16)())))
    out = []
    for cell in unit:
        label, seed = cell["model"], cell["seed"]
        opts, share = MODELS[label]
        t0 = time.perf_counter()
        figures = seed == args.seeds[0]
        set_seed(seed)
        model = build_model(data, "damcha", "paper", p, options=opts, share_mlp=share).to(device)
        snaps = _train_with_snapshots(model, data, s, snap_steps, device, not args.quiet)
        H = p.n_heads
        rows, last_M = [], {}
        for step, mats in sorted(snaps.items()):
            epoch = step / steps_per_epoch
            if figures:
                metric_heatmaps(mats, args.out / f"appF_{label}_step{step}.png",
                                f"App. {'H' if label == 'static' else 'F'} ({args.preset}: {s['dataset']}, seed "
                                f"{seed}): DAMCHA {label}, get_M_matrices() after {step} steps (epoch {epoch:.2f})",
                                n_heads=H)
            for name, M in mats:
                prev = last_M.get(name)
                drift = float((M - prev).norm() / prev.norm()) if prev is not None and prev.norm() > 0 else math.nan
                last_M[name] = M
                rows += [{"step": step, "layer": name, "layer_index": _layer_index(name), **r}
                         for r in [*block_rows(M, H), {"metric": "metric_drift", "value": drift,
                                                      "unit": "‖M − M_previous snapshot‖ / ‖M_previous‖"}]]
        if label != "static":
            grids = block_gradient_norms(model, lambda m: data.loss_fn(val_batch, m(*val_batch[:-1])))
            if figures:
                gradient_grid_plot(grids, args.out / f"appG_grad_{label}.png",
                                   f"App. G ({args.preset}: {s['dataset']}, seed {seed}): ‖∂L/∂M_ij‖_F "
                                   f"{'with' if share else 'without'} sharing after {max(snaps)} steps, one "
                                   "validation batch (explicit path)")
                atomic_write_json(args.out / f"appG_grad_{label}.json", {k: v.tolist() for k, v in grids.items()})
            for name, g in grids.items():
                rows += [{"step": max(snaps), "layer": name, "metric": "grad_row_spread",
                          "value": float((g - g[:, :1]).abs().max() / g.abs().max()), "unit": "relative"},
                         {"step": max(snaps), "layer": name, "metric": "grad_grid_cv",
                          "value": float(g.std() / g.mean()), "unit": "std / mean"}]
        out.append([{**r, "status": "ok", "device": str(device)} for r in rows])
        print(f"{label} seed {seed}: {time.perf_counter() - t0:.1f} s")
    return out


def plan(args) -> Plan:
    ensure_out_dir(args.out)  # before the data is loaded
    setup_threads(args.threads)
    device = resolve_device(args.device)
    s, snap_steps, _ = settings_of(args)
    env = environment_record(device, preset=args.preset)
    store = open_store(args, NAME, device, env, variants=("damcha",), settings=s)
    cells = [{"model": label, "preset": args.preset, "seed": seed, "snapshots": snap_steps}
             for seed in args.seeds for label in MODELS]
    for c in store.records(cells):
        print(f"skip {c['cell']['model']} seed {c['cell']['seed']} (done)")

    def finish() -> int:
        df = store.frame()
        full_env = store.environment(env, df)
        grad = df["metric"].isin(["grad_row_spread", "grad_grid_cv"])
        wide = report.ci_table(df[~grad], ["model", "layer", "step"], ["metric"], floatfmt=".4g")
        verdicts = frame_verdicts(NAME, args.preset, df, store.path, store.context_id)
        notes = [f"Preset `{args.preset}` ({s['dataset']}); n = {df['seed'].nunique()} seeds per model; tables: mean "
                 "[95 % interval] (n) over seeds.", __doc__.split("\n\n", 1)[1],
                 "## Verdicts on the paper's claims (Appendices F–H)", "", verdict_markdown(verdicts),
                 "## Gradient grids (last snapshot)", "",
                 report.markdown_table(report.ci_table(df[grad], ["model", "layer", "step"], ["metric"],
                                                       floatfmt=".4g")),
                 "## Metric blocks per snapshot"]
        write_tables(args.out, NAME, df, wide, full_env, "Appendices F–H: DAMCHA metrics", notes="\n\n".join(notes),
                     floatfmt=".4g")
        print("\n".join(verdict_lines(verdicts)))
        return 0

    return Plan(store, [[c] for c in cells], functools.partial(cell_rows, args=args), finish,
                describe=lambda u: f"{u[0]['model']} seed {u[0]['seed']}")


def run(args) -> int:
    return execute(plan(args), args, NAME)


def build_parser():
    p = base_parser(NAME, __doc__.split("\n\n")[0], default_seeds=[0, 1, 2, 3, 4], variants=False)
    p.add_argument("--data-dir", default=None, help="CIFAR-10 location for the paper preset")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="override the training length (optimizer steps)")
    return add_launcher_arguments(p)


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
