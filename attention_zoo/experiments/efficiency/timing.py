"""What the efficiency tables (Table 2, Table 7) share: their timing and memory options, the timing rule per preset
and device, the attention rows (variant × flavour plus ``--extra`` option settings), and the measuring loop (claim
a cell, measure it beside the memory fork servers, store it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from ...measure import ForkServers
from ...registry import resolved_options_json
from ...results import ResultStore
from ..common import (
    add_extra_argument,
    non_negative_int,
    positive_float,
    positive_int,
    select_variants,
    variant_configs,
)


@dataclass(frozen=True)
class Timing:
    """Latency settings: ``warmup`` untimed calls, then a fixed ``repeats`` or, when None, at least
    ``min_repeats`` calls and ``min_time_s`` seconds of timed work."""

    warmup: int
    repeats: int | None
    min_time_s: float
    min_repeats: int

    def kwargs(self) -> dict:
        """Keyword arguments of ``measure_model_latency`` after ``device``."""
        return {"warmup": self.warmup, "repeats": self.repeats, "min_time_s": self.min_time_s,
                "min_repeats": self.min_repeats}

    def rule(self) -> str:
        if self.repeats:
            return f"{self.warmup} warm-up, then {self.repeats} timed iterations"
        return f"{self.warmup} warm-up, then at least {self.min_repeats} timed iterations and {self.min_time_s:g} s"


def add_measure_arguments(p: argparse.ArgumentParser) -> None:
    """The timing, memory and option-row flags of the efficiency tables."""
    p.add_argument("--warmup", type=non_negative_int, default=None,
                   help="latency warm-up iterations (default: 10 on CUDA, 1 for the smoke preset on CPU, else 3)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="latency: a fixed number of timed iterations (default: adaptive, see --min-time)")
    p.add_argument("--min-time", type=positive_float, default=None,
                   help="latency: time at least this many seconds per measurement (default 0.25 for the smoke "
                        "preset on CPU, else 1.0) and at least 5 (smoke CPU) or 10 iterations")
    p.add_argument("--memory-workers", type=positive_int, default=2, help="CPU: concurrent memory-measuring processes")
    add_extra_argument(p)


# Options that change how cells are run, not their numbers: memory is measured in one fresh process per item, so
# how many run at once changes no process's peak (timings are taken afterwards, in this process).
RUN_CONTROL = ("memory_workers",)


def timing_for(args: argparse.Namespace, device: torch.device) -> Timing:
    """The timing rule of the preset on the device; command-line values win. The smoke preset on a CPU times
    shorter so that a whole table takes minutes."""
    cuda, smoke = device.type == "cuda", args.preset == "smoke"
    quick = smoke and not cuda
    return Timing(warmup=args.warmup if args.warmup is not None else (10 if cuda else 1 if smoke else 3),
                  repeats=args.repeats,
                  min_time_s=args.min_time if args.min_time is not None else (0.25 if quick else 1.0),
                  min_repeats=5 if quick else 10)


@dataclass(frozen=True)
class AttentionRow:
    """One row of an efficiency table: an attention, its flavour, extra options and the label shown."""

    name: str
    flavor: str
    options: dict
    label: str

    @property
    def module_options(self) -> dict:
        return {"flavor": self.flavor, **self.options}

    def cell_fields(self) -> dict:
        """The row's part of a result cell: label, registered name, flavour and the resolved options (JSON)."""
        return {"variant": self.label, "attention": self.name, "flavour": self.flavor,
                "attention_options": resolved_options_json(self.name, self.module_options)}


def attention_rows(args: argparse.Namespace) -> list[AttentionRow]:
    """Every selected variant × flavour, then the ``--extra`` option settings of the selected variants."""
    return [AttentionRow(*row) for row in variant_configs(select_variants(args.variants), args.flavour, args.extra)]


def measure_cells(store: ResultStore, cells: list[dict], measure: Callable[[dict, ForkServers | None], list[dict]],
                  device: torch.device, memory_workers: int, desc: str, quiet: bool) -> int:
    """Measure the cells not yet in ``store``: each is claimed first (another process on the same ``--out`` may be
    measuring it), measured with ``measure(cell, servers)`` (fork servers on CPU, None on CUDA) and stored; a
    failure releases the claim. Returns how many cells were measured now."""
    todo, done = store.pending(cells), 0
    with ForkServers(memory_workers) as servers:
        for cell in tqdm(todo, desc=desc, disable=quiet):
            if not store.claim(cell):
                continue
            try:
                rows = measure(cell, servers if device.type == "cpu" else None)
            except BaseException:
                store.release(cell)
                raise
            store.add(cell, rows)
            done += 1
    return done


def config_record(obj) -> dict:
    """A preset dataclass as a JSON-able dict (tuples as lists) for environment records and run contexts."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(obj).items()}


__all__ = ["RUN_CONTROL", "AttentionRow", "Timing", "add_measure_arguments", "attention_rows", "config_record",
           "measure_cells", "timing_for"]
