"""Behaviour fingerprints: what a section's code computes, recorded when its cells are made and recomputed at HEAD.

A *probe* runs one arm configuration of a section (its variant, flavour, options, model family and, for tuned
presets, its chosen setting) through the section's own code path at a tiny budget — its data pipeline, its model
builder, two optimizer steps of its training loop and its metric on a few samples — and *observes* it without
touching the code: global module hooks see the first top-level forward calls (their inputs: the data pipeline's
first batches; their outputs), a global optimizer hook sees the parameters after every step, and the rows the cell
returns give the losses and metrics (timings, memory and paths left out). Each observed tensor is kept as a small
digest (shape, dtype, sum, sum of |x|, sum of x², 16 evenly spaced values; integer tensors by a hash of their
bytes), so two fingerprints are compared with a tolerance instead of bit for bit: probes run on one CPU thread
(``torch.set_num_threads`` is held at 1 for their duration), and a difference counts when it exceeds
``RTOL`` = 1e-5 of the tensor's scale (its root mean square for single values, Σ|x| for the sums) or of a row's
value — BLAS kernels of another CPU move the last bits (≈ 1e-7 relative), a change of behaviour (an output scaled
by 1.001) moves them by 1e-4 and more. The families' probes live beside their experiments (``<family>/probe.py``);
``freshness`` decides with them whether a section whose code changed still computes what its store holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import math
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

RTOL = 1e-5  # a difference counts above this fraction of the observed tensor's (or row's) scale
SAMPLES = 16  # values kept per tensor, evenly spaced over its flattened elements
MAX_CALLS = 8  # top-level forward calls observed per probe (the first steps' and the first evaluation's)
VERSION = 1
SUFFIX = ".fingerprint.json"
# Row fields and metrics that measure the machine, not the computation: never part of a fingerprint.
MACHINE_WORDS = ("time", "per_s", "rss", "mib", "cpu_s", "wall", "seconds", "throughput", "_ms", "load")
MACHINE_UNITS = ("s", "ms", "tok/s", "img/s", "MiB", "samples/s", "GFLOP/s")


# ---- digests ---------------------------------------------------------------------------------------------------
def tensor_digest(t: torch.Tensor) -> dict:
    """A small, tolerance-comparable summary of a tensor (floats) or an exact hash of its bytes (integers, bools)."""
    t = t.detach()
    head = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
    if t.is_complex():
        t = torch.view_as_real(t)
    if not t.is_floating_point():
        data = t.cpu().contiguous().numpy().tobytes()
        return {**head, "sha": hashlib.sha256(data).hexdigest()[:16]}
    x = t.to(device="cpu", dtype=torch.float64).flatten()
    finite = torch.isfinite(x)
    y = torch.where(finite, x, torch.zeros_like(x))
    idx = torch.linspace(0, max(x.numel() - 1, 0), min(x.numel(), SAMPLES)).round().long()
    return {**head, "nonfinite": int((~finite).sum()), "sum": y.sum().item(), "abs": y.abs().sum().item(),
            "sq": (y * y).sum().item(), "at": [v if math.isfinite(v) else str(v) for v in x[idx].tolist()]}


def _tensors(obj, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors inside a forward's arguments or output (tuples, lists, dicts, dataclasses), with their paths."""
    if isinstance(obj, torch.Tensor):
        yield prefix or "0", obj
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from _tensors(obj[k], f"{prefix}.{k}" if prefix else str(k))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)


def machine_row(row: dict) -> bool:
    """A row that measures the machine (time, speed, memory): left out of fingerprints."""
    metric, unit = str(row.get("metric", "")).lower(), str(row.get("unit", ""))
    return unit in MACHINE_UNITS or any(w in metric for w in MACHINE_WORDS)


def rows_digest(rows: list[dict] | None) -> list[list]:
    """[name, value] of every number the rows hold that measures the computation (their values and numeric fields),
    the name made of the row's metric, its identifying text fields and the field; in a stable order."""
    out = []
    for r in rows or []:
        if machine_row(r):
            continue
        ident = {k: v for k, v in r.items() if k not in ("message", "run_id", "value") and isinstance(v, (str, bool))
                 and "/" not in str(v) and "\\" not in str(v)}
        name = json.dumps([r.get("metric"), ident], sort_keys=True, default=str)
        for k, v in [("value", r.get("value"))] + sorted((k, v) for k, v in r.items() if k != "value"):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or machine_row({"metric": k}):
                continue
            out.append([f"{name}.{k}", float(v) if math.isfinite(v) else str(v)])
    return sorted(out, key=lambda x: x[0])


