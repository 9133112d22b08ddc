"""Peak memory of one step, in MiB (2**20 bytes), docs/conventions.md §3.

Modes: ``forward`` (eval + inference_mode), ``fwd_bwd`` (train mode, forward + backward) and ``train``
(forward + backward + one AdamW step).

CUDA, in this process: warm up, drop gradients, ``gc``/``empty_cache``, ``reset_peak_memory_stats``; the baseline
is ``memory_allocated()`` with the model, its inputs and (``optimizer_in_region=False``) the optimizer state
already allocated. ``peak_alloc_mib = max_memory_allocated − baseline``; ``peak_reserved_mib`` is the same
increment for ``max_memory_reserved`` (the caching allocator's segments; it excludes the CUDA context).
With ``optimizer_in_region=True`` (the default, as the DAMCHA authors' profiler) AdamW is created inside the
region, so its state (2 × parameters) is counted together with the gradients.

Memory a module keeps between its steps (the head-mixed cores' workspaces) is dropped after the warm-up, so the
measured step allocates it again and counts it.

CPU, in a fresh process per measurement: build, warm up, ``malloc_trim``, read ``VmRSS`` (baseline), write 5 to
``/proc/self/clear_refs`` (resets the high-water mark), run the step, read ``VmHWM``; ``peak_rss_mib = VmHWM −
baseline``. glibc's mmap threshold is pinned so freed large tensors go back to the OS. RSS includes allocator
caching and fragmentation and is not comparable with the CUDA numbers. The fresh process is either a new
interpreter per measurement (``isolation="subprocess"``: ``python -c "from attention_zoo.measure.memory import
main; main()" ITEM_JSON``) or a child forked by a fork server, an interpreter that has imported torch but never
run an op (``isolation="forkserver"``: the same fresh heap without the interpreter start-up; used by sweeps).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from .. import plugins
from ..checks import check_positive_int
from ..registry import get_attention_spec
from ..variants.headmix_workspace import release_workspaces
from ..workers import child_preexec, die_with_parent
from .latency import step_fn
from .status import check_finite, guarded, short_message
from .workload import build_workload, workload_spec

MIB = 2**20
MODES = ("forward", "fwd_bwd", "train")
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def memory_item(workload: dict, mode: str = "train", optimizer_in_region: bool = True, warmup: int = 1,
                threads: int | None = None) -> dict:
    """One measurement request (JSON-able): a workload spec plus the mode and its settings.

    Raises:
        ValueError: a bad spec or mode, ``optimizer_in_region`` not a bool ("no" is not False), ``warmup`` not an
            int >= 0 or ``threads`` neither None nor an int >= 1.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if not isinstance(optimizer_in_region, bool):
        raise ValueError(f"optimizer_in_region: expected a bool, got {optimizer_in_region!r}")
    check_positive_int("warmup", warmup, allow_zero=True)
    if threads is not None:
        check_positive_int("threads", threads)
    spec = workload_spec(**workload)
    item = {"workload": spec, "mode": mode, "optimizer_in_region": optimizer_in_region, "warmup": warmup,
            "threads": threads}
    module = get_attention_spec(spec["attention"]).cls.__module__
    if module.split(".")[0] != "attention_zoo":  # a user's registration: the fresh child process must import it too
        item["plugin"] = {"module": module, "file": getattr(sys.modules.get(module), "__file__", None),
                          "sys_path": [p for p in sys.path if isinstance(p, str)]}
    return item


def _import_plugin(plugin: dict | None) -> None:
    """In the child: import the module that registered the measured attention (``memory_item``), from the parent's
    ``sys.path``.

    Raises:
        ValueError: the module cannot be imported here (one defined in a script or notebook, ``__main__``, cannot).
    """
    if plugin is None:
        return
    module = plugin["module"]
    if module == "__main__":
        raise ValueError("attention: registered in __main__ (a script or notebook), which the memory-measuring "
                         "child process cannot import; register it in an importable module")
    if module in sys.modules:  # e.g. an --include'd plugin, which $ATTENTION_ZOO_INCLUDE loaded here
        return
    sys.path.extend(p for p in plugin["sys_path"] if p not in sys.path)
    file = plugin.get("file")
    try:
        if file and module == plugins.module_name(Path(file)):  # an --include'd file: imported from its path
            plugins.load_plugins([file])
        else:
            importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - reported as the row's reason
        raise ValueError(f"attention: the memory-measuring child process cannot import {module!r}, which "
                         f"registered it ({short_message(exc)})") from exc


