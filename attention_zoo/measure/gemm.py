"""The machine's GEMM rate: the bound of every "% of the GEMM rate", timed alone or among the cases it bounds.

On CPU an fp32 GEMM; on CUDA a bf16 GEMM (the tensor-core rate a trained layer can reach; an fp32 GEMM would be the
TF32 rate or the plain fp32 one depending on a global flag), with the TF32 flag stated in the description."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .latency import LatencyResult, measure_interleaved, measure_latency

GEMM_N = 2048
GEMM_LABEL = f"GEMM {GEMM_N}x{GEMM_N}"  # the reference timed among the cases


def gemm_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def gemm_description(device: torch.device, n: int = GEMM_N) -> str:
    """"fp32 GEMM 2048x2048" on CPU; "bf16 GEMM 2048x2048 (TF32 matmul off)" on CUDA."""
    name = {torch.float32: "fp32", torch.bfloat16: "bf16"}[gemm_dtype(device)]
    tf32 = f" (TF32 matmul {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'})" \
        if torch.device(device).type == "cuda" else ""
    return f"{name} GEMM {n}x{n}{tf32}"


def gemm_case(device: torch.device, n: int = GEMM_N) -> tuple[Callable[[], torch.Tensor], int]:
    """(callable, FLOPs) of an n×n by n×n matmul in ``gemm_dtype(device)``."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=gemm_dtype(device)) for _ in range(2))
    return (lambda: a @ b), 2 * n**3


def _gflops(flop: int, lat: LatencyResult) -> float:
    return flop / (lat.median_ms * 1e-3) / 1e9


def gemm_gflops(device: torch.device, n: int = GEMM_N, warmup: int = 3, repeats: int = 10) -> float:
    """GEMM rate of an n×n by n×n matmul (2n³ FLOPs / median time), timed on its own."""
    fn, flop = gemm_case(device, n)
    return _gflops(flop, measure_latency(fn, device, warmup, repeats))


def interleaved_with_gemm(fns: dict, device: torch.device, warmup: int, rounds: int) -> tuple[dict, dict, float]:
    """``measure_interleaved`` of ``fns`` with the GEMM reference as one more case of the same rounds, so a % of the
    GEMM rate compares times taken under the same load: (results, failures, GEMM rate in GFLOP/s)."""
    fn, flop = gemm_case(device)
    results, failures = measure_interleaved({GEMM_LABEL: fn, **fns}, device, warmup, repeats=rounds)
    return results, failures, _gflops(flop, results.pop(GEMM_LABEL))
