"""Where MHA's layer time goes (the quick benchmark's ``--breakdown``): projections, SDPA core and the rest."""

from __future__ import annotations

import torch

from ..registry import create_attention
from .gemm import interleaved_with_gemm

BREAKDOWN = ("mha layer", "projections (qkv + out_proj)", "SDPA core")


def mha_breakdown(device: torch.device, batch: int, seq_len: int, d_model: int, heads: int, warmup: int,
                  rounds: int) -> tuple[dict, float]:
    """Where MHA's layer time goes: fwd+bwd of the whole layer, of its two projections alone (the qkv and output
    GEMMs with their biases, on inputs of the layer's shapes) and of F.scaled_dot_product_attention alone (on
    q, k, v in the layout the layer hands it), timed interleaved; the rest (layer - projections - core) is the
    layout copies of splitting/merging heads, the bias gradients' reductions and autograd's bookkeeping.
    ({part: {"ms", "iqr_ms", "gflop" (fwd+bwd, 3 x forward), "share" of the layer time}}, the GEMM rate of the
    same rounds in GFLOP/s)."""
    gen = torch.Generator().manual_seed(0)
    B, T, D, H = batch, seq_len, d_model, heads
    layer = create_attention("mha", d_model=D, n_heads=H).to(device)
    x = torch.randn(B, T, D, generator=gen).to(device).requires_grad_()
    z = torch.randn(B, T, D, generator=gen).to(device).requires_grad_()
    g = torch.randn(B, T, D, generator=gen).to(device)
    g3 = torch.randn(B, T, 3 * D, generator=gen).to(device)
    qkv = torch.randn(B, T, 3 * D, generator=gen).to(device).requires_grad_()

    def whole():
        layer.zero_grad(set_to_none=True)
        layer(x).backward(g)

    def projections():
        layer.zero_grad(set_to_none=True)
        torch.autograd.backward([layer.qkv(x), layer.out_proj(z)], [g3, g])

    def core():
        q, k, v = layer.split_qkv(qkv)
        layer.merge_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v)).backward(g)

    fns = dict(zip(BREAKDOWN, (whole, projections, core)))
    results, failures, gemm = interleaved_with_gemm(fns, device, max(1, warmup), rounds)
    for exc in failures.values():
        raise exc
    flops = {BREAKDOWN[0]: 8 * B * T * D * D + 4 * B * T * T * D, BREAKDOWN[1]: 8 * B * T * D * D,
             BREAKDOWN[2]: 4 * B * T * T * D}
    total = results[BREAKDOWN[0]].median_ms
    out = {part: {"ms": lat.median_ms, "iqr_ms": lat.iqr_ms, "gflop": 3 * flops[part] / 1e9,
                  "share": lat.median_ms / total} for part, lat in results.items()}
    rest = total - out[BREAKDOWN[1]]["ms"] - out[BREAKDOWN[2]]["ms"]
    out["rest (head split/merge copies, bias grads, autograd)"] = {"ms": rest, "iqr_ms": None, "gflop": 0.0,
                                                                   "share": rest / total}
    return out, gemm


def breakdown_lines(parts: dict, gemm: float) -> list[str]:
    lines = []
    for part, r in parts.items():
        rate = f", {100 * r['gflop'] / (r['ms'] * 1e-3) / gemm:.0f} % of the GEMM rate" if r["gflop"] else ""
        lines.append(f"{part}: {r['ms']:.1f} ms ({100 * r['share']:.0f} % of the layer{rate})")
    return lines
