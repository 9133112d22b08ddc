"""Measurement library: latency, peak memory, FLOPs (analytic + fvcore + FlopCounterMode) and parameter counts.

One function per measurement kind, the same inputs for every variant; separate passes for
latency, memory and FLOPs. ``python -m attention_zoo.measure.quick`` is a one-shot benchmark.
"""

from .flops import FlopReport, analytic_flops, count_flops, einsum_macs, flop_counter_count, fvcore_count
from .latency import (
    LOAD_KEYS,
    LatencyResult,
    check_consistency,
    measure_latency,
    measure_model_latency,
    step_fn,
    warn_unstable,
)
from .memory import ForkServers, measure_memory, measure_memory_many, memory_item
from .params import count_params
from .status import free_memory, guarded, is_oom
from .workload import Workload, build_workload, workload_spec

__all__ = [
    "LOAD_KEYS",
    "FlopReport",
    "ForkServers",
    "LatencyResult",
    "Workload",
    "analytic_flops",
    "build_workload",
    "count_flops",
    "count_params",
    "einsum_macs",
    "flop_counter_count",
    "free_memory",
    "fvcore_count",
    "guarded",
    "is_oom",
    "measure_latency",
    "measure_memory",
    "measure_memory_many",
    "measure_model_latency",
    "memory_item",
    "check_consistency",
    "step_fn",
    "warn_unstable",
    "workload_spec",
]
