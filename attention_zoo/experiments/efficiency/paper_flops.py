"""The DAMCHA authors' closed-form MAC model behind Table 2's GFLOPs (docs/experiments.md §6).

From erwinmsmith/DAMCHA ``scripts/profile_flops_latency.py`` at commit ``e6c19f1``: one forward pass at batch 1,
GFLOPs = 2·MACs/1e9, compact config D=128, H=8, d_h=16, F=d_ff=256, N=4. The standard layer costs
``std(T) = 4TD² + 2HT²d_h + 2TDF``; each method adds or replaces terms. DAMCHA's generator is one
``Linear(D → D²)`` (profiling config ``mlp_hidden=()``) plus a rank-16 layer bias, counted once per layer and
independent of T. This is the model of the *original* code, not of attention_zoo's modules (whose own formulas
give ``fwd_gflops_analytic``); it reproduces the paper's three quoted GFLOPs exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...checks import check_positive_int


@dataclass(frozen=True)
class CompactConfig:
    d_model: int = 128  # D
    n_heads: int = 8  # H
    d_ff: int = 256  # F
    n_layers: int = 4  # N
    dcmha_rank: int = 4  # r of the DCMHA router
    compact_rank: int = 4  # r of "DAMCHA compact"
    layer_bias_rank: int = 16
    expert_factor: int = 2  # MoA: E = expert_factor · H

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def _std(T: int, c: CompactConfig) -> int:
    D, H, dh, F = c.d_model, c.n_heads, c.head_dim, c.d_ff
    return 4 * T * D * D + 2 * H * T * T * dh + 2 * T * D * F


def _damcha_sequence(T: int, c: CompactConfig) -> int:
    D, H, dh, F = c.d_model, c.n_heads, c.head_dim, c.d_ff
    return 2 * T * D * D + H * T * dh * dh + 2 * H * T * T * dh + 2 * T * D * F


def _extra(method: str, T: int, c: CompactConfig) -> int:
    """Per-layer MACs beyond (or replacing) the standard layer."""
    D, H, dh, r = c.d_model, c.n_heads, c.head_dim, c.dcmha_rank
    E = c.expert_factor * H
    bias = c.layer_bias_rank * D * D
    return {
        "mha": 0,
        "mma": 0,
        "tha": 2 * T * T * H * H,
        "dcmha": T * D * r + T * r * H * H + T * D * H + T * T * H * H,
        "colmha": 2 * T * H * H * dh,
        "moa": 3 * T * E * D * dh - 3 * T * D * D + 2 * E * T * T * dh - 2 * H * T * T * dh + T * D * E,
        "damcha": D * D * D + bias,  # Linear(D -> D²) on one context vector + layer bias
        "damcha_compact": D * 2 * c.compact_rank * D + bias,  # Linear(D -> 2·D·r)
    }[method]


PAPER_METHODS = ("mha", "mma", "tha", "dcmha", "colmha", "moa", "damcha", "damcha_compact")
# The authors' script costs the two DAMCHA rows on their own layer (no W_q, W_k); every other method on std(T).
_LAYER_MODEL = {"damcha": _damcha_sequence, "damcha_compact": _damcha_sequence}


def paper_macs(method: str, seq_len: int, config: CompactConfig = CompactConfig()) -> int:
    """MACs of one forward pass at batch 1 under the authors' model.

    Raises:
        ValueError: unknown ``method`` (lists the known ones) or a non-positive ``seq_len``.
    """
    if method not in PAPER_METHODS:
        raise ValueError(f"method: expected one of {', '.join(PAPER_METHODS)}, got {method!r}")
    T, N = check_positive_int("seq_len", seq_len), config.n_layers
    return N * (_LAYER_MODEL.get(method, _std)(T, config) + _extra(method, T, config))


def paper_gflops(method: str, seq_len: int, config: CompactConfig = CompactConfig()) -> float:
    """GFLOPs = 2·MACs/1e9 (the unit of the paper's Table 2)."""
    return 2 * paper_macs(method, seq_len, config) / 1e9


# Table 2 GFLOPs quoted in the paper (§5.2, App. K): (method, dataset, T) -> value
PAPER_QUOTED_GFLOPS = {
    ("damcha", "CIFAR-10", 64): 0.0786,
    ("moa", "CIFAR-10", 64): 0.1101,
    ("damcha", "WMT", 256): 0.3586,
}
