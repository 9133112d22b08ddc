"""Latency: warm-up, adaptive repeats, median and IQR, and a noise guard that marks numbers it cannot trust.

CUDA: one pair of CUDA events per iteration, synchronised once per batch of iterations before reading them. CPU:
``perf_counter_ns`` around each call, with ``torch.get_num_threads()`` recorded (pin it once at process start).

Repeats adapt: timing continues until at least ``min_repeats`` calls and ``min_time_s`` seconds of timed work
(``max_repeats`` caps it), unless a fixed ``repeats`` is given. Around the timed calls the guard records the
1-minute load average and the CPU time other processes used (``/proc/stat`` minus our own rusage), plus, where
the driver reports them (nvidia-ml-py, the ``gpu`` extra), GPU utilisation, SM clock, memory in use and clock-throttle
reasons. A result is ``unstable`` when IQR/median exceeds ``max_iqr`` (10 %), the machine was busy (load beyond our
own threads, or other processes' CPU use, above ``busy_frac`` (½) of the cores), the GPU was busy before the timing
started, or its clocks were throttled during it. Like pyperf, it still reports the number, with the reason beside
it.

The result of the last timed call is checked after timing (outside the timed region): a NaN or infinite output or
loss raises ``NonFiniteError`` (``measure_interleaved`` reports it per callable), which sweeps record as a ``nan``
row (``status.guarded``), never as an ``ok`` timing.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..checks import check_positive_int, check_real
from ..envinfo import SteadyHeap
from .status import NonFiniteError, check_finite
from .workload import Workload

MODES = ("forward", "fwd_bwd")
MAX_IQR = 0.10  # IQR/median above this marks a timing unstable
BUSY_FRAC = 0.5  # other load above this fraction of the cores marks it unstable
# what result rows carry of LoadProbe.stop(); the GPU readings are added where the driver reports them
LOAD_KEYS = ("load_before", "load_after", "other_cpu_cores")
GPU_KEYS = ("gpu_util_pct_before", "gpu_util_pct_after", "gpu_clock_mhz_after", "gpu_max_clock_mhz_after",
            "gpu_mem_used_mib_before", "gpu_throttle_after")


def _busy_cpu_s() -> float | None:
    """CPU seconds the whole machine spent busy since boot (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _gpu_state(device: torch.device) -> dict:
    """What the driver reports of the GPU (needs nvidia-ml-py: the ``gpu`` extra), {} where it cannot: utilisation
    (%), SM clock and its maximum (MHz), memory used by every process (MiB) and the clock-throttle reasons other
    than idling (a bit mask; 0 = none)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        idle = getattr(pynvml, "nvmlClocksThrottleReasonGpuIdle", 1)
        return {"gpu_util_pct": float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                "gpu_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                "gpu_max_clock_mhz": float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
                "gpu_mem_used_mib": pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                "gpu_throttle": int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)) & ~idle}
    except Exception:  # noqa: BLE001 - no NVML, or a driver without the query: record nothing
        return {}


GPU_BUSY_PCT = 10.0  # utilisation before our timing starts above this: another process is using the GPU
GPU_CLOCK_FRAC = 0.9  # an SM clock below this fraction of its maximum after timing: throttled


def gpu_reasons(load: dict) -> list[str]:
    """Why GPU readings make a timing untrustworthy: contention before it started, clocks throttled during it."""
    out = []
    util = load.get("gpu_util_pct_before")
    if util is not None and util > GPU_BUSY_PCT:
        out.append(f"GPU {util:.0f} % busy before timing (another process)")
    clock, top = load.get("gpu_clock_mhz_after"), load.get("gpu_max_clock_mhz_after")
    if clock is not None and top and clock < GPU_CLOCK_FRAC * top:
        out.append(f"SM clock {clock:.0f} of {top:.0f} MHz after timing (throttled)")
    if load.get("gpu_throttle_after"):
        out.append(f"clock-throttle reasons 0x{int(load['gpu_throttle_after']):x} during timing")
    return out


class LoadProbe:
    """Machine activity between ``start()`` and ``stop()``: load averages and other processes' CPU use."""

    def start(self, device: torch.device) -> LoadProbe:
        self.device = device
        self.load_before = os.getloadavg()[0]
        self.t0, self.busy0, self.own0 = time.monotonic(), _busy_cpu_s(), _own_cpu_s()
        self.gpu_before = _gpu_state(device) if device.type == "cuda" else {}
        return self

    def stop(self) -> dict:
        wall = max(time.monotonic() - self.t0, 1e-9)
        busy1, own1 = _busy_cpu_s(), _own_cpu_s()
        other = None
        if busy1 is not None and self.busy0 is not None:
            other = max(0.0, (busy1 - self.busy0) - (own1 - self.own0)) / wall
        gpu = {f"{k}_before": v for k, v in self.gpu_before.items()}
        if self.device.type == "cuda":
            gpu.update({f"{k}_after": v for k, v in _gpu_state(self.device).items()})
        return {"load_before": self.load_before, "load_after": os.getloadavg()[0], "other_cpu_cores": other,
                "cores": os.cpu_count() or 1, **gpu}


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
    load: dict = field(default_factory=dict)  # LoadProbe.stop() of the timed region
    unstable: bool = False
    unstable_reason: str = ""

    @property
    def iqr_ms(self) -> float:
        return self.q75_ms - self.q25_ms

    @property
    def repeats(self) -> int:
        return len(self.times_ms)

    @classmethod
    def from_times(cls, times_ms: list[float], device: str, warmup: int, load: dict | None = None,
                   max_iqr: float = MAX_IQR, busy_frac: float = BUSY_FRAC) -> LatencyResult:
        t = np.asarray(times_ms, dtype=float)
        q25, med, q75 = np.percentile(t, [25, 50, 75])
        res = cls(float(med), float(q25), float(q75), float(t.mean()), float(t.std()), [float(v) for v in t],
                  torch.get_num_threads(), device, warmup, dict(load or {}))
        reasons = []
        if med > 0 and (q75 - q25) / med > max_iqr:
            reasons.append(f"IQR/median {(q75 - q25) / med:.1%} > {max_iqr:.0%}")
        if load:
            cores, threads = load.get("cores", 1), 1 if device.startswith("cuda") else res.threads
            extra = max(load.get("load_before", 0.0), load.get("load_after", 0.0)) - threads
            if extra > busy_frac * cores:
                reasons.append(f"load average {extra + threads:.1f} on {cores} cores beyond our {threads} threads")
            other = load.get("other_cpu_cores")
            if other is not None and other > busy_frac * cores:
                reasons.append(f"other processes used {other:.1f} of {cores} cores")
            reasons += gpu_reasons(load)
        res.mark_unstable(*reasons)
        return res

    def mark_unstable(self, *reasons: str) -> None:
        for r in reasons:
            self.unstable = True
            self.unstable_reason = f"{self.unstable_reason}; {r}" if self.unstable_reason else r

    def guard_fields(self) -> dict:
        """The noise guard's verdict and the machine load around the timing, as result-row fields."""
        gpu = {k: self.load[k] for k in GPU_KEYS if k in self.load}
        return {"threads": self.threads, "repeats": self.repeats, "unstable": self.unstable,
                "unstable_reason": self.unstable_reason, **{k: self.load.get(k) for k in LOAD_KEYS}, **gpu}

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("times_ms")
        load = out.pop("load")
        return {**out, **load, "iqr_ms": self.iqr_ms, "repeats": self.repeats}


def check_consistency(fwd: LatencyResult, fwd_bwd: LatencyResult) -> None:
    """Mark both unstable when forward alone took longer than forward+backward: impossible on a quiet machine."""
    if fwd.median_ms > fwd_bwd.median_ms:
        why = f"forward {fwd.median_ms:.3g} ms slower than forward+backward {fwd_bwd.median_ms:.3g} ms"
        fwd.mark_unstable(why)
        fwd_bwd.mark_unstable(why)


def warn_unstable(label: str, res: LatencyResult, file=None) -> None:
    """One line on stderr saying why a timing is not to be trusted."""
    if res.unstable:
        print(f"warning: {label}: unstable timing, {res.median_ms:.3g} ms ({res.unstable_reason})",
              file=file or sys.stderr)


def check_timing(warmup, repeats, min_time_s, min_repeats, max_repeats) -> tuple[int, int, float]:
    """``(min_repeats, max_repeats, min_time_s)`` in effect (a fixed ``repeats`` sets all three).

    Raises:
        ValueError: ``warmup`` not an int >= 0, ``repeats`` (unless None) / ``min_repeats`` / ``max_repeats`` not an
            int >= 1, or ``min_time_s`` not a finite number >= 0.
    """
    check_positive_int("warmup", warmup, allow_zero=True)
    if repeats is not None:
        check_positive_int("repeats", repeats)
        return repeats, repeats, 0.0
    check_positive_int("min_repeats", min_repeats)
    check_positive_int("max_repeats", max_repeats)
    check_real("min_time_s", min_time_s, minimum=0.0)
    return min_repeats, max(max_repeats, min_repeats), float(min_time_s)


def measure_latency(fn: Callable[[], object], device: torch.device | str = "cpu", warmup: int = 10,
                    repeats: int | None = None, *, min_time_s: float = 1.0, min_repeats: int = 10,
                    max_repeats: int = 1000) -> LatencyResult:
    """Time ``fn()``: ``warmup`` untimed calls, then individually timed calls (milliseconds), a fixed ``repeats``
    of them or, by default, at least ``min_repeats`` and ``min_time_s`` seconds of timed work (at most
    ``max_repeats``). The result carries the noise guard's verdict.

    Raises:
        ValueError: ``warmup`` negative, ``repeats``/``min_repeats``/``max_repeats`` < 1 or ``min_time_s`` < 0.
        NonFiniteError: the last timed call returned a NaN or infinite tensor.
    """
    min_repeats, max_repeats, min_time_s = check_timing(warmup, repeats, min_time_s, min_repeats, max_repeats)
    device = torch.device(device)
    with SteadyHeap(device) as heap:  # on CPU: kept freed memory, settled after the warm-up, restored after
        for _ in range(warmup):
            fn()
        heap.settle()
        probe = LoadProbe().start(device)
        times: list[float] = []
        last = None  # the last call's result, checked after timing; released before each call

        def enough() -> bool:
            return len(times) >= max_repeats or (len(times) >= min_repeats and sum(times) >= 1e3 * min_time_s)

        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.synchronize()
                while not enough():
                    n = min(max(min_repeats, 1), max_repeats - len(times))
                    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                              for _ in range(n)]
                    for start, end in events:
                        last = None
                        start.record()
                        last = fn()
                        end.record()
                    torch.cuda.synchronize()  # once per batch, before reading: never time kernel launches
                    times += [start.elapsed_time(end) for start, end in events]
        else:
            while not enough():
                last = None
                t0 = time.perf_counter_ns()
                last = fn()
                times.append((time.perf_counter_ns() - t0) / 1e6)
        load = probe.stop()
        check_finite(last)
        return LatencyResult.from_times(times, str(device), warmup, load)


