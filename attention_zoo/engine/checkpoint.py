"""Checkpoints that are never half-valid: a magic + length + SHA-256 header, written atomically.

File layout: ``MAGIC (8 bytes) | payload length (uint64 LE) | sha256(payload) (32 bytes) | payload``, where the
payload is a ``torch.save`` buffer. The file is written to a temp file, fsync'd and ``os.replace``d (io.py), so a
crash leaves the previous checkpoint intact; on load a short or altered file fails the length or hash check and
raises :class:`CheckpointError` instead of being half-read. Payloads load with ``weights_only=True``.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
import struct
import warnings
from pathlib import Path

import numpy as np
import torch

from ..io import atomic_write_bytes

MAGIC = b"AZCKPT\x00\x01"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sQ32s")
_STEP_RE = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint file that is truncated, corrupt, of another format or of an unknown version."""


def save_checkpoint(path: str | Path, state: dict) -> Path:
    buf = io.BytesIO()
    torch.save({**state, "format_version": FORMAT_VERSION}, buf)
    payload = buf.getvalue()
    header = _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest())
    return atomic_write_bytes(path, header + payload)


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Read and verify a checkpoint.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: the file is truncated, corrupt, not an attention_zoo checkpoint, or of another version.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint: {path} does not exist")
    data = path.read_bytes()
    if len(data) < _HEADER.size:
        raise CheckpointError(f"checkpoint: {path} is truncated ({len(data)} bytes, shorter than the header)")
    magic, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError(f"checkpoint: {path} is not an attention_zoo checkpoint (bad magic {magic!r})")
    payload = data[_HEADER.size:]
    if len(payload) != length:
        raise CheckpointError(f"checkpoint: {path} is truncated or padded: payload has {len(payload)} bytes, "
                              f"header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint: {path} is corrupt (SHA-256 of the payload does not match its header)")
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as exc:  # weights_only refusal (a non-tensor global), or an unreadable payload
        raise CheckpointError(f"checkpoint: {path} was refused by the weights_only loader ({exc})") from exc
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        version = state.get("format_version") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint: {path} has format_version {version!r}, this code reads {FORMAT_VERSION}")
    return state


class CheckpointManager:
    """``<dir>/step_XXXXXXXX.pt`` (the last ``keep_last`` kept), ``best.pt`` and ``nan_step_XXXXXXXX.pt``."""

    def __init__(self, directory: str | Path, keep_last: int = 2):
        self.dir = Path(directory)
        self.keep_last = keep_last

    def step_path(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}.pt"

    @property
    def best_path(self) -> Path:
        return self.dir / "best.pt"

    def step_checkpoints(self) -> list[tuple[int, Path]]:
        """Existing step checkpoints, newest first."""
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := _STEP_RE.match(p.name))]
        return sorted(found, reverse=True)

    def save(self, state: dict, step: int) -> Path:
        path = save_checkpoint(self.step_path(step), state)
        for _, old in self.step_checkpoints()[self.keep_last:]:
            old.unlink(missing_ok=True)
        return path

    def save_best(self, state: dict) -> Path:
        return save_checkpoint(self.best_path, state)

    def save_debug(self, state: dict, step: int) -> Path:
        return save_checkpoint(self.dir / f"nan_step_{step:08d}.pt", state)

    def resolve(self, resume: str | Path | None, map_location="cpu") -> tuple[Path | None, dict | None]:
        """``None`` -> fresh start; ``"auto"`` -> newest *valid* step checkpoint (one refused for any reason,
        weights_only refusal included, is skipped with a warning for the previous one; none at all -> fresh start);
        a path -> that checkpoint, which must exist and be valid.

        Raises:
            FileNotFoundError: an explicit path that does not exist (never a silent restart).
            CheckpointError: an explicit path that is corrupt.
        """
        if resume is None:
            return None, None
        if str(resume) != "auto":
            return Path(resume), load_checkpoint(resume, map_location)
        for _, path in self.step_checkpoints():
            try:
                return path, load_checkpoint(path, map_location)
            except Exception as exc:  # any refusal: fall back to the previous checkpoint rather than stop
                warnings.warn(f"resume: skipping unreadable checkpoint {path.name} ({exc}); trying the previous one",
                              RuntimeWarning, stacklevel=2)
        return None, None


def prune_checkpoints(run_dir: str | Path) -> None:
    """After a finished (stored) run: delete its checkpoints, except NaN debug ones (``nan_*``, evidence), and the
    checkpoint directory once empty."""
    ckpts = Path(run_dir) / "checkpoints"
    if not ckpts.is_dir():
        return
    for f in ckpts.glob("*.pt"):
        if not f.name.startswith("nan_"):
            f.unlink()
    if not any(ckpts.iterdir()):
        ckpts.rmdir()


def discard_run(run_dir: str | Path) -> None:
    """Before a cell is trained again from scratch (``--fresh``): delete its checkpoints (NaN debug ones stay, as
    evidence) and its metrics log, so nothing of an earlier training is resumed, loaded as best or plotted."""
    prune_checkpoints(run_dir)
    (Path(run_dir) / "metrics.jsonl").unlink(missing_ok=True)


def strip_prefixes(state_dict: dict) -> dict:
    """Drop the ``_orig_mod.`` (torch.compile) and ``module.`` (DDP) prefixes."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ("_orig_mod.", "module."):
            while k.startswith(prefix):
                k = k[len(prefix):]
        out[k] = v
    return out


def rng_state(device: torch.device | str | None = None) -> dict:
    """Python, NumPy, torch CPU and, on a CUDA run, the run's own device's RNG state (``device``; default: the
    current CUDA device when one is visible), in weights_only-loadable types. Only the run's own device: a resume on
    a machine with fewer GPUs, or on another index, restores it onto its own device."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    device = torch.device(device) if device is not None else None
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        state["cuda_own"] = torch.cuda.get_rng_state(device if device is not None else torch.cuda.current_device())
    return state


def set_rng_state(state: dict, device: torch.device | str | None = None) -> None:
    """Restore ``rng_state``'s states; the CUDA one onto ``device`` (default: the current CUDA device). States saved
    before, one per visible GPU, restore the first onto it."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    own = state.get("cuda_own", (state.get("cuda") or [None])[0])
    device = torch.device(device) if device is not None else None
    if own is not None and torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.set_rng_state(own.cpu(), device if device is not None else torch.cuda.current_device())
