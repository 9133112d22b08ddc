"""Shared CLI flags and variant selection for the reproduce scripts (conventions.md §8)."""

from __future__ import annotations

import argparse
import fnmatch
from pathlib import Path

import torch

from ..registry import get_attention_spec, list_attentions

PRESETS = ("smoke", "paper")


def base_parser(name: str, description: str, default_seeds: list[int] | None = None) -> argparse.ArgumentParser:
    """Parser with the flags every reproduce script shares: device, preset, out, seeds, variants, flavour."""
    p = argparse.ArgumentParser(
        prog=f"reproduce/{name}.py", description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    p.add_argument("--preset", choices=PRESETS, default="smoke",
                   help="smoke: minutes on a 2-core CPU with embedded data; paper: the paper's configuration")
    p.add_argument("--out", type=Path, default=Path("results") / name, help="output directory")
    p.add_argument("--seeds", type=int, nargs="+", default=default_seeds or [0], help="random seeds")
    p.add_argument("--variants", "--attn", dest="variants", default="*",
                   help="comma-separated variant names or fnmatch wildcards (default: every registered variant)")
    p.add_argument("--flavour", "--flavor", dest="flavour", choices=("paper", "damcha_repo", "both"), default="both",
                   help="baseline flavour: the published method, the DAMCHA authors' version, or both")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def select_variants(spec: str) -> list[str]:
    """Comma-separated names or wildcards -> registered names. Raises ValueError naming the unknown ones."""
    names = list_attentions()
    chosen: list[str] = []
    for pat in (s.strip() for s in spec.split(",") if s.strip()):
        hits = [n for n in names if fnmatch.fnmatch(n, pat)]
        if not hits:
            raise ValueError(f"variants: {pat!r} matches no registered attention; available: {', '.join(names)}")
        chosen += [h for h in hits if h not in chosen]
    if not chosen:
        raise ValueError(f"variants: empty selection; available: {', '.join(names)}")
    return chosen


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


def setup_threads(threads: int | None) -> int:
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads: expected a positive int, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def _parse_value(raw: str):
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def parse_extra_configs(items: list[str]) -> list[tuple[str, dict, str]]:
    """``["damcha:collapsed_generator=true"]`` -> [(name, options, label)]: extra rows for an option setting.

    Raises:
        ValueError: a malformed item, or an unknown attention name.
    """
    out = []
    for item in items:
        name, sep, rest = item.partition(":")
        pairs = [kv for kv in rest.split(",") if kv]
        if not sep or not pairs or any("=" not in kv for kv in pairs):
            raise ValueError(f"extra: expected name:key=value[,key=value], got {item!r}")
        get_attention_spec(name.strip())
        options = {k.strip(): _parse_value(v.strip()) for k, v in (kv.split("=", 1) for kv in pairs)}
        out.append((name.strip(), options, f"{name.strip()}[{rest}]"))
    return out


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
