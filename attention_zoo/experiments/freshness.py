"""Is a report section older than the code that made its numbers? Computed from git and from behaviour, never typed.

A section's numbers depend on the modules its script imports, followed transitively inside ``attention_zoo`` (read
with ``ast``, nothing imported; the sub-packages' ``__init__`` modules that run on the way, and the registered
attentions every experiment creates by name): the experiment, the variants, backbones, training, data and
measurement code it reaches. Code that only renders — the claims layer, reports, plots, file I/O, the command-line
plumbing, the driver, the index and the fingerprints — can change how a number is shown but not the number, and is
left out. The section's runs are named by commit in its folder's environment records (every sitting of a resumed
store) and in the driver's run record.

Two steps decide (docs/results.md, "Freshness"): first the code — the section is current when none of its files
differs between the oldest of its runs and the working tree, comments and docstrings aside (each file's syntax tree
is compared); otherwise its *fingerprints* (``fingerprint``): the probes its runs recorded are recomputed by the code
now and compared, so a refactor that computes the same numbers leaves it current ("behaviour identical"). A section
whose numbers are speeds has no probe and ages by its code alone, as does a store made before fingerprints existed.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path

PACKAGE = "attention_zoo"
ROOT = Path(__file__).resolve().parents[2]  # the repository (the package's parent folder)
# Modules whose changes cannot change a stored number (they render, validate arguments or schedule runs).
RENDER_ONLY = ("attention_zoo.claims", "attention_zoo.report", "attention_zoo.plots",
               "attention_zoo.io", "attention_zoo.cli", "attention_zoo.experiments.results_index",
               "attention_zoo.experiments.freshness", "attention_zoo.experiments.dryrun",
               "attention_zoo.experiments.launchers", "attention_zoo.experiments.run_all",
               "attention_zoo.experiments.slurm", "attention_zoo.experiments.entry",
               "attention_zoo.experiments.backfill",
               "attention_zoo.experiments.fingerprint")  # the fingerprints observe the code, they compute nothing


def _file(module: str, root: Path) -> Path | None:
    base = root / Path(*module.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _imports(module: str, path: Path, root: Path) -> set[str]:
    """Modules of the package that ``path`` (module ``module``) imports."""
    out = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n.startswith(PACKAGE) and _file(n, root) is not None}
    return out


def _render_only(module: str) -> bool:
    return module.startswith(RENDER_ONLY) or module.rpartition(".")[2].endswith(("report", "probe"))


def normalized(source: str) -> str | None:
    """The syntax tree of a module without its docstrings (comments never reach it): two sources with the same
    normal form compute the same thing. None when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def code_digest(files: tuple[str, ...], root: Path = ROOT) -> str:
    """A digest of the normal forms of ``files`` in the working tree (the fingerprint cache's key)."""
    h = hashlib.sha256()
    for f in sorted(files):
        path = root / f
        h.update(f.encode() + b"\0" + (normalized(path.read_text()) or "").encode() if path.is_file() else b"-")
    return h.hexdigest()[:24]