class _Step:
    """The measured step of a mode; ``warm_up()`` runs it untimed and leaves no gradients behind."""

    def __init__(self, workload, mode: str, optimizer_in_region: bool):
        self.wl, self.mode, self.in_region = workload, mode, optimizer_in_region
        self.params = [p for p in workload.model.parameters() if p.requires_grad]
        self.opt = None
        self.fn = step_fn(workload, "forward" if mode == "forward" else "fwd_bwd")

    def warm_up(self, n: int) -> None:
        if self.mode == "train" and self.in_region and self.params:
            # AdamW's first step imports and initialises lazily: do that on a dummy tensor, outside the region
            dummy = torch.zeros(1, device=self.params[0].device, requires_grad=True)
            dummy.grad = torch.zeros_like(dummy)
            torch.optim.AdamW([dummy], lr=1e-4).step()
        if self.mode == "train" and not self.in_region:
            self.opt = torch.optim.AdamW(self.params, lr=1e-4)  # state exists before the baseline
        for _ in range(max(n, 1 if self.opt is not None else 0)):
            self.fn()
            if self.opt is not None:
                self.opt.step()
        self.wl.zero_grad()
        release_workspaces(self.wl.model)  # memory a module keeps between steps is allocated (counted) in the step

    def __call__(self):
        """The step; returns its output (forward) or loss, for ``check_finite`` after the peak is read."""
        if self.mode == "train" and self.opt is None:
            self.opt = torch.optim.AdamW(self.params, lr=1e-4)  # inside the region: state counted
        out = self.fn()
        if self.mode == "train":
            self.opt.step()
        return out


def _measure_cuda(item: dict, device: torch.device) -> dict:
    wl = build_workload(item["workload"], device)
    step = _Step(wl, item["mode"], item["optimizer_in_region"])
    step.warm_up(item["warmup"])
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base, base_res = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    result = step()
    torch.cuda.synchronize(device)
    check_finite(result)  # a NaN/inf step is a ``nan`` row (guarded), not a memory number
    out = {"peak_alloc_mib": (torch.cuda.max_memory_allocated(device) - base) / MIB,
           "peak_reserved_mib": (torch.cuda.max_memory_reserved(device) - base_res) / MIB,
           "baseline_alloc_mib": base / MIB}
    del step, wl, result
    return out


