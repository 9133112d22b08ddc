"""Shared CLI flags, variant selection and result-store provenance for the reproduce scripts.

One set of flags (``base_parser``): ``--device``, ``--preset``, ``--out``, ``--seeds``, ``--variants``, ``--flavour``
(default ``paper`` everywhere), ``--threads``, ``--quiet``, ``--include``, ``--fresh``, ``--dry-run`` and the
launcher's; a script adds its own with the same spellings (``--steps``, ``--datasets``, ``--data-dir``,
``--no-download``). Every list flag takes its items space- or comma-separated (``ListAction``); old spellings
still parse for one release and print a one-line deprecation note (``ExperimentParser.rename``). The launcher's
settings are checked while parsing (``launchers.check_launcher``), so a dry run refuses what a run refuses."""

from __future__ import annotations

import argparse
import sys
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
from .entry import experiment_main  # noqa: F401 - re-exported: the experiments' main decorator
from .protocol import LAUNCH_OPTIONS

PRESETS = ("smoke", "paper")
FIVE_SEEDS = [0, 1, 2, 3, 4]  # what a verdict needs (docs/claims.md)


class ListAction(argparse.Action):
    """A list flag whose items come space- or comma-separated (``--seeds 0 1 2`` = ``--seeds 0,1,2``), each
    converted by ``item``. ``join=True``: the value stays one comma-separated string, as these flags always
    stored it (``--variants``, ``--datasets``, ``--depths``), so the stores keyed by it stay valid."""

    def __init__(self, option_strings, dest, item=str, join: bool = False, **kwargs):
        super().__init__(option_strings, dest, nargs="+", **kwargs)
        self.item, self.join = item, join

    def __call__(self, parser, namespace, values, option_string=None):
        if self.join:
            setattr(namespace, self.dest, ",".join(values))
            return
        try:
            setattr(namespace, self.dest, [self.item(v) for raw in values for v in raw.split(",") if v.strip()])
        except (argparse.ArgumentTypeError, ValueError) as e:
            raise argparse.ArgumentError(self, str(e)) from None


class ExperimentParser(argparse.ArgumentParser):
    """The reproduce scripts' parser: ``rename(old, new)`` keeps an old flag spelling working for one release (a
    one-line note on stderr says it is deprecated); ``preset_seeds`` gives ``--seeds`` a default per preset."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.renamed: dict[str, str] = {}
        self.preset_seeds: dict[str, list[int]] | None = None

    def rename(self, old: str, new: str) -> None:
        self._option_string_actions[old] = self._option_string_actions[new]  # parsed, not shown in --help
        self.renamed[old] = new

    def parse_known_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        for old, new in self.renamed.items():
            if any(a == old or a.startswith(old + "=") for a in argv):
                print(f"{self.prog}: note: {old} is deprecated and goes in the next release; use {new}",
                      file=sys.stderr)
        ns, rest = super().parse_known_args(argv, namespace)
        if self.preset_seeds and getattr(ns, "seeds", 0) is None:
            ns.seeds = list(self.preset_seeds.get(ns.preset, self.preset_seeds["*"]))
        if hasattr(ns, "launcher"):  # the launcher's settings, checked as a launch would, before any work or plan
            from .launchers import check_launcher

            check_launcher(ns, self.prog)
        return ns, rest


def base_parser(name: str, description: str, default_seeds: list[int] | dict[str, list[int]] | None = None, *,
                seeds: bool = True, variants: bool = True, presets: tuple[str, ...] = PRESETS) -> ExperimentParser:
    """Parser with the flags every reproduce script shares: device, preset, out, seeds, variants, flavour.

    ``default_seeds``: a list, or seeds per preset (``"*"``: the others); ``seeds=False`` / ``variants=False``
    leave out ``--seeds`` / ``--variants`` and ``--flavour`` for scripts that do not use them; ``presets``: the
    script's preset names (smoke and paper, and e.g. decide).
    """
    p = ExperimentParser(prog=f"reproduce/{name}.py", description=description, formatter_class=HelpFormatter)
    p.add_argument("--device", action=DeviceAction, default="auto",
                   help="auto (cuda if available), cpu, cuda or cuda:N")
    p.add_argument("--preset", choices=presets, default="smoke",
                   help="smoke: minutes on a 2-core CPU with embedded data; paper: the paper's configuration"
                        + ("; decide: trained to a plateau with enough seeds to decide the claims on a CPU"
                           if "decide" in presets else ""))
    p.add_argument("--out", type=Path, default=Path("results") / name, help="output directory")
    if seeds:
        per_preset = isinstance(default_seeds, dict)
        p.preset_seeds = default_seeds if per_preset else None
        shown = "; ".join(f"{k if k != '*' else 'other presets'}: {' '.join(map(str, v))}"
                          for k, v in default_seeds.items()) if per_preset else None
        p.add_argument("--seeds", action=ListAction, item=seed_int,
                       default=None if per_preset else (default_seeds or [0]),
                       help="random seeds, each in 0 … 2**32 − 1" + (f" (default: {shown})" if shown else ""))
    if variants:
        p.add_argument("--variants", "--attn", dest="variants", action=ListAction, join=True, default="*",
                       help="variant names or fnmatch wildcards; * is every registered variant; control arms by "
                            "name or all of them as `controls` (docs/claims.md)")
        p.add_argument("--flavour", "--flavor", dest="flavour", choices=("paper", "damcha_repo", "both"),
                       default="paper", help="baseline flavour: the published method, the DAMCHA authors' "
                                             "version, or both")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_include_argument(p)
    p.add_argument("--fresh", action="store_true",
                   help="recompute every cell; by default a cell already measured in --out with the same settings "
                        "on the same kind of machine (device model, torch, threads, dtype) is reused")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (cells to run, finished cells skipped, data, estimated cost) and exit; "
                        "trains nothing and writes nothing")
    return p


# Options that only pick which cells run or where they go, or whose effect the environment fingerprint records
# (device, threads); everything else a script parses can change numbers.
SELECTION_OPTIONS = ("out", "quiet", "fresh", "dry_run", "variants", "flavour", "seeds", "include", "device", "threads",
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