@lru_cache(maxsize=64)
def code_files(modules: tuple[str, ...], root: Path = ROOT) -> tuple[str, ...]:
    """Repository-relative paths of the modules ``modules`` reach, render-only code left out."""
    seen, todo = set(), [*modules, f"{PACKAGE}.variants"]  # every experiment creates the registered attentions
    while todo:
        mod = todo.pop()
        path = _file(mod, root)
        if mod in seen or path is None or _render_only(mod):
            continue
        seen.add(mod)
        parents = [".".join(mod.split(".")[:i]) for i in range(2, mod.count(".") + 1)]  # sub-package inits run too
        todo += sorted((_imports(mod, path, root) | set(parents)) - seen)
    return tuple(sorted(str(_file(m, root).relative_to(root)) for m in seen))


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def read_env_record(path: Path) -> tuple[dict | None, str]:
    """(the environment record at ``path``, "") or (None, why it cannot be read: not JSON, not a JSON object)."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"not readable as JSON ({type(exc).__name__})"
    if not isinstance(rec, dict):
        return None, f"not a JSON object (a {type(rec).__name__})"
    return rec, ""


def sittings(folder: Path) -> list[dict]:
    """The sittings behind a results folder: its ``.env.json`` records and the earlier runs each lists (records
    that cannot be read, and listed runs that are not objects, are left out: ``read_env_record``)."""
    out = []
    for env_file in sorted(folder.glob("*.env.json")):
        env, _ = read_env_record(env_file)
        if env is None:
            continue
        runs = env.get("runs")
        out += [env] + [r for r in (runs if isinstance(runs, list) else []) if isinstance(r, dict)]
    return sorted(out, key=lambda s: str(s.get("time_utc")))


def _script_file(command: str | None) -> str | None:
    return next((Path(t).name for t in (command or "").split() if t.endswith(".py")), None)


def _utc(stamp: str | None) -> datetime | None:
    try:
        t = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def driver_entry(folder: Path, run_record: dict, script: str) -> dict | None:
    """The driver's (``all.py``) record of ``script`` if that run made this folder's store, else None: a store made
    later by running its script directly keeps an older driver record beside it, whose commit and times are not its
    own. The record counts when one of the folder's sittings of the same script started inside that driver run, or
    when the folder has no such sitting to check it against."""
    rec = (run_record.get("scripts") or {}).get(script)
    if not rec:
        return None
    run = next((r for r in run_record.get("runs") or [] if r.get("run_id") == rec.get("run_id")), {})
    mine = [_utc(s.get("time_utc")) for s in sittings(folder)
            if _script_file(s.get("command")) == _script_file(rec.get("command"))]
    mine = [t for t in mine if t is not None]
    start = _utc(run.get("time_utc"))
    if not mine or start is None:
        return rec
    # a run still going has no total yet: any later sitting is its own
    end = start + timedelta(seconds=float(run["total_wall_s"]) + 60) if run.get("total_wall_s") else None
    inside = any(start - timedelta(seconds=60) <= t and (end is None or t <= end) for t in mine)
    return rec if inside else None


def section_commits(folder: Path, run_record: dict, script: str) -> list[str]:
    """Commits of the runs behind a results folder: its sittings and the driver's record of ``script`` where that
    run made the folder (``driver_entry``)."""
    out = [s.get("git_commit") for s in sittings(folder)]
    rec = driver_entry(folder, run_record, script) or {}
    out += [r.get("git_commit") for r in run_record.get("runs") or [] if r.get("run_id") == rec.get("run_id")]
    return sorted({c for c in out if c and c != "unknown"})


def _changed(commit: str, files: list[str], root: Path) -> list[str]:
    """Which of ``files`` compute something else in the working tree than at ``commit`` (their normal forms
    differ; a file added or removed counts)."""
    out = []
    for f in files:
        then = _git(root, "show", f"{commit}:{f}")
        path = root / f
        now = path.read_text() if path.is_file() else None
        if then is None or now is None or normalized(then) != normalized(now):
            out.append(f)
    return out


def _substantive(commit: str, files: list[str], root: Path) -> bool:
    """Whether ``commit`` changed what one of ``files`` computes (not only its comments or docstrings)."""
    touched = _git(root, "diff-tree", "--no-commit-id", "--name-only", "-r", "--root", commit, "--", *files)
    for f in (touched or "").split():
        before, after = _git(root, "show", f"{commit}^:{f}"), _git(root, "show", f"{commit}:{f}")
        if before is None or after is None or normalized(before) != normalized(after):
            return True
    return False


def later_changes(commits: list[str], files: tuple[str, ...], root: Path = ROOT) -> list[str] | None:
    """"<hash> <subject>" of every commit after the oldest of ``commits`` that changed one of ``files`` whose code
    in the working tree differs from the run's, comments and docstrings aside (a change undone later, a comment or a
    docstring cannot change a number; "uncommitted (working tree)" when only the working tree differs); None when git
    cannot tell (no repository, or none of the commits is in its history)."""
    found = None
    for c in commits:
        differ = _git(root, "diff", "--name-only", c, "--", *files)
        if differ is None:
            continue
        differ = _changed(c, [x for x in differ.splitlines() if x.strip()], root)
        log = _git(root, "log", "--format=%h %s", f"{c}..HEAD", "--", *differ) if differ else ""
        if log is not None:
            lines = [x for x in log.splitlines() if x.strip() and _substantive(x.split(" ", 1)[0], differ, root)]
            lines = lines or (["uncommitted (working tree)"] if differ else [])
            found = lines if found is None or len(lines) > len(found) else found
    return found


def _probed_stores(folder: Path) -> list[Path]:
    from .fingerprint import probe_of

    return [s for s in sorted(folder.glob("*.jsonl")) if probe_of(s.name.removesuffix(".jsonl")) is not None]


def _probe_digest(files: tuple[str, ...], root: Path) -> str:
    """The digest a section's probes are cached under: its code and every probe module."""
    probes = tuple(str(p.relative_to(root)) for p in sorted((root / PACKAGE).rglob("*probe.py")))
    return code_digest(files + probes + (f"{PACKAGE}/experiments/fingerprint.py",), root)


