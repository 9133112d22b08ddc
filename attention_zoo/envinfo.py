"""The environment record every results file carries, and the fingerprint that keys result cells."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from .workers import child_preexec


def _git(*args: str, root: Path | None = None) -> str:
    try:
        root = root or Path(__file__).resolve().parent.parent
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                              preexec_fn=child_preexec()).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def tree_dirty(root: Path | None = None) -> bool:
    """Tracked files changed since the commit, outside results/: that folder holds the runs' own outputs, which a
    run writes while it runs, so only a change to the code makes a record dirty."""
    return bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results", root=root))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def huge_pages() -> bool | None:
    """Whether this process's large CPU tensors sit on transparent huge pages (``THP_MEM_ALLOC_ENABLE=1``, which the
    user or a ``reproduce/*.py`` script sets, or the kernel's ``always`` mode): an 8 MiB
    tensor is touched and /proc/self/smaps is asked for the huge pages of its mapping. None off Linux."""
    t = torch.ones(1 << 21)  # 8 MiB of fp32, every page touched
    ptr = t.data_ptr()
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split(maxsplit=1)[0] if line.strip() else ""
        if "-" in head and not head.endswith(":"):  # a mapping's header: "lo-hi perms offset ..."
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= ptr < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) > 0
    return None


# glibc mallopt parameters (malloc.h) and the defaults a scoped setting restores: M_MMAP_MAX 65536, M_TRIM_THRESHOLD
# 128 KiB. Any mallopt call also ends glibc's dynamic mmap threshold (it stays at the last value it reached).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_MMAP_MAX, _DEFAULT_TRIM_THRESHOLD = 65536, 128 * 1024
_retained: list[bool] = []  # whether the last timing kept freed memory (empty: no timing yet)
_depth = [0]  # SteadyHeap scopes open in this process: the outermost applies and restores


def _glibc():
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def retain_wanted() -> bool | None:
    """Whether timing would keep freed memory (``SteadyHeap``): False where opted out
    (``ATTENTION_ZOO_MALLOC_RETAIN=0``), None where the C library is not glibc. Changes nothing."""
    if os.environ.get("ATTENTION_ZOO_MALLOC_RETAIN", "1") == "0":
        return False
    return None if _glibc() is None else True


def retain_freed_memory() -> bool | None:
    """Keep freed CPU memory in this process for reuse, as a GPU's caching allocator does (glibc malloc: no ``mmap``
    for large blocks, no trimming), so that a buffer made afresh each step (DAMCHA's 134 MB generator-weight
    gradient at D = 256) reuses pages the process already holds instead of faulting new ones in. On a virtual
    machine a first touch of pages can cost many times a rewrite of held ones, and that cost falls on the variants
    that allocate the most per step. Values are unchanged. Used only inside ``SteadyHeap``, which restores glibc's
    defaults on exit (``restore_malloc_defaults``); peak memory is measured in fresh child processes that keep the
    default. Returns True where applied, False where opted out or refused, None where the C library is not glibc."""
    wanted = retain_wanted()
    if not wanted:
        ok = wanted
    else:
        libc = _glibc()
        ok = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    _retained[:] = [] if ok is None else [ok]
    return ok


def restore_malloc_defaults() -> None:
    """glibc's default ``mallopt`` settings again, and the kept memory (the timing's pad included) handed back to
    the kernel (``malloc_trim``). Nothing where the C library is not glibc."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
        libc.malloc_trim(0)


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


class SteadyHeap:
    """A scope in which a process keeps freed memory (``retain_freed_memory``) and has a steady footprint for timing.

    Kept memory is reused, but where freed blocks are fragmented a step that needs a larger one grows the heap, and
    the new pages are faulted in during that step, which then stands out from the other rounds.
    Entered before the warm-up (on CPU it asks for kept memory), ``settle()`` after it: one block as large as the
    warm-up's growth (at least 256 MiB, at most 1 GiB and an eighth of the available memory) is touched and freed, so
    that it stays resident at the top of the heap and later growth is served from it. On exit glibc's defaults are
    restored and the kept memory trimmed (``restore_malloc_defaults``): the caller's process is left as it was found.
    Nothing happens on other devices or where memory is not kept."""

    def __init__(self, device: torch.device | str):
        self.cpu = torch.device(device).type == "cpu"
        self.rss = None

    def __enter__(self) -> SteadyHeap:
        if self.cpu:
            _depth[0] += 1
            if _depth[0] == 1:
                retain_freed_memory()
        self.rss = _resident_bytes()
        return self

    def __exit__(self, *exc) -> None:
        if self.cpu:
            _depth[0] -= 1
            if _depth[0] == 0 and malloc_retained():
                restore_malloc_defaults()

    def settle(self) -> int:
        """Touch and free the pad; returns its size in bytes (0 where nothing was done)."""
        now, avail = _resident_bytes(), _available_bytes()
        if not self.cpu or not malloc_retained() or now is None or self.rss is None or avail is None:
            return 0
        size = int(min(max(now - self.rss, 256 << 20), 1 << 30, avail // 8))
        pad = torch.empty(size, dtype=torch.uint8)
        pad.fill_(0)  # every page touched: resident from now on
        del pad
        return size


def malloc_retained() -> bool | None:
    """Whether this process's last timing kept freed CPU memory (``retain_freed_memory``); None before any."""
    return _retained[0] if _retained else None


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def fingerprint(device: torch.device | str = "cpu", dtype: torch.dtype | str = "float32") -> dict:
    """The parts of the environment that can change a measured number: device kind and model, torch version,
    CPU threads and dtype; on CUDA also the TF32 flags and the enabled SDPA backends. Part of every result cell's
    identity (``ResultStore`` context)."""
    device = torch.device(device)
    out = {"device": device.type, "device_name": device_name(device), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "dtype": str(dtype).replace("torch.", "")}
    if device.type == "cuda":  # numerics a CUDA run can differ in (CPU cells' identity stays as it was)
        b = torch.backends
        out.update(tf32_matmul=b.cuda.matmul.allow_tf32, tf32_cudnn=b.cudnn.allow_tf32,
                   sdpa_backends=",".join(k for k, on in (("flash", b.cuda.flash_sdp_enabled()),
                                                          ("mem_efficient", b.cuda.mem_efficient_sdp_enabled()),
                                                          ("cudnn", b.cuda.cudnn_sdp_enabled()),
                                                          ("math", b.cuda.math_sdp_enabled())) if on))
    return out


REPO_ROOT = Path(__file__).resolve().parents[1]


def portable_command(argv: list[str]) -> str:
    """The command line with paths under the repository root written relative to it (records name no absolute
    path of the machine that ran them)."""
    out = []
    for a in argv:
        p = Path(a)
        if p.is_absolute() and p.is_relative_to(REPO_ROOT):
            a = str(p.relative_to(REPO_ROOT))
        out.append(a)
    return " ".join(out)


def environment_record(device: torch.device | str = "cpu", **extra) -> dict:
    """Versions, device, thread counts, numerics flags, git revision, time and command line."""
    device = torch.device(device)
    rec = {
        "time_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_commit": _git("rev-parse", "HEAD") or "unknown",
        "git_dirty": tree_dirty(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(device),
        "device_name": device_name(device),
        "cpu_model": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "thp_mem_alloc_enable": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "cpu_huge_pages": huge_pages(),
        "cpu_malloc_retained": malloc_retained(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "command": portable_command(sys.argv),
        "host": platform.node(),
        "pid": os.getpid(),
    }
    rec.update(extra)
    return rec


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available else cpu; ``cpu``, ``cuda`` and ``cuda:N`` only where they exist.

    Raises:
        ValueError: another name (``tpu``, ``mps``, ``cuda:x``), or a GPU that this machine does not have (the
            message names the device asked for).
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    index = device.partition(":")[2]
    if device not in ("cpu", "cuda") and not (device.startswith("cuda:") and index.isdigit()):
        raise ValueError(f"device: expected auto, cpu, cuda or cuda:N, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but this machine has no usable CUDA GPU "
                         "(torch.cuda.is_available() is False)")
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"device: {device!r} requested but this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return torch.device(device)


def setup_threads(threads: int | None) -> int:
    """Pin torch's CPU threads (``None``: keep torch's choice); returns the count in force.

    Raises:
        ValueError: ``threads`` < 1.
    """
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads: expected a positive int, got {threads!r}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def set_seed(seed: int) -> int:
    """Seed python, numpy and torch (CUDA included); validates the uint32 range and returns the seed."""
    import random

    import numpy as np

    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed: expected an int in [0, 2**32), got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return seed
