"""What the generation tables (Tables 1, 3, 4) share to compute their cells: their command-line arguments, the run
context, the cell loop over the result store and run timing. The training and scoring of one cell is in
``training.train_and_score``; the pieces of their reports are in ``tables_report``."""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from ...claims import verdict_lines
from ...engine import parse_overrides, prune_checkpoints, result_identity
from ...envinfo import environment_record, resolve_device
from ...metrics import images as mi
from ...metrics import text as mt
from ...results import ResultStore
from ..common import ListAction, open_store, positive_int
from ..ensemble_units import add_ensemble_argument, ensemble_columns, ensemble_on, ensemble_units
from ..protocol import Plan, add_launcher_arguments, execute
from .config import PRESETS, Context
from .data import IMAGE_SETS, TEXT_SETS, DataOptions
from .tables_report import comparison_text

TINY_EXTRACTOR = "tiny-random"


# ---- --------------------------------------------------------------------
@functools.cache  # once per process: torch-fidelity refuses a second class under the same name
def _register_tiny_extractor() -> None:
    """``--fid-extractor tiny-random``: a fixed random 2-layer conv net (16-d), for tests only — not a metric."""
    from torch_fidelity import FeatureExtractorBase

    class TinyRandom(FeatureExtractorBase):
        def __init__(self, name, features_list, **kwargs):
            super().__init__(name, features_list)
            g = torch.Generator().manual_seed(0)  # the same weights in every process
            self.net = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU(),
                                     nn.AdaptiveAvgPool2d(1), nn.Flatten())
            for prm in self.net.parameters():
                prm.data = torch.randn(prm.shape, generator=g) * 0.3

        get_provided_features_list = staticmethod(lambda: ("feat",))
        get_default_feature_layer_for_metric = staticmethod(lambda metric: "feat")
        can_be_compiled = staticmethod(lambda: False)
        get_dummy_input_for_compile = staticmethod(lambda: torch.zeros(1, 3, 16, 16, dtype=torch.uint8))

        def forward(self, x):
            return (self.net(x.float() / 127.5 - 1),)

    mi.register_extractor(TINY_EXTRACTOR, TinyRandom)


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--datasets", action=ListAction, join=True, default=None,
                   help=f"subset of {', '.join(IMAGE_SETS + TEXT_SETS)} (default: the preset's)")
    p.add_argument("--image-task", choices=("patch", "pixel"), default="patch",
                   help="patch: the authors' masked 4×4-patch reconstruction; pixel: autoregressive RGB332 tokens")
    p.add_argument("--pixel-mode", choices=("rgb332", "gray", "channels"), default="rgb332", help="pixel tokens")
    p.add_argument("--image-size", type=positive_int, default=32, help="digits only: image side (CIFAR is 32)")
    p.add_argument("--steps", type=positive_int, default=None, help="override the optimizer steps of every cell")
    p.add_argument("--eval-samples", type=positive_int, default=None,
                   help="images / text examples scored (default: preset)")
    p.add_argument("--fid-extractor", default=mi.DEFAULT_EXTRACTOR,
                   help=f"torch-fidelity feature extractor; {TINY_EXTRACTOR} is a random 16-d net for tests only")
    p.add_argument("--tokenizer", default="auto", help="bytes, a local HF tokenizer, or auto (the authors' "
                   "tokenizer for WMT/CommonGen if available offline, else bytes)")
    p.add_argument("--bart-path", default=None, help=f"local facebook/bart-base for BARTScore (or ${mt.BART_ENV})")
    p.add_argument("--data-dir", default=None, help="data directory (default $ATTENTION_ZOO_DATA)")
    p.add_argument("--no-download", dest="download", action="store_false", help="fail instead of downloading")
    p.add_argument("--train", nargs="*", default=[], metavar="KEY=VALUE", help="TrainConfig overrides")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep finished cells' checkpoints")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="decide preset: cells trained at once, one process each (default: CPU cores up to 8 on cpu)")
    add_ensemble_argument(p)
    return add_launcher_arguments(p)


# Presets whose seeds train as grouped models by default (``experiments.ensemble_units``; ``--ensemble`` /
# ``--no-ensemble`` override), for Tables 1, 3 and 4: empty until the decide presets are rerun with it.
ENSEMBLE: frozenset[str] = frozenset()


def make_context(args, name: str) -> Context:
    if args.fid_extractor == TINY_EXTRACTOR:
        _register_tiny_extractor()
    preset, n = PRESETS[args.preset], args.eval_samples
    data = DataOptions(args.image_task, args.pixel_mode, args.image_size, args.tokenizer, args.data_dir,
                       args.download, preset.max_train_pairs, n or preset.image_eval, n or preset.text_eval,
                       scored_holdout=args.preset == "decide")
    train = {**parse_overrides(args.train), **({} if args.steps is None else {"max_steps": args.steps})}
    return Context(name, args.preset, Path(args.out), resolve_device(args.device), data, args.fid_extractor, train,
                   args.quiet, args.keep_checkpoints, args.bart_path, args.fresh, ensemble_on(args, ENSEMBLE))


def datasets_of(ctx: Context, spec: str | None, default: tuple[str, ...] | None = None,
                allowed: tuple[str, ...] = IMAGE_SETS + TEXT_SETS) -> list[str]:
    """Raises ValueError for a dataset outside ``allowed``."""
    p = ctx.preset
    default = default or p.image_datasets + p.text_datasets
    names = [d.strip() for d in spec.split(",") if d.strip()] if spec else list(default)
    bad = [d for d in names if d not in allowed]
    if bad:
        raise ValueError(f"datasets: {', '.join(bad)} not among {', '.join(allowed)}")
    return names


