"""Crash-safe file output: atomic replace for whole files, fsync'd appends for JSONL logs; ``read_only()``, under
which every write here raises (a ``--dry-run`` writes nothing, and the result store creates no folder or lock)."""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import tempfile
from pathlib import Path

_READ_ONLY = contextvars.ContextVar("attention_zoo_read_only", default=False)


@contextlib.contextmanager
def read_only():
    token = _READ_ONLY.set(True)
    try:
        yield
    finally:
        _READ_ONLY.reset(token)


def is_read_only() -> bool:
    return _READ_ONLY.get()


def _check_writable(path) -> None:
    if _READ_ONLY.get():
        raise RuntimeError(f"read-only (--dry-run): would write {path}")


def _umask() -> int:
    try:  # Linux >= 4.7: read it without changing it (os.umask would, for a moment, in every thread)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(fd: int) -> None:
    """Give a ``mkstemp`` file (always 0600) the mode a new file gets from ``open()``: 0666 minus the umask."""
    os.fchmod(fd, 0o666 & ~_umask())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write to a temp file in the same directory, fsync, then os.replace onto ``path``. The file gets the mode a
    new file gets from ``open()`` (0666 minus the umask)."""
    path = Path(path)
    _check_writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            apply_umask(f.fileno())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_csv(df, path: str | os.PathLike) -> Path:
    """A pandas DataFrame as CSV, full precision, written atomically."""
    return atomic_write_text(path, df.to_csv(index=False, float_format="%.10g"))


def atomic_savefig(fig, path: str | os.PathLike, **kwargs) -> Path:
    import io

    buf = io.BytesIO()
    fmt = Path(path).suffix.lstrip(".") or "png"
    fig.savefig(buf, format=fmt, bbox_inches="tight", **kwargs)
    return atomic_write_bytes(path, buf.getvalue())


def append_jsonl(path: str | os.PathLike, obj) -> None:
    """Append one JSON object as a line, flushed and fsync'd (the raw log survives a crash)."""
    path = Path(path)
    _check_writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All complete records; a torn last line (crash mid-write) is ignored. For logs that must not lose or hide
    anything (the result store), use ``scan_jsonl``."""
    return [obj for _, obj in scan_jsonl(path)[0]]


def scan_jsonl(path: str | os.PathLike) -> tuple[list[tuple[int, dict]], list[tuple[int, str]]]:
    """``(good, bad)``: ``(line number, object)`` of every JSON object line, and ``(line number, text)`` of every
    line that is not one (NUL bytes, garbage, a torn record). Blank lines are neither."""
    path = Path(path)
    if not path.exists():
        return [], []
    good, bad = [], []
    for no, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            good.append((no, obj))
        else:
            bad.append((no, text))
    return good, bad


def repair_tail(path: str | os.PathLike) -> bool:
    """Make the next append start on a line of its own: a torn last line (no trailing newline) or trailing NUL
    bytes (a crash on some file systems) are cut off or terminated. Returns True when the file was changed."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return False
    data = path.read_bytes()
    fixed = data.rstrip(b"\x00")
    if fixed and not fixed.endswith(b"\n"):
        fixed += b"\n"  # keep the torn text on its own line: scan_jsonl reports it instead of gluing to it
    if fixed == data:
        return False
    atomic_write_bytes(path, fixed)
    return True