def _fingerprints(folder: Path, files: tuple[str, ...], root: Path, cache_dir: Path | None):
    """(state, words) of the section's fingerprints against the code now: "equal", "differs", "unrecorded" or
    "none" (no probe: its numbers are speeds, or its script has none)."""
    from .fingerprint_records import check

    stores = _probed_stores(folder)
    if not stores:
        return "none", "its numbers are speeds, or its script has no probe, so only its code can tell"
    digest = _probe_digest(files, root)
    results = [check(s, digest, cache_dir) for s in stores]
    for state in ("differs", "unrecorded"):
        hit = next((r for r in results if r.state == state), None)
        if hit:
            return state, hit.text
    return "equal", f"{sum(r.arms for r in results)} arm(s) probed"


def probes_to_run(folder: Path, run_record: dict, script: str, modules: tuple[str, ...], cache_dir: Path,
                  root: Path = ROOT) -> list[tuple]:
    """The probes ``freshness_line`` would compute for this section (its code changed, none cached): computed
    beforehand in parallel by ``fingerprint_records.compute_pending``."""
    from .fingerprint_records import pending

    commits = section_commits(folder, run_record, script)
    files = code_files(modules, root)
    if not commits or not later_changes(commits, files, root):
        return []
    digest = _probe_digest(files, root)
    return [job for s in _probed_stores(folder) for job in pending(s, digest, cache_dir)]


def freshness_line(folder: Path, run_record: dict, script: str, modules: tuple[str, ...],
                   root: Path = ROOT, probes: bool = True, cache_dir: Path | None = None) -> str:
    """One line for the report: current with the code at HEAD, by its code or by its fingerprints, or which later
    commits changed what it computes. ``probes=False`` decides by the code alone (a quick rebuild)."""
    commits = section_commits(folder, run_record, script)
    if not commits:
        return "Code: no run commit recorded for this section; its age against the code cannot be told."
    files = code_files(modules, root)
    changes = later_changes(commits, files, root)
    runs = ", ".join(f"`{c[:7]}`" for c in commits)
    if changes is None:
        return f"Code: run at {runs}; git cannot tell whether its code changed since (commit not in this history)."
    if not changes:
        return f"Code: run at {runs}; the code its numbers depend on is the same at HEAD."
    shown = "; ".join(f"`{x.split(' ', 1)[0]}`" for x in changes[:8]) + ("; …" if len(changes) > 8 else "")
    changed = f"{len(changes)} later commit(s) changed code its numbers depend on ({shown})"
    state, words = _fingerprints(folder, files, root, cache_dir) if probes else ("off", "fingerprints not checked")
    if state == "equal":
        return f"Code: run at {runs}; {changed}, behaviour identical: fingerprint equal ({words})."
    why = {"differs": f"its fingerprint differs: {words}", "unrecorded": f"bytes only: {words}",
           "none": f"bytes only: {words}", "off": words}[state]
    return f"**Older than its code:** run at {runs}; {changed}; {why}: rerun it to bring it to HEAD."


__all__ = ["code_digest", "code_files", "driver_entry", "freshness_line", "later_changes", "normalized",
           "probes_to_run", "read_env_record", "section_commits", "sittings"]