_CONTEXTS: dict[tuple[str, str], Context] = {}


def context_for(args, name: str) -> Context:
    """The table's Context for ``args``, built once per process (a worker or a cluster job builds its own)."""
    key = (name, json.dumps(vars(args), sort_keys=True, default=str))
    if key not in _CONTEXTS:
        _CONTEXTS[key] = make_context(args, name)
    return _CONTEXTS[key]


def unit_work(unit: list[dict], module: str, args) -> list[list[dict]] | None:
    """A work unit of a generation table (protocol.Plan.work): ``module.cell_rows(ctx, cell)`` for each cell, the
    finished cells' checkpoints pruned; None as soon as one is interrupted (resumable from its run directory). With
    ``--ensemble`` a unit of several cells (one arm, one phase) trains as one grouped model
    (``training.train_cells_grouped``, from ``module.model_options``) where the arm allows it, then each cell is
    scored as before; the rows say which path ran (``ensemble_units``)."""
    from .training import train_cells_grouped

    mod = importlib.import_module(module)
    ctx = context_for(args, mod.NAME)
    trained, extra = [None] * len(unit), {}
    if ctx.ensemble:
        got, reason = (None, "one cell in its unit") if len(unit) == 1 else \
            train_cells_grouped(ctx, unit, *mod.model_options(ctx, unit[0]))
        if got is not None and any(res.status == "interrupted" for _, _, res in got):
            print(f"{ctx.name}: interrupted; rerun the same command to resume the group", file=sys.stderr)
            return None
        trained, extra = (got, ensemble_columns(len(unit))) if got is not None else (trained,
                                                                                     ensemble_columns(1, reason))
    out = []
    for cell, t in zip(unit, trained):
        rows = mod.cell_rows(ctx, cell, trained=t)
        if rows is None:
            print(f"{ctx.name}: interrupted; rerun the same command to resume from {ctx.run_dir(cell)}",
                  file=sys.stderr)
            return None
        if not ctx.keep_checkpoints:
            prune_checkpoints(ctx.run_dir(cell))
        out.append([{**r, **extra} for r in rows] if ctx.ensemble else rows)
    return out


def cell_plan(args, module: str, ctx: Context, store: ResultStore, cells: list[dict], finish, workers: int = 1
              ) -> Plan:
    """The protocol's plan of a generation table: one unit per cell, computed by ``module.cell_rows``."""
    keys = ("dataset", "variant", "flavor", "setting", "phase", "seed")
    units = ensemble_units(cells) if ctx.ensemble else [[c] for c in cells]
    return Plan(store, units, functools.partial(unit_work, module=module, args=args), finish,
                workers=workers, describe=lambda u: "/".join(str(u[0][k]) for k in keys if k in u[0])
                + (f" (+{len(u) - 1} grouped)" if len(u) > 1 else ""))


def run_cells(args, module: str, ctx: Context, store: ResultStore, cells: list[dict], clock: Clock, write_report,
              name: str) -> int:
    """Compute the pending ``cells`` through the protocol, then write the table's report (``write_report(ctx, frame,
    env, store=store)`` -> (comparison, verdicts)) and print its comparison, verdicts and cost line."""

    def finish() -> int:
        comp, verdicts = write_report(ctx, *frame_and_env(store, ctx, clock), store=store)
        print(comparison_text(comp))
        print("\n".join(verdict_lines(verdicts)))
        print(clock.line(name))
        return 0

    return execute(cell_plan(args, module, ctx, store, cells, finish), args, name)


def open_cell_store(args, ctx: Context, clock: Clock) -> ResultStore:
    """The generation tables' store: cells keyed by every option that can change them and the environment."""
    return open_store(args, ctx.name, ctx.device, environment(ctx, clock),
                      selection=("datasets", "settings", "depths", "keep_checkpoints", "download", "data_dir", "train",
                                 "jobs", "ensemble"),
                      train_overrides=result_identity(ctx.train_overrides))


def frame_and_env(store: ResultStore, ctx: Context, clock: Clock) -> tuple[pd.DataFrame, dict]:
    """The long frame of every cell of this context (also those other runs on this ``--out`` measured), and the
    environment record naming every run behind it."""
    df = store.frame()
    return df, store.environment(environment(ctx, clock), df)


@dataclass
class Clock:
    """Wall and process CPU time of a run, with the 1-minute load average at both ends (shared machines)."""

    wall: float = field(default_factory=time.perf_counter)
    cpu: float = field(default_factory=time.process_time)
    load: float = field(default_factory=lambda: os.getloadavg()[0])

    def record(self) -> dict:
        return {"wall_s": time.perf_counter() - self.wall, "cpu_s": time.process_time() - self.cpu,
                "loadavg_start": self.load, "loadavg_end": os.getloadavg()[0]}

    def line(self, name: str) -> str:
        r = self.record()
        return (f"{name}: wall {r['wall_s']:.0f} s, process CPU {r['cpu_s']:.0f} s, torch threads "
                f"{torch.get_num_threads()}, 1-min load average {r['loadavg_start']:.1f} -> {r['loadavg_end']:.1f}")


def environment(ctx: Context, clock: Clock, **extra) -> dict:
    return environment_record(ctx.device, preset=ctx.preset_name, extractor=ctx.extractor, data=asdict(ctx.data),
                              **clock.record(), **extra)