def measure_interleaved(fns: dict[str, Callable[[], object]], device: torch.device | str = "cpu", warmup: int = 1,
                        repeats: int | None = None, *, min_time_s: float = 1.0, min_repeats: int = 10,
                        max_repeats: int = 1000) -> tuple[dict[str, LatencyResult], dict[str, BaseException]]:
    """Time several callables in rounds (A B C … A B C …), so that drift in the machine's load hits all alike, until
    each has ``repeats`` calls or at least ``min_repeats`` calls and ``min_time_s`` seconds of timed work. One
    noise-guard probe covers the whole timing. Returns ``(results, failures)``: a callable that raises is dropped
    from later rounds and its exception returned (the caller decides whether it is an OOM row or a bug), and one
    whose last result is not finite is returned with a NonFiniteError."""
    min_repeats, max_repeats, min_time_s = check_timing(warmup, repeats, min_time_s, min_repeats, max_repeats)
    device = torch.device(device)
    with SteadyHeap(device) as heap:  # on CPU: kept freed memory, settled after the warm-up, restored after
        live, failures = dict(fns), {}
        times: dict[str, list[float]] = {k: [] for k in fns}
        last: dict[str, object] = {}  # each callable's last result, checked after timing

        def call(label: str, fn, timed: bool) -> None:
            last[label] = None
            try:
                if not timed:
                    last[label] = fn()
                elif device.type == "cuda":
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    last[label] = fn()
                    end.record()
                    torch.cuda.synchronize(device)
                    times[label].append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter_ns()
                    last[label] = fn()
                    times[label].append((time.perf_counter_ns() - t0) / 1e6)
            except Exception as exc:  # noqa: BLE001 - reported per case, the others go on
                failures[label] = exc
                del live[label]

        for _ in range(warmup):
            for label, fn in list(live.items()):
                call(label, fn, False)
        heap.settle()
        probe = LoadProbe().start(device)

        def done(label: str) -> bool:
            t = times[label]
            return len(t) >= max_repeats or (len(t) >= min_repeats and sum(t) >= 1e3 * min_time_s)

        # events are recorded on the current device's stream: make it the timed device (cuda:1 is not cuda:0)
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            while any(not done(k) for k in live):
                for label, fn in list(live.items()):
                    if not done(label):
                        call(label, fn, True)
        load = probe.stop()
        for label in list(live):
            try:
                check_finite(last.pop(label, None))
            except NonFiniteError as exc:
                failures[label] = exc
                del live[label]
        return {k: LatencyResult.from_times(times[k], str(device), warmup, load) for k in live}, failures


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
                          warmup: int = 10, repeats: int | None = None, **adaptive) -> LatencyResult:
    """Latency of one forward (``forward``) or forward+backward (``fwd_bwd``) of a built workload; ``adaptive``:
    ``min_time_s``, ``min_repeats``, ``max_repeats`` of ``measure_latency``."""
    return measure_latency(step_fn(workload, mode), device, warmup, repeats, **adaptive)
