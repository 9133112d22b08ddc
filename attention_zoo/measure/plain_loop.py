"""The speed a user gets in their own training loop, measured beside the benchmark's own timing setting.

The benchmark times a forward+backward step under its timing setting (on CPU: freed memory kept by the C library
and a settled heap, ``envinfo``), which removes noise but is not what a user's program does. Here every case runs
as a user writes it — ``torch.optim.AdamW``, ``opt.zero_grad(set_to_none=True)``, forward, loss, backward,
``opt.step()`` — in a fresh child process with the C library's default allocator settings and without this
package's environment variables (``ATTENTION_ZOO_*``, ``THP_MEM_ALLOC_ENABLE``, ``MALLOC_*``), timed in
interleaved rounds (A B C … A B C …) with the wall clock (CUDA: synchronised). Two times per step: the
forward+backward (``zero_grad``, forward, loss, backward: what the fwd+bwd targets compare, now under a user's
allocation pattern) and the whole step with the optimizer (a variant with more parameters pays for them there:
AdamW reads and writes four tensors of every parameter's size). Rows: median, q25, q75 (ms) of each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

from .workload import build_workload

# The environment a plain user loop runs in: none of these.
CLEARED = ("ATTENTION_ZOO_", "THP_MEM_ALLOC_ENABLE", "MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD")


def plain_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the same package as this process
    return env


def plain_loop_times(specs: dict[str, dict], device: torch.device | str, warmup: int = 2, rounds: int = 9,
                     threads: int | None = None, timeout_s: float = 3600.0) -> dict[str, dict]:
    """{label: {"status", "median_ms", "q25_ms", "q75_ms", "iqr_ms" (forward+backward), "step_median_ms",
    "step_iqr_ms" (the whole step with AdamW), "message"}} of a plain AdamW training step of each workload spec,
    timed in a fresh child process (module docstring)."""
    payload = {"specs": specs, "device": str(device), "warmup": warmup, "rounds": rounds,
               "threads": threads or torch.get_num_threads()}
    proc = subprocess.run([sys.executable, "-m", "attention_zoo.measure.plain_loop"], input=json.dumps(payload),
                          capture_output=True, text=True, env=plain_env(), timeout=timeout_s)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {label: {"status": "error", "message": f"plain-loop child failed: {why}"} for label in specs}
    return json.loads(lines[-1])


def _child(payload: dict) -> dict[str, dict]:
    torch.set_num_threads(int(payload["threads"]))
    device = torch.device(payload["device"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    steps, out = {}, {}
    for label, spec in payload["specs"].items():
        try:
            wl = build_workload(spec, device)
            opt = torch.optim.AdamW(wl.model.parameters(), lr=1e-4)

            def step(wl=wl, opt=opt):
                opt.zero_grad(set_to_none=True)
                loss = wl.loss(wl.forward())
                loss.backward()
                sync()
                mid = time.perf_counter()
                opt.step()
                return loss, mid

            steps[label] = step
        except Exception as exc:  # a case that cannot be built is a row, not a crash
            out[label] = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in steps}
    for r in range(payload["warmup"] + payload["rounds"]):
        for label, step in list(steps.items()):
            try:
                sync()
                t0 = time.perf_counter()
                loss, mid = step()
                sync()
                t1 = time.perf_counter()
            except Exception as exc:  # OOM and the like: this case stops, the others go on
                out[label] = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
                steps.pop(label)
                continue
            if not torch.isfinite(loss).item():
                out[label] = {"status": "nan", "message": "non-finite loss"}
                steps.pop(label)
            elif r >= payload["warmup"]:
                times[label].append((1e3 * (mid - t0), 1e3 * (t1 - t0)))
    for label in steps:
        fb, whole = (np.percentile([t[i] for t in times[label]], [25, 50, 75]) for i in (0, 1))
        out[label] = {"status": "ok", "median_ms": float(fb[1]), "q25_ms": float(fb[0]), "q75_ms": float(fb[2]),
                      "iqr_ms": float(fb[2] - fb[0]), "step_median_ms": float(whole[1]),
                      "step_iqr_ms": float(whole[2] - whole[0]), "message": None}
    return out


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.stdin.read()))))
