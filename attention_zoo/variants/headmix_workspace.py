"""Memory a head-mixed attention layer keeps between its steps on the CPU (THA, DCMHA: ``headmix``'s blocked core).

The blocked core works on blocks of query rows: every block allocates its temporaries (logits, mixed logits, mixed
weights; in backward their gradients) and the forward keeps each block's softmax output for the backward. With the
C library's default allocator, memory freed at the top of the heap is handed back to the kernel once it exceeds a
threshold, so in a user's training loop those blocks were new memory on every step, page-faulted in on first touch:
about 15,000 minor faults per THA layer step (B=4, T=512, D=256, H=8), and a step time that varied by a third
between identical runs. A ``Workspace`` lives as long as its module and holds that memory instead:

- *scratch*: a few block-sized buffers the core's temporaries are written into (``out=``), reused by every block
  of every call. A call takes them for its own duration; a second call while they are taken (another thread, a
  re-entrant call) computes with fresh memory instead, so nothing is ever shared between two live calls.
- *saved*: the packed [B,H,T,S] softmax outputs the forward keeps for the backward. A buffer is leased to the
  autograd graph that saved it and comes back to the pool only when that graph is freed (the lease is dropped with
  the graph's node), so a graph kept with ``retain_graph=True`` keeps its buffer, and a new forward meanwhile gets
  another. At most ``keep_saved`` free buffers are kept.

Values are unchanged: the same kernels write into kept memory instead of new memory. Copies of a module
(``copy.deepcopy``, pickling) get an empty workspace; a buffer of another device or dtype is replaced.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch import Tensor


class Workspace:
    """Scratch and saved-block buffers of one head-mixed attention module (module docstring)."""

    def __init__(self, keep_saved: int = 2):
        self.keep_saved = keep_saved
        self._lock = threading.Lock()
        self._scratch: dict[str, Tensor] = {}
        self._pool: list[Tensor] = []

    def __getstate__(self) -> dict:  # memory is not state: a copy starts empty
        return {"keep_saved": self.keep_saved}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["keep_saved"])

    def __deepcopy__(self, memo) -> Workspace:
        return Workspace(self.keep_saved)

    def clear(self) -> None:
        """Drop every kept buffer (one leased to a live graph goes back to a pool no longer used, then is freed)."""
        self._scratch, self._pool = {}, []

    @contextlib.contextmanager
    def scratch(self):
        """The scratch buffers for one call (a ``Scratch``), or None while another call holds them."""
        if not self._lock.acquire(blocking=False):
            yield None
            return
        try:
            yield Scratch(self._scratch)
        finally:
            self._lock.release()

    def saved(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Tensor, _Lease]:
        """A [B,H,T,S] buffer for the blocks one forward saves, and the lease that returns it to the pool when
        dropped (keep the lease with the autograd node that saved the blocks)."""
        for i, buf in enumerate(self._pool):
            if buf.shape == shape and buf.dtype == dtype and buf.device == device and not buf.is_inference():
                del self._pool[i]
                return buf, _Lease(self._pool, buf, self.keep_saved)
        buf = torch.empty(shape, dtype=dtype, device=device)
        return buf, _Lease(self._pool, buf, self.keep_saved)


def release_workspaces(model: torch.nn.Module) -> int:
    """Clear the workspace of every module of ``model`` that has one (a memory measurement does this after its
    warm-up, so that the kept memory is allocated, and counted, inside the measured step); returns how many."""
    found = [m.workspace for m in model.modules() if isinstance(getattr(m, "workspace", None), Workspace)]
    for ws in found:
        ws.clear()
    return len(found)


class Scratch:
    """Named flat buffers handed out as contiguous views of a block's shape (grown when a block needs more)."""

    def __init__(self, buffers: dict[str, Tensor]):
        self._buffers = buffers

    def __call__(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        n = 1
        for s in shape:
            n *= s
        buf = self._buffers.get(name)
        if (buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device
                or buf.is_inference() and not torch.is_inference_mode_enabled()):  # made under inference_mode
            buf = self._buffers[name] = torch.empty(n, dtype=like.dtype, device=like.device)
        return buf[:n].view(shape)


class _Lease:
    """Returns ``buf`` to ``pool`` when the holder (an autograd node's context) is freed."""

    __slots__ = ("_pool", "_buf", "_cap")

    def __init__(self, pool: list[Tensor], buf: Tensor, cap: int):
        self._pool, self._buf, self._cap = pool, buf, cap

    def __del__(self):
        if len(self._pool) < self._cap:
            self._pool.append(self._buf)


__all__ = ["Scratch", "Workspace", "release_workspaces"]