# ---- observing a probe -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one CPU thread for the duration, whatever the probed code asks for; restored on exit."""
    before, setter = torch.get_num_threads(), torch.set_num_threads
    setter(1)
    torch.set_num_threads = lambda n: None  # the probed scripts pin their own threads: held at 1 here
    try:
        yield
    finally:
        torch.set_num_threads = setter
        setter(before)


class Observer:
    """Global hooks that record a probe: the first ``MAX_CALLS`` top-level module calls (inputs and outputs) and the
    parameters after every optimizer step. Installed on enter, removed on exit (nothing stays in the process)."""

    def __init__(self):
        self.probes: list[tuple[str, dict]] = []
        self._depth, self._calls, self._steps = 0, 0, 0

    def _pre(self, module, args):
        if self._depth == 0 and self._calls < MAX_CALLS:
            for path, t in _tensors(args):
                self.probes.append((f"call {self._calls + 1} ({type(module).__name__}) input {path}", tensor_digest(t)))
        self._depth += 1

    def _post(self, module, args, output):
        self._depth -= 1
        if self._depth == 0 and self._calls < MAX_CALLS:
            self._calls += 1
            for path, t in _tensors(output):
                self.probes.append((f"call {self._calls} ({type(module).__name__}) output {path}", tensor_digest(t)))

    def _step(self, optimizer, args, kwargs):
        self._steps += 1
        for g, group in enumerate(optimizer.param_groups):
            flat = [p.detach().reshape(-1) for p in group["params"] if p is not None]
            if flat:
                self.probes.append((f"parameters after step {self._steps} (group {g})", tensor_digest(torch.cat(flat))))

    def __enter__(self) -> Observer:
        from torch.nn.modules import module as mm
        from torch.optim import optimizer as om

        self._handles = [mm.register_module_forward_pre_hook(self._pre),
                         mm.register_module_forward_hook(self._post, always_call=True),
                         om.register_optimizer_step_post_hook(self._step)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()


@contextlib.contextmanager
def kept_rng() -> Iterator[None]:
    """Python's, numpy's and torch's random streams as they were before (the probed code seeds all three)."""
    import random

    import numpy as np

    py, npy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)


def observe(run: Callable[[], list[dict] | None]) -> list[tuple[str, object]]:
    """Run ``run()`` (a probe: it returns the rows of its cell) under the observer on one thread; the probes in
    order, the rows last. The caller's random streams and threads are as they were."""
    with kept_rng(), one_thread(), Observer() as obs:
        rows = run()
    return [*obs.probes, ("rows", rows_digest(rows))]


# ---- comparing -------------------------------------------------------------------------------------------------
def _close(a: float, b: float, scale: float) -> bool:
    return abs(a - b) <= RTOL * max(abs(scale), 1e-30) or a == b


def _digest_difference(a: dict, b: dict) -> str | None:
    for key in ("shape", "dtype", "sha", "nonfinite"):
        if a.get(key) != b.get(key):
            return f"{key} {a.get(key)} vs {b.get(key)}"
    if "sum" not in a:
        return None
    n = max(math.prod(a["shape"]) if a["shape"] else 1, 1)
    rms = math.sqrt(max(a["sq"], b["sq"]) / n)
    checks = [("sum", a["sum"], b["sum"], max(a["abs"], b["abs"])), ("Σ|x|", a["abs"], b["abs"], a["abs"]),
              ("Σx²", a["sq"], b["sq"], a["sq"])]
    checks += [(f"value {i}", x, y, rms) for i, (x, y) in enumerate(zip(a["at"], b["at"]))
               if not (isinstance(x, str) or isinstance(y, str))]
    if [x for x in a["at"] if isinstance(x, str)] != [y for y in b["at"] if isinstance(y, str)]:
        return "non-finite values differ"
    for name, x, y, scale in checks:
        if not _close(x, y, scale):
            return f"{name} {x:.9g} vs {y:.9g}"
    return None


