"""Native CPU kernels, built from the C sources next to this file at first use and called through ctypes.

``library()`` returns the loaded kernels, or None where they cannot be had (no C compiler, a failed build,
``ATTENTION_ZOO_NATIVE=0``): every caller has an ATen path that gives the same values, and a build failure is one
warning. The build is ``cc -O3 -march=native -shared -fPIC`` with IEEE arithmetic (no fast-math), cached per source,
compiler and CPU (its feature flags) under ``$ATTENTION_ZOO_CACHE`` (default ``$XDG_CACHE_HOME/attention_zoo`` or
``~/.cache/attention_zoo``) in a directory only this user may write, so no one else's library is ever loaded.
The kernels spread their work over torch's own OpenMP thread team (``torch.get_num_threads()`` threads).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

SOURCES = ("compose.c",)
_lock = threading.Lock()
_state: dict = {}


def cache_dir() -> Path:
    base = os.environ.get("ATTENTION_ZOO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "attention_zoo")
    return Path(base) / "native"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def _private_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) or check that it is this user's and no one else may write it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(f"{path} is not a private directory of this user (owner {st.st_uid}, mode "
                      f"{stat.filemode(st.st_mode)})")


def _build() -> ctypes.CDLL:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler (cc or gcc) on PATH")
    here = Path(__file__).parent
    # -fopenmp: the kernels' parallel loops join the OpenMP runtime torch has loaded (libgomp.so.1, resolved by
    # soname to torch's copy), so they share its thread team instead of competing with its spinning threads.
    flags = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared"]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([*(here.joinpath(s).read_text() for s in SOURCES), version, _cpu_flags(),
                                    *flags]).encode()).hexdigest()[:20]
    out_dir = cache_dir()
    _private_dir(out_dir)
    lib = out_dir / f"attention_zoo_native-{key}.so"
    if not lib.is_file():
        fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so")
        os.close(fd)
        try:
            run = subprocess.run([cc, *flags, *(str(here / s) for s in SOURCES), "-o", tmp], capture_output=True,
                                 text=True)
            if run.returncode != 0:
                raise OSError(f"{cc} failed: {run.stderr.strip()[:400]}")
            os.replace(tmp, lib)  # atomic: concurrent builders each write their own temp file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return _declare(ctypes.CDLL(str(lib)))


class Layout(ctypes.Structure):
    _fields_ = [("sb", ctypes.c_long), ("sh", ctypes.c_long), ("st", ctypes.c_long)]


class Stage(ctypes.Structure):
    _fields_ = [("head", ctypes.c_int), ("m", ctypes.c_void_p), ("mb", ctypes.c_long), ("mt", ctypes.c_long),
                ("k1", ctypes.c_void_p), ("k2", ctypes.c_void_p), ("kdd", ctypes.c_void_p),
                ("kb", ctypes.c_long), ("kr", ctypes.c_long), ("kh", ctypes.c_long), ("db", ctypes.c_long),
                ("dh", ctypes.c_long)]


class Grads(ctypes.Structure):
    _fields_ = [("gm", ctypes.c_void_p), ("gmb", ctypes.c_long), ("gmt", ctypes.c_long), ("gm_shared", ctypes.c_int),
                ("gk1", ctypes.c_void_p), ("gk2", ctypes.c_void_p), ("gkd", ctypes.c_void_p), ("kts", ctypes.c_long),
                ("dts", ctypes.c_long)]


class Masks(ctypes.Structure):
    _fields_ = [("keep", ctypes.c_void_p), ("kb", ctypes.c_long), ("kt", ctypes.c_long), ("ks", ctypes.c_long),
                ("bias", ctypes.c_void_p), ("bb", ctypes.c_long), ("bh", ctypes.c_long), ("bt", ctypes.c_long),
                ("bs", ctypes.c_long)]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, lng = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    for suffix in ("f32", "f64"):
        fwd = getattr(lib, f"compose_forward_{suffix}")
        fwd.argtypes = [ctypes.POINTER(Stage), i, i, i, i, i, i, p, Layout, p, Layout]
        fwd.restype = None
        bwd = getattr(lib, f"compose_backward_{suffix}")
        bwd.argtypes = [ctypes.POINTER(Stage), i, i, i, i, i, i, p, Layout, p, Layout, p, Layout, p, lng, lng, i, p,
                        p, p, lng, lng]
        bwd.restype = None
        st, gr, mk = ctypes.POINTER(Stage), ctypes.POINTER(Grads), ctypes.POINTER(Masks)
        ffwd = getattr(lib, f"fused_forward_{suffix}")
        ffwd.argtypes = [st, st, i, i, i, i, i, i, i, p, Layout, mk, ctypes.c_double, p, Layout, p, Layout]
        ffwd.restype = None
        fbwd = getattr(lib, f"fused_backward_{suffix}")
        fbwd.argtypes = [st, st, gr, gr, i, i, i, i, i, i, i, p, Layout, p, Layout, p, Layout, p, Layout, p, Layout, p]
        fbwd.restype = None
    lib.compose_limits.argtypes = [ctypes.POINTER(i), ctypes.POINTER(i)]
    lib.compose_limits.restype = i
    heads, rank = i(), i()
    lib.chunk = lib.compose_limits(ctypes.byref(heads), ctypes.byref(rank))
    lib.max_heads, lib.max_rank = heads.value, rank.value
    return lib


def enabled() -> bool:
    return os.environ.get("ATTENTION_ZOO_NATIVE", "1") != "0"


def library() -> ctypes.CDLL | None:
    """The kernels, built and loaded once per process; None where they are unavailable or disabled."""
    if not enabled():
        return None
    with _lock:
        if "lib" not in _state:
            try:
                _state["lib"] = _build()
            except (OSError, subprocess.SubprocessError, AttributeError) as exc:
                warnings.warn(f"attention_zoo.native: native kernels unavailable, using the ATen path ({exc})",
                              RuntimeWarning, stacklevel=2)
                _state["lib"] = None
        return _state["lib"]


__all__ = ["Grads", "Layout", "Masks", "Stage", "cache_dir", "enabled", "library"]
