"""Result cells: an append-only JSONL store keyed by provenance, safe against crashes and concurrent writers.

A *cell* is one unit of work (e.g. variant × setting × seed) described by a dict. A store is opened with a
*context*: everything about the run that can change a cell's numbers besides the cell itself (resolved options,
preset fields, device model, torch version, threads, dtype; see ``experiments.common.run_context``). A cell's id
hashes cell and context together, so a cell measured elsewhere or with other settings is never counted as done
and never reported as this run's result.

File ``<out>/<name>.jsonl`` holds two kinds of lines, each one fsync'd JSON object:
- ``{"kind": "run", "run_id", "env", "context", "context_id"}``: who measured (written once per run, before its
  first cell);
- ``{"kind": "cell", "cell_id", "context_id", "run_id", "cell", "rows"}``: one finished cell, all its rows.
Every read or append happens under an ``fcntl`` lock on ``.<name>.lock``; a worker claims a cell (a file in
``.<name>.claims/``) before computing it, so two processes on one ``--out`` never run the same cell twice.
Malformed lines are moved to ``<name>.jsonl.corrupt`` with their line numbers and reported, never dropped
silently; on read, duplicate cell ids collapse to the newest record.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pandas as pd

from .io import append_jsonl, atomic_write_text, is_read_only, repair_tail, scan_jsonl

STATUSES = ("ok", "oom", "unsupported", "nan", "error")
REQUIRED = {"cell": ("cell_id", "cell", "rows", "context_id", "run_id"), "run": ("run_id", "env", "context_id")}


def digest(obj) -> str:
    """A short stable hash of a JSON-able object (key order does not matter)."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def cell_id(cell: dict, context: dict | None = None) -> str:
    return digest({"cell": cell, "context": context or {}})


def ensure_out_dir(out: str | os.PathLike, arg: str = "out") -> Path:
    """``out`` as a writable directory (created if missing), checked before any computation.

    Raises:
        ValueError: ``out`` exists and is not a directory, cannot be created, or is not writable (the message
            starts with ``arg``).
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{arg}: {str(path)!r} exists and is not a directory")
    if is_read_only():  # a dry run: the folder is neither created nor probed
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(path / f".write-test-{os.getpid()}", "w") as f:
            f.write("")
        os.unlink(path / f".write-test-{os.getpid()}")
    except OSError as e:
        raise ValueError(f"{arg}: {str(path)!r} is not a writable directory ({e.strerror or e})") from None
    return path


def ensure_out_file(path: str | os.PathLike, arg: str, *, figure: bool = False) -> Path:
    """An output file that can be written (its directory created if missing), checked before any computation, as
    ``ensure_out_dir`` checks ``--out``. ``figure``: its suffix must also be an image format matplotlib writes.

    Raises:
        ValueError: ``path`` is a directory, its directory cannot be created or written, or (``figure``) its
            suffix is not a format matplotlib can save (the message starts with ``arg``).
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{arg}: {str(path)!r} is a directory, expected a file name")
    try:
        ensure_out_dir(path.parent, arg)
    except ValueError as exc:
        raise ValueError(f"{arg}: cannot write {str(path)!r}: {str(exc).split(': ', 1)[1]}") from None
    if figure:
        from matplotlib.figure import Figure

        formats = Figure().canvas.get_supported_filetypes()
        fmt = path.suffix.lstrip(".").lower() or "png"  # no suffix: atomic_savefig writes PNG
        if fmt not in formats:
            raise ValueError(f"{arg}: {str(path)!r} has no image suffix matplotlib writes (expected one of "
                             f"{', '.join('.' + f for f in sorted(formats))})")
    return path


def _valid(rec: dict) -> bool:
    if "kind" not in rec and {"cell_id", "cell", "rows"} <= set(rec):  # written before provenance: never matches
        rec.update(kind="cell", context_id="legacy", run_id="legacy")
    kind = rec.get("kind")
    if kind not in REQUIRED or any(k not in rec for k in REQUIRED[kind]):
        return False
    return kind != "cell" or (isinstance(rec["cell"], dict) and isinstance(rec["rows"], list)
                               and all(isinstance(r, dict) for r in rec["rows"]))