def _rows_difference(a: list, b: list) -> str | None:
    if [r[0] for r in a] != [r[0] for r in b]:
        extra = sorted({r[0] for r in a} ^ {r[0] for r in b})
        return f"rows differ in kind ({len(a)} vs {len(b)} numbers; e.g. {extra[0] if extra else 'their order'})"
    for (name, x), (_, y) in zip(a, b):
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                return f"row {name}: {x} vs {y}"
        elif not _close(x, y, max(abs(x), abs(y))):
            return f"row {name}: {x:.9g} vs {y:.9g}"
    return None


def difference(stored: list, fresh: list) -> str | None:
    """None when two probe lists agree within ``RTOL``; else the first probe that differs and how."""
    names_b = [p[0] for p in fresh]
    for i, (name, value) in enumerate(stored):
        if i >= len(fresh) or names_b[i] != name:
            return f"probe `{name}` is not in the code's run ({len(stored)} probes stored, {len(fresh)} now)"
        other = fresh[i][1]
        why = _rows_difference(value, other) if name == "rows" else _digest_difference(value, other)
        if why:
            return f"probe `{name}` differs: {why}"
    if len(fresh) != len(stored):
        return f"the code's run has probes the stored one lacks (`{names_b[len(stored)]}`)"
    return None


# ---- the families' probes --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """How one experiment is probed: ``arms(cells) -> arms`` (JSON-able dicts naming everything a probe needs: the
    distinct arm configurations of the cells, a representative of each kind of cell that only differs in its setting),
    and ``run(arm, options, tmp) -> rows``: the arm's cell at the probe budget through the experiment's own code,
    ``options`` being the parsed options its store records (``experiments.common.run_context``)."""

    arms: Callable[[list[dict]], list[dict]]
    run: Callable[[dict, dict, Path], list[dict] | None]


def probe_args(module, preset: str, options: dict, out: Path, **overrides):
    """The script's parsed arguments as its store recorded them (``options``), at ``preset``, writing under ``out``,
    with the probe's ``overrides`` (a tiny budget) on top."""
    args = module.build_parser().parse_args(["--preset", preset, "--out", str(out), "--quiet"])
    for k, v in options.items():
        if hasattr(args, k) and k != "preset":
            setattr(args, k, v)
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


def distinct(arms) -> list[dict]:
    """The arms once each, in order."""
    seen: dict[str, dict] = {}
    for a in arms:
        seen.setdefault(arm_key(a), a)
    return list(seen.values())


def probe_of(experiment: str) -> Probe | None:
    """The experiment's probe (``<family>/probe.py``'s ``PROBES``), None for a section that times (speeds cannot be
    fingerprinted) or has none."""
    from .protocol import EXPERIMENTS

    exp = EXPERIMENTS.get(experiment)
    if exp is None:
        return None
    try:
        mod = importlib.import_module(f"{__package__}.{exp.family}.probe")
    except ModuleNotFoundError:
        return None
    return getattr(mod, "PROBES", {}).get(experiment)


def arm_key(arm: dict) -> str:
    return json.dumps(arm, sort_keys=True, default=str)


def arms_of(experiment: str, cells: list[dict]) -> list[dict]:
    """The distinct arms of ``cells`` (their order kept)."""
    probe = probe_of(experiment)
    return distinct(probe.arms(cells)) if probe is not None else []


def fingerprint_arms(experiment: str, arms: list[dict], options: dict,
                     cache: dict[str, list] | None = None) -> dict[str, list]:
    """{arm key: probes} of every arm, computed at the code in this process; ``cache`` (by experiment, arm and
    options) saves recomputing an arm two sections share."""
    probe = probe_of(experiment)
    if probe is None:
        raise ValueError(f"experiment: {experiment!r} has no probe")
    out = {}
    with tempfile.TemporaryDirectory(prefix="attention_zoo-probe-") as tmp:
        for arm in arms:
            key = arm_key(arm)
            ck = json.dumps([experiment, key, options], sort_keys=True, default=str)
            if cache is not None and ck in cache:
                out[key] = cache[ck]
                continue
            out[key] = observe(lambda arm=arm: probe.run(arm, options, Path(tmp)))
            if cache is not None:
                cache[ck] = out[key]
    return out


__all__ = ["MAX_CALLS", "RTOL", "SUFFIX", "VERSION", "Observer", "Probe", "arm_key", "arms_of", "difference",
           "distinct", "fingerprint_arms", "machine_row", "observe", "one_thread", "probe_args", "probe_of",
           "rows_digest", "tensor_digest"]
