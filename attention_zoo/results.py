"""Result cells: an append-only JSONL store that lets reruns skip finished cells.

A *cell* is one unit of work (e.g. variant × setting × seed) described by a dict. Its rows are written
in a single fsync'd JSONL line, so a cell is either fully recorded or absent after a crash.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .io import append_jsonl, read_jsonl

STATUSES = ("ok", "oom", "unsupported", "nan", "error")


def cell_id(cell: dict) -> str:
    return json.dumps(cell, sort_keys=True, default=str)


class ResultStore:
    """``<out_dir>/<name>.jsonl`` holding one record ``{"cell_id", "cell", "rows"}`` per finished cell."""

    def __init__(self, out_dir: str | Path, name: str):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / f"{name}.jsonl"
        self._records = read_jsonl(self.path)
        self._done = {r["cell_id"] for r in self._records}

    def is_done(self, cell: dict) -> bool:
        return cell_id(cell) in self._done

    def add(self, cell: dict, rows: list[dict]) -> None:
        for row in rows:
            status = row.get("status", "ok")
            if status not in STATUSES:
                raise ValueError(f"rows: status must be one of {STATUSES}, got {status!r}")
        rec = {"cell_id": cell_id(cell), "cell": cell, "rows": rows}
        append_jsonl(self.path, rec)
        self._records.append(rec)
        self._done.add(rec["cell_id"])

    def records(self) -> list[dict]:
        return list(self._records)

    def frame(self) -> pd.DataFrame:
        """Long format: one row per recorded row, with the cell's fields as columns (row fields win)."""
        flat = [{**rec["cell"], **row} for rec in self._records for row in rec["rows"]]
        df = pd.DataFrame(flat)
        if not df.empty and "status" not in df:
            df["status"] = "ok"
        return df
