"""Worker processes that never outlive the process that started them."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl():
    """libc's ``prctl`` (Linux), looked up once in the parent: a forked child must not dlopen (locks held by other
    threads at fork time are never released there)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux ``prctl``); exit now if the parent is
    already gone (``parent_pid`` is the pid it should have). Elsewhere a no-op: workers there end on EOF/shutdown."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def child_preexec():
    """``preexec_fn`` for ``subprocess``: the child (and the program it executes: the setting survives ``exec``)
    is killed when this process dies, so a ``kill -9`` of a harness leaves no script or measurement running. Call
    it from the thread that outlives the child (the kernel signals when the creating thread exits)."""
    _prctl()  # resolved here, in the parent
    return functools.partial(die_with_parent, os.getpid())


@contextlib.contextmanager
def terminate_as_interrupt():
    """Within the block, a SIGTERM to this process (``kill PID``, a scheduler's stop, ``timeout``) raises
    KeyboardInterrupt in the main thread, as a Ctrl-C does, so a run stops the way it stops on Ctrl-C: finished cells
    stored, running units checkpointed. A background job (``nohup … &``) inherits SIGINT ignored, so SIGTERM is the
    signal that stops it. The previous handler comes back on exit; outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
