"""Latency: warm-up, per-iteration timing, median and IQR (conventions.md §2).

CUDA: one pair of CUDA events per iteration, a single synchronize before reading them. CPU: ``perf_counter_ns``
around each call, with ``torch.get_num_threads()`` recorded (pin it once at process start).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..variants.base import check_positive_int
from .workload import Workload

MODES = ("forward", "fwd_bwd")


@dataclass
class LatencyResult:
    median_ms: float
    q25_ms: float
    q75_ms: float
    mean_ms: float
    std_ms: float
    times_ms: list[float] = field(repr=False)
    threads: int
    device: str
    warmup: int

    @property
    def iqr_ms(self) -> float:
        return self.q75_ms - self.q25_ms

    @property
    def repeats(self) -> int:
        return len(self.times_ms)

    @classmethod
    def from_times(cls, times_ms: list[float], device: str, warmup: int) -> LatencyResult:
        t = np.asarray(times_ms, dtype=float)
        q25, med, q75 = np.percentile(t, [25, 50, 75])
        return cls(float(med), float(q25), float(q75), float(t.mean()), float(t.std()), [float(v) for v in t],
                   torch.get_num_threads(), device, warmup)

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("times_ms")
        return {**out, "iqr_ms": self.iqr_ms, "repeats": self.repeats}


def measure_latency(fn: Callable[[], object], device: torch.device | str = "cpu", warmup: int = 10,
                    repeats: int = 30) -> LatencyResult:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` individually timed calls (milliseconds).

    Raises:
        ValueError: ``warmup`` negative or ``repeats`` < 1.
    """
    check_positive_int("warmup", warmup, allow_zero=True)
    check_positive_int("repeats", repeats)
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.synchronize()
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(repeats)]
            for start, end in events:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()  # once, before reading: never time kernel launches
            times = [start.elapsed_time(end) for start, end in events]
    else:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t0) / 1e6)
    return LatencyResult.from_times(times, str(device), warmup)


def step_fn(workload: Workload, mode: str) -> Callable[[], object]:
    """``forward``: eval + inference_mode. ``fwd_bwd``: train mode, grads cleared (set to None), forward, loss,
    backward (no optimizer step)."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    model = workload.model
    if mode == "forward":
        def forward():
            model.eval()
            with torch.inference_mode():
                return workload.forward()

        return forward

    def fwd_bwd():
        model.train()
        workload.zero_grad()
        loss = workload.loss(workload.forward())
        loss.backward()
        return loss

    return fwd_bwd


def measure_model_latency(workload: Workload, mode: str = "forward", device: torch.device | str = "cpu",
                          warmup: int = 10, repeats: int = 30) -> LatencyResult:
    """Latency of one forward (``forward``) or forward+backward (``fwd_bwd``) of a built workload."""
    return measure_latency(step_fn(workload, mode), device, warmup, repeats)
