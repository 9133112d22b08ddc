"""Arms of the baselines' stand-ins (docs/experiments.md §11): a variant with its options on a backbone with its
overrides, and the
matched MHA controls whose feed-forward width is solved to equal another arm's parameters or FLOPs.

An ``ArmSpec`` names what a cell trains: ``label`` (the ``arm`` column every row carries, and the name the claims
filter on), the registered ``variant``, its attention ``options`` (the ``paper`` flavour), the backbone ``model``
overrides (``n_heads``, ``d_ff``), the ``papers`` whose claims read it (``--paper`` picks them), ``sweep``: the
sweep it is a point of and its value there (a claim's slope runs over ``sweep_value``) and ``match``: for a
control, ("params" | "flops", the label of the arm it matches), solved by ``matched_d_ff`` at the cell's own sizes
(the feed-forward width whose model comes nearest to the target's parameters, or forward FLOPs). A wider FFN
adds per-position capacity only: it reads no other position, so it matches a budget without adding attention.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from ..measure.flops import analytic_flops
from ..models import Decoder
from ..registry import get_attention_spec, resolved_options_json, split_options

PAPERS = ("tha", "dcmha", "colmha", "moa", "mma", "damcha")
MODEL_KEYS = ("n_heads", "d_ff")
MATCH_KINDS = ("params", "flops")


@dataclass(frozen=True)
class ArmSpec:
    """One arm (module docstring).

    Raises:
        ValueError: an unknown variant, paper, model key or match kind; an option the variant does not take.
    """

    label: str
    variant: str
    options: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    papers: tuple[str, ...] = ()
    match: tuple[str, str] | None = None
    sweep: tuple[str, float] | None = None  # (sweep name, this arm's value): cells carry sweep / sweep_value

    def __post_init__(self):
        get_attention_spec(self.variant)
        _, rest = split_options(self.variant, self.options)
        if rest:
            raise ValueError(f"options: {self.variant!r} does not take {', '.join(sorted(rest))} (arm {self.label})")
        bad = sorted(set(self.model) - set(MODEL_KEYS))
        if bad:
            raise ValueError(f"model: unknown backbone override(s) {', '.join(bad)}; known: {', '.join(MODEL_KEYS)}")
        unknown = [p for p in self.papers if p not in PAPERS]
        if unknown:
            raise ValueError(f"papers: unknown {', '.join(unknown)}; known: {', '.join(PAPERS)}")
        if self.match is not None and (len(self.match) != 2 or self.match[0] not in MATCH_KINDS):
            raise ValueError(f"match: expected (one of {MATCH_KINDS}, an arm label), got {self.match!r}")


def arm_fields(arm: ArmSpec) -> dict:
    """The cell fields that identify the arm: label, variant, flavour, resolved attention options, model overrides
    (a matched arm's d_ff is solved at plan time and stored in ``backbone``)."""
    fields = {"arm": arm.label, "variant": arm.variant, "flavor": "paper",
              "attention_options": resolved_options_json(arm.variant, {**arm.options, "flavor": "paper"}),
              "backbone": json.dumps(dict(sorted(arm.model.items())), sort_keys=True)}
    if arm.sweep is not None:  # the claims' slope rules read a sweep's arms by these two columns
        fields.update(sweep=arm.sweep[0], sweep_value=arm.sweep[1])
    return fields


def build_decoder(vocab_size: int, d_model: int, n_layers: int, n_heads: int, seq_len: int, arm: ArmSpec | dict,
                  causal: bool = True, **kw) -> tuple[Decoder, dict]:
    """The arm's backbone (``Decoder``, bidirectional when not ``causal``) and the attention options it received;
    ``arm``: an ArmSpec or a cell (its ``variant``, ``attention_options`` JSON and ``backbone`` JSON)."""
    if isinstance(arm, ArmSpec):
        variant, opts, model = arm.variant, {**arm.options, "flavor": "paper"}, dict(arm.model)
    else:
        variant, opts, model = arm["variant"], json.loads(arm["attention_options"]), json.loads(arm["backbone"])
    opts, _ = split_options(variant, opts)
    dec = Decoder(vocab_size, d_model, n_layers, model.get("n_heads", n_heads), attention=variant,
                  attention_options=opts, max_seq_len=seq_len, d_ff=model.get("d_ff"), causal=causal, **kw)
    return dec, opts


def model_costs(model: Decoder, seq_len: int) -> tuple[int, int]:
    """(parameters, forward FLOPs of one sequence) of a backbone, from the modules' closed forms."""
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return params, analytic_flops(model, 1, seq_len)


def matched_d_ff(kind: str, target: tuple[int, int], vocab_size: int, d_model: int, n_layers: int, n_heads: int,
                 seq_len: int, base: ArmSpec, causal: bool = True, lo: int = 1) -> int:
    """The d_ff whose ``base`` backbone comes nearest to ``target``'s parameters (``kind="params"``) or forward FLOPs
    (``"flops"``; ``target`` = (parameters, FLOPs)); both are affine in d_ff, so two evaluations fix it.

    Raises:
        ValueError: ``kind`` unknown, or no d_ff ≥ 1 reaches the target (the base is already larger).
    """
    if kind not in MATCH_KINDS:
        raise ValueError(f"kind: expected one of {MATCH_KINDS}, got {kind!r}")
    which = MATCH_KINDS.index(kind)

    def cost(d_ff: int) -> int:
        spec = ArmSpec(base.label, base.variant, base.options, {**base.model, "d_ff": d_ff})
        with torch.device("meta"):
            dec, _ = build_decoder(vocab_size, d_model, n_layers, n_heads, seq_len, spec, causal)
        return model_costs(dec, seq_len)[which]

    c1, c2 = cost(lo), cost(lo + 1)
    need = target[which] - c1
    if need < 0:
        raise ValueError(f"match: {base.label} with d_ff = {lo} already has more {kind} than the target "
                         f"({c1:,} > {target[which]:,})")
    return lo + round(need / (c2 - c1))  # both counts are affine in d_ff: the nearest width


__all__ = ["MATCH_KINDS", "MODEL_KEYS", "PAPERS", "ArmSpec", "arm_fields", "build_decoder", "matched_d_ff",
           "model_costs"]
