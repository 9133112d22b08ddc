"""Measurement library: latency, peak memory, FLOPs (analytic + fvcore + FlopCounterMode) and parameter counts.

One function per measurement kind, the same inputs for every variant (conventions.md §1); separate passes for
latency, memory and FLOPs. ``python -m attention_zoo.measure.quick`` is a one-shot benchmark.
"""

from .flops import FlopReport, analytic_flops, count_flops, einsum_macs, flop_counter_count, fvcore_count
from .latency import LatencyResult, measure_latency, measure_model_latency, step_fn
from .memory import ForkServers, measure_memory, measure_memory_many, memory_item
from .params import count_params
from .status import free_memory, guarded, is_oom
from .workload import Workload, build_workload, workload_spec

__all__ = [
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
    "step_fn",
    "workload_spec",
]