# ---- CPU: fresh process, VmRSS baseline, clear_refs, VmHWM -------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _measure_cpu_here(item: dict) -> dict:
    """Runs inside the fresh child process."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, 128 * 1024)  # fixed threshold: large frees are returned, not cached
    if item.get("threads"):
        torch.set_num_threads(int(item["threads"]))
    wl = build_workload(item["workload"], "cpu")
    step = _Step(wl, item["mode"], item["optimizer_in_region"])
    step.warm_up(item["warmup"])
    gc.collect()
    if libc is not None:
        libc.malloc_trim(0)
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
    result = step()
    hwm = _status_kib("VmHWM")
    check_finite(result)
    return {"peak_rss_mib": (hwm - base) / 1024, "baseline_rss_mib": base / 1024, "threads": torch.get_num_threads()}


def _child_result(item: dict) -> dict:
    try:
        _import_plugin(item.get("plugin"))
        return guarded(lambda: _measure_cpu_here(item), "cpu")
    except Exception as exc:  # noqa: BLE001 - reported to the parent as an error row
        return {"status": "error", "message": short_message(exc)}


def _killed(code: int | None, timeout: bool) -> dict:
    if timeout:
        return {"status": "error", "message": "timeout: the measuring process was killed"}
    if code in (-9, 137):  # SIGKILL: the kernel's OOM killer
        return {"status": "oom", "message": f"the measuring process was killed (exit {code}; likely OOM killer)"}
    return {"status": "error", "message": f"the measuring process exited with {code} and no result"}


def _child_cmd(entry: str, *args: str) -> list[str]:
    return [sys.executable, "-c", f"from {__name__} import {entry}; {entry}()", *args]


def _run_subprocess(item: dict, timeout: float | None) -> dict:
    try:
        proc = subprocess.run(_child_cmd("main", json.dumps(item)), capture_output=True, text=True, timeout=timeout,
                              preexec_fn=child_preexec())  # a killed harness leaves no measurement running
    except subprocess.TimeoutExpired:
        return _killed(None, True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    res = _killed(proc.returncode, False)
    if proc.stderr.strip():
        res["message"] += ": " + proc.stderr.strip().splitlines()[-1][:300]
    return res


def serve() -> None:
    """Fork server: reads one ``memory_item`` JSON per stdin line, forks a child per item (a fresh heap: this
    process has imported torch and run no op bigger than one element), writes one result JSON line per item to
    stdout."""
    die_with_parent()  # a killed harness leaves no server behind (its children die with it in turn)
    dummy = torch.zeros(1, requires_grad=True)  # AdamW's lazy imports, paid once here instead of in every child
    dummy.grad = torch.zeros_like(dummy)
    torch.optim.AdamW([dummy], lr=1e-4).step()
    for line in sys.stdin:
        item = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: measure, report, exit without running the parent's cleanup
            try:
                die_with_parent()
                os.close(r)
                with os.fdopen(w, "w") as out:
                    out.write(json.dumps(_child_result(item)))
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as inp:
            data = inp.read()
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print(json.dumps(json.loads(data) if data else _killed(code, False)), flush=True)


class ForkServers:
    """``workers`` fork servers, kept alive across calls (a context manager); ``run(items)`` measures a list.

    A server killed by a timeout or by the OOM killer is replaced on the next call.
    """

    def __init__(self, workers: int = 1, timeout: float | None = 600.0):
        self.workers, self.timeout = max(1, int(workers)), timeout
        self.servers: list[subprocess.Popen] = []

    def __enter__(self) -> ForkServers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, n: int) -> None:
        self.servers = [s for s in self.servers if s.poll() is None]
        while len(self.servers) < n:
            self.servers.append(subprocess.Popen(_child_cmd("serve"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 text=True, start_new_session=True, preexec_fn=child_preexec()))

    def run(self, items: list[dict]) -> list[dict]:
        results: list[dict | None] = [None] * len(items)
        pending = list(enumerate(items))
        self._start(min(self.workers, len(items)))
        servers = list(self.servers)
        busy: dict[int, tuple[int, float]] = {}  # server index -> (item index, start time)
        with selectors.DefaultSelector() as sel:
            for k, srv in enumerate(servers):
                sel.register(srv.stdout, selectors.EVENT_READ, k)
            while pending or busy:
                for k, srv in enumerate(servers):
                    if k not in busy and pending and srv.poll() is None:
                        i, item = pending.pop(0)
                        srv.stdin.write(json.dumps(item) + "\n")
                        srv.stdin.flush()
                        busy[k] = (i, time.monotonic())
                if pending and not busy:
                    raise RuntimeError("memory: every fork server died")
                for key, _ in sel.select(timeout=1.0):
                    k = key.data
                    line = servers[k].stdout.readline()
                    if k in busy:
                        results[busy.pop(k)[0]] = json.loads(line) if line else _killed(servers[k].wait(), False)
                    if not line:
                        sel.unregister(servers[k].stdout)
                for k, (i, t0) in list(busy.items()):
                    if self.timeout is not None and time.monotonic() - t0 > self.timeout:
                        os.killpg(servers[k].pid, signal.SIGKILL)
                        servers[k].wait()
                        sel.unregister(servers[k].stdout)
                        results[i] = _killed(None, True)
                        del busy[k]
        return results

    def close(self) -> None:
        for srv in self.servers:
            if srv.poll() is None:
                srv.stdin.close()
                srv.wait(timeout=60)
        self.servers = []


# ---- public API ----------------------------------------------------------------------------------------------------
def _finish(item: dict, res: dict, device: torch.device) -> dict:
    return {"mode": item["mode"], "optimizer_in_region": item["optimizer_in_region"], "device": str(device), **res}


def measure_memory(workload: dict, device: torch.device | str = "cpu", mode: str = "train",
                   optimizer_in_region: bool = True, warmup: int = 1, isolation: str = "subprocess",
                   timeout: float | None = 600.0) -> dict:
    """Peak memory of one step of ``workload`` (a ``workload_spec`` dict).

    Returns ``{"status", "message", "mode", "optimizer_in_region", "device", ...}`` with ``peak_alloc_mib``,
    ``peak_reserved_mib`` (CUDA) or ``peak_rss_mib`` (CPU); ``status`` is ``oom`` (NaN-free, no numbers) when
    the step ran out of memory.
    """
    return measure_memory_many([memory_item(workload, mode, optimizer_in_region, warmup)], device, isolation,
                               timeout=timeout)[0]


def measure_memory_many(items: list[dict], device: torch.device | str = "cpu", isolation: str = "forkserver",
                        workers: int = 1, timeout: float | None = 600.0,
                        servers: ForkServers | None = None) -> list[dict]:
    """Measure several ``memory_item`` requests. CPU: one fresh process each (``workers`` at a time; pass a
    long-lived ``ForkServers`` to reuse its servers across calls); CUDA: in this process, one after the other."""
    device = torch.device(device)
    if isolation not in ("subprocess", "forkserver"):
        raise ValueError(f"isolation: expected 'subprocess' or 'forkserver', got {isolation!r}")
    if device.type == "cuda":
        return [_finish(it, guarded(lambda it=it: _measure_cuda(it, device), device), device) for it in items]
    if isolation == "subprocess":
        raw = [_run_subprocess(it, timeout) for it in items]
    elif servers is not None:
        raw = servers.run(items)
    else:
        with ForkServers(workers, timeout) as own:
            raw = own.run(items)
    return [_finish(it, r, device) for it, r in zip(items, raw)]


def main(argv: list[str] | None = None) -> int:
    """Child entry: ``python -c "from attention_zoo.measure.memory import main; main()" '<memory_item JSON>'``
    prints one JSON result line."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: ... main() '<memory_item JSON>'", file=sys.stderr)
        return 2
    print(json.dumps(_child_result(json.loads(argv[0]))), flush=True)
    return 0


__all__ = ["MODES", "ForkServers", "measure_memory", "measure_memory_many", "memory_item", "serve"]
