"""Shared CLI flags, variant selection and result-store provenance for the reproduce scripts."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..cli import (  # noqa: F401 - re-exported: the scripts take their CLI helpers from here
    DeviceAction,
    HelpFormatter,
    cli_main,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    seed_int,
)
from ..envinfo import fingerprint, setup_threads  # noqa: F401 - setup_threads re-exported for the scripts
from ..plugins import add_include_argument
from ..registry import get_attention_spec, parse_option_rows, resolved_options, select_attentions
from ..results import ResultStore
from .protocol import LAUNCH_OPTIONS

PRESETS = ("smoke", "paper")


def base_parser(name: str, description: str, default_seeds: list[int] | None = None, *, seeds: bool = True,
                variants: bool = True, presets: tuple[str, ...] = PRESETS) -> argparse.ArgumentParser:
    """Parser with the flags every reproduce script shares: device, preset, out, seeds, variants, flavour.

    ``seeds=False`` / ``variants=False`` leave out ``--seeds`` / ``--variants`` and ``--flavour`` for scripts that
    do not use them; ``presets``: the script's preset names (smoke and paper, and e.g. decide).
    """
    p = argparse.ArgumentParser(prog=f"reproduce/{name}.py", description=description, formatter_class=HelpFormatter)
    p.add_argument("--device", action=DeviceAction, default="auto",
                   help="auto (cuda if available), cpu, cuda or cuda:N")
    p.add_argument("--preset", choices=presets, default="smoke",
                   help="smoke: minutes on a 2-core CPU with embedded data; paper: the paper's configuration"
                        + ("; decide: trained to a plateau with enough seeds to decide the claims on a CPU"
                           if "decide" in presets else ""))
    p.add_argument("--out", type=Path, default=Path("results") / name, help="output directory")
    if seeds:
        p.add_argument("--seeds", type=seed_int, nargs="+", default=default_seeds or [0],
                       help="random seeds, each in 0 … 2**32 − 1")
    if variants:
        p.add_argument("--variants", "--attn", dest="variants", default="*",
                       help="comma-separated variant names or fnmatch wildcards; * is every registered variant; "
                            "control arms by name or all of them as `controls` (docs/claims.md)")
        p.add_argument("--flavour", "--flavor", dest="flavour", choices=("paper", "damcha_repo", "both"),
                       default="both", help="baseline flavour: the published method, the DAMCHA authors' version, "
                                            "or both")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_include_argument(p)
    p.add_argument("--fresh", action="store_true",
                   help="recompute every cell; by default a cell already measured in --out with the same settings "
                        "on the same kind of machine (device model, torch, threads, dtype) is reused")
    return p


# Options that only pick which cells run or where they go, or whose effect the environment fingerprint records
# (device, threads); everything else a script parses can change numbers.
SELECTION_OPTIONS = ("out", "quiet", "fresh", "variants", "flavour", "seeds", "include", "device", "threads",
                     *LAUNCH_OPTIONS)


def run_context(args: argparse.Namespace, device: torch.device | str, *, dtype: str = "float32",
                selection: tuple[str, ...] = (), variants: tuple[str, ...] = (), **config) -> dict:
    """What besides a cell's own fields can change its numbers: every parsed option except the selection ones
    (and ``selection``), the resolved configuration ``config`` (preset fields, overrides), the environment
    fingerprint, and the resolved default options of ``variants``: the attentions every cell uses (a script on a
    fixed variant). A cell that names its own variant carries that variant's options itself
    (``attention_options``, ``registry.resolved_options_json``), so registering an unrelated variant
    (``--include``) or changing another variant's default reruns nothing. The ResultStore keys cells by it."""
    skip = set(SELECTION_OPTIONS) | set(selection)
    return {"options": {k: v for k, v in sorted(vars(args).items()) if k not in skip},
            "config": config, "environment": fingerprint(device, dtype),
            "attention_defaults": {n: resolved_options(n) for n in variants}}


def open_store(args: argparse.Namespace, name: str, device: torch.device | str, env: dict, **context_kw
               ) -> ResultStore:
    """The run's ResultStore under ``args.out`` keyed by ``run_context(args, device, **context_kw)``."""
    return ResultStore(args.out, name, run_context(args, device, **context_kw), fresh=getattr(args, "fresh", False),
                       env=env)


select_variants = select_attentions  # the scripts' name for it


def variant_flavours(names: list[str], flavour: str = "both") -> list[tuple[str, str]]:
    """(name, flavor) pairs. ``both`` lists the damcha_repo flavour only where the variant has a distinct one;
    a variant with a single method (MHA, DAMCHA) runs it as ``paper`` under any choice."""
    pairs = []
    for n in names:
        flavors = get_attention_spec(n).flavors
        if flavour == "both":
            pairs += [(n, f) for f in flavors]
        elif flavour in flavors:
            pairs.append((n, flavour))
        else:
            pairs.append((n, "paper"))
    return pairs


parse_extra_configs = parse_option_rows  # the scripts' name for it


def add_extra_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--extra", nargs="*", default=["damcha:collapsed_generator=true"],
                   help="extra rows for option settings, name:key=value[,key=value] (default: DAMCHA's collapsed "
                        "generator next to the full one)")


def variant_configs(names: list[str], flavour: str, extras: list[str]) -> list[tuple[str, str, dict, str]]:
    """(attention name, flavour, options, row label): every selected variant × flavour, then the extra option
    settings (paper flavour) whose variant is among the selected names."""
    rows = [(n, f, {}, n) for n, f in variant_flavours(names, flavour)]
    rows += [(n, "paper", opts, label) for n, opts, label in parse_extra_configs(extras) if n in names]
    return rows