def _proc_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(claim: dict) -> bool:
    """Whether the process that wrote a claim still runs (a claim from another host counts as alive)."""
    if claim.get("host") != socket.gethostname():
        return True
    pid = int(claim.get("pid", -1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    start = _proc_start(pid)
    return start is None or claim.get("start") in (None, start)


class ResultStore:
    """``<out_dir>/<name>.jsonl``: finished cells of every run, read through this run's ``context``.

    ``fresh=True`` counts only this run's own records as done (everything is recomputed; newer records win).
    ``env`` is this run's environment record (``envinfo.environment_record``), written once with its first cell.
    """

    def __init__(self, out_dir: str | os.PathLike, name: str, context: dict | None = None, *, fresh: bool = False,
                 env: dict | None = None):
        self.out_dir = ensure_out_dir(out_dir)
        self.name = name
        self.path = self.out_dir / f"{name}.jsonl"
        self.corrupt_path = self.out_dir / f"{name}.jsonl.corrupt"
        self._lock_path = self.out_dir / f".{name}.lock"
        self._claims = self.out_dir / f".{name}.claims"
        self.context = json.loads(json.dumps(context or {}, sort_keys=True, default=str))
        self.context_id = digest(self.context)
        self.fresh = fresh
        self.env = dict(env or {})
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        self._run_written = False
        self._claimed: set[str] = set()
        self.moved: list[int] = []  # line numbers moved to the .corrupt file by this process
        with self._locked():
            self._load()

    # ---- file access ----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self):
        if is_read_only():  # a dry run only reads: no lock file, no repair
            yield
            return
        with open(self._lock_path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _load(self) -> None:
        """(Under the lock.) Repair a torn tail, move malformed lines aside, index cells and runs."""
        if not is_read_only():
            repair_tail(self.path)
        good, bad = scan_jsonl(self.path)
        records = [(no, rec) for no, rec in good if _valid(rec)]  # a JSON object without its keys is bad too
        invalid = [(no, rec) for no, rec in good if not _valid(rec)]
        moved = sorted(bad + [(no, json.dumps(rec, sort_keys=True)) for no, rec in invalid])
        if moved and not is_read_only():
            for no, text in moved:
                append_jsonl(self.corrupt_path, {"line": no, "text": text, "moved_utc": time.strftime("%FT%TZ",
                                                                                                    time.gmtime())})
            atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True, default=str) + "\n"
                                                 for _, r in records))
            self.moved += [no for no, _ in moved]
            print(f"results: {len(moved)} malformed line(s) in {self.path} (line {', '.join(str(n) for n, _ in moved)})"
                  f" moved to {self.corrupt_path}", file=sys.stderr)
        self._cells: dict[str, dict] = {}
        self._runs: dict[str, dict] = {}
        for _, rec in records:
            if rec["kind"] == "run":
                self._runs[rec["run_id"]] = rec
            else:
                self._cells.pop(rec["cell_id"], None)  # duplicates collapse; the newest wins and goes last
                self._cells[rec["cell_id"]] = rec

    def refresh(self) -> None:
        """Re-read the file (other processes may have added cells)."""
        with self._locked():
            self._load()

    # ---- cells ----------------------------------------------------------------------------------------------
    def key(self, cell: dict) -> str:
        return cell_id(cell, self.context)

    def is_done(self, cell: dict) -> bool:
        rec = self._cells.get(self.key(cell))
        return rec is not None and (not self.fresh or rec["run_id"] == self.run_id)

    def pending(self, cells: list[dict]) -> list[dict]:
        return [c for c in cells if not self.is_done(c)]

    def claim(self, cell: dict) -> bool:
        """True if this process may compute ``cell`` now: not done (re-read under the lock) and not being
        computed by another live process. Pair with ``add`` (or ``release`` on failure)."""
        cid = self.key(cell)
        with self._locked():
            self._load()
            if self.is_done(cell):
                return False
            path = self._claims / cid
            if path.exists():
                try:
                    holder = json.loads(path.read_text() or "{}")
                except (OSError, json.JSONDecodeError):
                    holder = {}
                if holder.get("pid") != os.getpid() and holder and _alive(holder):
                    return False
            self._claims.mkdir(exist_ok=True)
            atomic_write_text(path, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                "start": _proc_start(os.getpid()), "run_id": self.run_id}))
            self._claimed.add(cid)
            return True

    def release(self, cell: dict) -> None:
        cid = self.key(cell)
        if cid in self._claimed:
            with contextlib.suppress(FileNotFoundError):
                (self._claims / cid).unlink()
            self._claimed.discard(cid)

    def add(self, cell: dict, rows: list[dict]) -> None:
        for row in rows:
            status = row.get("status", "ok")
            if status not in STATUSES:
                raise ValueError(f"rows: status must be one of {STATUSES}, got {status!r}")
        rec = {"kind": "cell", "cell_id": self.key(cell), "context_id": self.context_id, "run_id": self.run_id,
               "cell": cell, "rows": rows}
        with self._locked():
            repair_tail(self.path)
            if not self._run_written:
                run = {"kind": "run", "run_id": self.run_id, "env": self.env, "context": self.context,
                       "context_id": self.context_id}
                append_jsonl(self.path, run)
                self._runs[self.run_id] = run
                self._run_written = True
            append_jsonl(self.path, rec)
        self._cells.pop(rec["cell_id"], None)
        self._cells[rec["cell_id"]] = json.loads(json.dumps(rec, sort_keys=True, default=str))
        self.release(cell)

    def record(self, cell: dict) -> dict | None:
        """This context's record of ``cell`` (None if not done)."""
        return self._cells.get(self.key(cell))

    def records(self, cells: list[dict] | None = None, every_context: bool = False) -> list[dict]:
        """This context's cell records (one per cell id, newest), restricted to ``cells`` when given; without
        ``cells``, every cell of the context in the file as it is now (re-read: other runs on this ``--out`` may
        have added cells since this one opened it), which is what reports are built from.
        ``every_context``: the records of every run, for readers of another script's results."""
        if cells is not None:
            return [r for r in (self._cells.get(self.key(c)) for c in cells) if r is not None]
        self.refresh()
        return [r for r in self._cells.values() if every_context or r["context_id"] == self.context_id]

    def frame(self, cells: list[dict] | None = None, every_context: bool = False) -> pd.DataFrame:
        """Long format: one row per recorded row of this context's cells (see ``records``: a report passes no
        ``cells``, so it shows the whole store of its context), the cell's fields as columns (row fields win) and
        ``run_id`` naming the run that measured it."""
        flat = [{**rec["cell"], **row, "run_id": rec["run_id"]} for rec in self.records(cells, every_context)
                for row in rec["rows"]]
        df = pd.DataFrame(flat)
        if not df.empty and "status" not in df:
            df["status"] = "ok"
        return df

    def runs(self, df: pd.DataFrame | None = None) -> list[dict]:
        """The environment records of the runs that measured the rows of ``df`` (default: this context)."""
        ids = set(df["run_id"]) if df is not None and "run_id" in df else {r["run_id"] for r in self.records()}
        return [{"run_id": rid, **self._runs[rid]["env"]} for rid in sorted(ids) if rid in self._runs]

    def environment(self, env: dict, df: pd.DataFrame | None = None) -> dict:
        """``env`` (this run) plus ``runs``: every run that contributed rows to the report."""
        return {**env, "run_id": self.run_id, "context": self.context, "runs": self.runs(df)}


def read_records(path: str | os.PathLike) -> list[dict]:
    """The cell records of a store file (every context; one per cell id, the newest), read without writing anything
    next to it: no lock file, no repair (a torn last line is skipped). For readers of another script's results,
    whose folder is an input."""
    cells: dict[str, dict] = {}
    for _, rec in scan_jsonl(path)[0]:
        if _valid(rec) and rec["kind"] != "run":
            cells.pop(rec["cell_id"], None)  # the newest goes last, as in ResultStore
            cells[rec["cell_id"]] = rec
    return list(cells.values())


__all__ = ["STATUSES", "ResultStore", "cell_id", "digest", "ensure_out_dir", "ensure_out_file", "read_records"]
