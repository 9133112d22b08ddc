"""What ``zoo.swap_attention`` carries over from a host attention, and what it reports about the swap.

With ``copy_weights=True`` a new attention takes every host projection it has a faithful place for: all four (q, k,
v, output) in the MHA layout (a ``qkv`` Linear D→3D and an ``out_proj`` D→D); otherwise V (``v_proj`` D→D) and the
output projection (``out_proj`` D→D), the parts whose meaning is the host's in every variant (DAMCHA's and ColMHA's
query/key paths are their own: a metric, collaborative heads, and stay freshly initialised). Where the host has a
feature our projections cannot express (grouped K/V heads, qk-norm, ...) and anything would be copied, the swap is
refused, as for ``mha``.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn

from .hosts import _fail

PARTS = ("q", "k", "v", "out")
GROWTH_WARNING = 2.0  # a swap that makes the model more than this many times larger warns
log = logging.getLogger("attention_zoo")


def _linear(attn: nn.Module, name: str, shape: tuple[int, int]) -> nn.Linear | None:
    m = getattr(attn, name, None)
    return m if isinstance(m, nn.Linear) and tuple(m.weight.shape) == shape else None


def copy_targets(attn: nn.Module, D: int) -> dict[str, tuple[nn.Linear, slice]]:
    """{part: (the Linear of ``attn`` that takes it, its rows)} for the host projections ``attn`` can take."""
    qkv, out, v = _linear(attn, "qkv", (3 * D, D)), _linear(attn, "out_proj", (D, D)), _linear(attn, "v_proj", (D, D))
    if qkv is not None and out is not None:
        if getattr(attn, "q_norm", None) is not None:  # a query/key norm (MHA's qk_norm) changes what q/k compute
            return {"v": (qkv, slice(2 * D, 3 * D)), "out": (out, slice(None))}
        return {"q": (qkv, slice(0, D)), "k": (qkv, slice(D, 2 * D)), "v": (qkv, slice(2 * D, 3 * D)),
                "out": (out, slice(None))}
    return {part: (lin, slice(None)) for part, lin in (("v", v), ("out", out)) if lin is not None}


@torch.no_grad()
def copy_projections(targets: dict, weights: tuple, D: int, path: str) -> None:
    """Copy the host's ``weights`` (w_in [3D, D] rows q; k; v, b_in, w_out, b_out; nn.Linear layout) into
    ``targets``; a missing host bias is copied as zero.

    Raises:
        ValueError: the host has a non-zero bias where the new attention has none.
    """
    w_in, b_in, w_out, b_out = weights
    rows = {"q": slice(0, D), "k": slice(D, 2 * D), "v": slice(2 * D, 3 * D)}
    for part, (lin, sl) in targets.items():
        w, b = (w_out, b_out) if part == "out" else (w_in[rows[part]], None if b_in is None else b_in[rows[part]])
        lin.weight[sl].copy_(w)
        if lin.bias is not None:
            lin.bias[sl].copy_(b) if b is not None else lin.bias[sl].zero_()
        elif b is not None and bool((b != 0).any()):
            raise _fail(path, f"the host's {part} projection has a bias but the new attention was built without "
                              "one (bias=False)")


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def report_swap(model: nn.Module, root: str, name: str, before: int, copied: set[str], copy_weights: bool,
                no_cache: bool) -> dict:
    """Record the swap on ``model`` (``attention_zoo_swap``: the parameter counts before and after, the parts
    copied), log it, and warn when the model grew more than ``GROWTH_WARNING``-fold or, with ``copy_weights``,
    parts of the host's attention were not copied."""
    after = n_params(model)
    info = {"attention": name, "params_before": before, "params_after": after,
            "copied": [p for p in PARTS if p in copied], "use_cache": not no_cache}
    model.attention_zoo_swap = info
    log.info("%s: swapped in %r: %s -> %s parameters; copied from the host: %s", root, name, f"{before:,}",
             f"{after:,}", ", ".join(info["copied"]) or "nothing")
    if before and after > GROWTH_WARNING * before:
        warnings.warn(f"{root}: swapping in {name!r} grew the model from {before:,} to {after:,} parameters "
                      f"({after / before:.1f}x)", stacklevel=3)
    if copy_weights and len(copied) < len(PARTS):
        fresh = [p for p in PARTS if p not in copied]
        warnings.warn(f"{root}: copy_weights: {name!r} has no place for the host's {', '.join(fresh)} "
                      f"projection(s); they are freshly initialised (copied: {', '.join(info['copied']) or 'none'})",
                      stacklevel=3)
    return info


def disable_cache(model: nn.Module) -> bool:
    """Set ``use_cache=False`` in an HF model's config and generation config, so that ``model.generate(ids)`` with
    HF's defaults works after a stack-shared swap (its stack context covers the whole sequence: no incremental
    decoding). Returns whether the model had such a setting."""
    found = False
    for cfg in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        if cfg is not None and hasattr(cfg, "use_cache"):
            cfg.use_cache = False
            found = True
    return found
