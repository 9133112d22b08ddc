"""Freshness by behaviour: a section stays current through a refactor that computes the same numbers and ages when
what it computes changes (experiments/fingerprint.py, fingerprint_records.py, freshness.py).

The planted changes run in a scratch repository (a copy of this working tree under git): two Table 5 smoke stores
are made there at a commit, one with MHA, one with THA; then a no-op refactor (a comment in every module, a local
renamed, a function moved to another module) must leave both current, and THA's output scaled by 1.001 must age the
THA section only, naming its arm."""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import torch

from attention_zoo.experiments import fingerprint as fp
from attention_zoo.experiments.freshness import normalized

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


# ---- the digest and its tolerance ---------------------------------------------------------------------------------
def test_a_digest_ignores_rounding_noise_and_sees_a_thousandth():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 33, generator=g)
    a = [("t", fp.tensor_digest(x))]
    assert fp.difference(a, [("t", fp.tensor_digest(x * (1 + 1e-7)))]) is None
    why = fp.difference(a, [("t", fp.tensor_digest(x * 1.001))])
    assert why is not None and why.startswith("probe `t` differs")
    assert fp.difference(a, [("t", fp.tensor_digest(x[:, :32]))]).endswith("shape [64, 33] vs [64, 32]")
    ints = torch.arange(10)
    assert fp.difference([("i", fp.tensor_digest(ints))], [("i", fp.tensor_digest(ints.flip(0)))]) is not None


def test_rows_keep_the_computation_and_drop_the_machine():
    rows = [{"metric": "test_loss", "value": 2.5, "unit": "nats", "best_step": 10},
            {"metric": "train_time_s", "value": 12.0, "unit": "s"}, {"metric": "tokens_per_s", "value": 9e4},
            {"metric": "peak_rss_mib", "value": 300.0, "unit": "MiB"},
            {"metric": "x", "value": 1.0, "message": "see runs/a"}]
    names = [n for n, _ in fp.rows_digest(rows)]
    assert any('"test_loss"' in n and n.endswith(".value") for n in names)
    assert any(n.endswith(".best_step") for n in names)
    assert not any("time" in n or "per_s" in n or "rss" in n for n in names)
    changed = [{**rows[0], "value": 2.5 * 1.001}, *rows[1:]]
    assert fp.difference([("rows", fp.rows_digest(rows))], [("rows", fp.rows_digest(changed))]) is not None


def test_the_normal_form_ignores_comments_and_docstrings_only():
    base = 'def f(x):\n    """Doc."""\n    y = x + 1\n    return y\n'
    assert normalized(base) == normalized('# a comment\ndef f(x):  # here too\n    """Other."""\n    y = x + 1\n'
                                          '    return y\n')
    assert normalized(base) != normalized(base.replace("x + 1", "x + 2"))


def _synthetic_probe(threads: int) -> list:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        arm = {"preset": "smoke", "task": "regression", "lam": 0.2, "d_e": 8, "variant": "damcha", "flavor": "paper",
               "attention_options": "{}"}
        return fp.fingerprint_arms("synthetic", [arm], {"preset": "smoke"})[fp.arm_key(arm)]
    finally:
        torch.set_num_threads(before)


def test_fingerprints_are_equal_across_runs_and_thread_counts_and_leave_the_process_as_it_was():
    torch.manual_seed(123)
    state, threads = torch.random.get_rng_state(), torch.get_num_threads()
    one, again, two = _synthetic_probe(1), _synthetic_probe(1), _synthetic_probe(2)
    assert fp.difference(one, again) is None and fp.difference(one, two) is None
    assert any(name.startswith("parameters after step 2") for name, _ in one)
    assert any(" input " in name for name, _ in one) and one[-1][0] == "rows" and one[-1][1]
    assert torch.equal(torch.random.get_rng_state(), state) and torch.get_num_threads() == threads
    assert torch.set_num_threads is not None and torch.set_num_threads.__module__ != fp.__name__


# ---- planted changes in a scratch repository ----------------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _env(repo: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ATTENTION_ZOO_FINGERPRINT"}
    return {**env, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}


def _python(repo: Path, *args: str) -> str:
    proc = subprocess.run([PY, *args], cwd=repo, env=_env(repo), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


FRESHNESS = """
import json, sys
from pathlib import Path
from attention_zoo.experiments.freshness import freshness_line
print(json.dumps({f: freshness_line(Path("results") / f, {}, f, ("attention_zoo.experiments.lm.table5_gpt2",))
                  for f in sys.argv[1:]}))
"""


def _freshness(repo: Path) -> dict[str, str]:
    return json.loads(_python(repo, "-c", FRESHNESS, "t5_mha", "t5_tha").strip().splitlines()[-1])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A git repository holding this working tree's code and two Table 5 smoke stores made at its first commit."""
    repo = tmp_path_factory.mktemp("scratch")
    files = _git(ROOT, "ls-files", "-co", "--exclude-standard", "attention_zoo", "reproduce", "pyproject.toml")
    for f in files.splitlines():
        if (ROOT / f).is_file():
            (repo / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, repo / f)
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "code")
    for v in ("mha", "tha"):
        _python(repo, "reproduce/table5_gpt2.py", "--steps", "3", "--variants", v, "--seeds", "0", "--eval-batches",
                "1", "--quiet", "--out", f"results/t5_{v}")
        assert list((repo / "results" / f"t5_{v}").glob("*.fingerprint.json")), "the run recorded no fingerprint"
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "results")
    (repo / ".results_commit").write_text(_git(repo, "rev-parse", "HEAD").strip())
    return repo


def _commit(repo: Path, message: str) -> None:
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", message)


def _rename_a_local(path: Path, function: str) -> None:
    """Rename the first local variable assigned in ``function`` (tokens, so strings and attributes stay)."""
    text = path.read_text()
    fn = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == function)
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    name = next(n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                and n.id not in params)
    toks, depth, prev = list(tokenize.generate_tokens(io.StringIO(text).readline)), 0, None
    out = []
    for i, t in enumerate(toks):
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        inside = fn.lineno <= t.start[0] <= fn.end_lineno
        kwarg = depth > 0 and nxt == "="
        if inside and t.type == tokenize.NAME and t.string == name and prev != "." and not kwarg:
            t = t._replace(string=f"{name}_renamed")
        out.append(t)
        prev = t.string
    path.write_text(tokenize.untokenize(out))


def _move_function(repo: Path) -> None:
    """engine/loop.py's ``lr_factor`` moved to a new module engine/schedule.py, imported back."""
    loop = repo / "attention_zoo" / "engine" / "loop.py"
    text = loop.read_text()
    fn = next((n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "lr_factor"), None)
    assert fn is not None, "engine/loop.py no longer defines lr_factor: pick another function for this test"
    lines = text.splitlines(keepends=True)
    body = "".join(lines[fn.lineno - 1:fn.end_lineno])
    rest = lines[:fn.lineno - 1] + lines[fn.end_lineno:]
    at = next(i for i, line in enumerate(rest) if line.startswith("from .config import"))
    rest.insert(at + 1, "from .schedule import lr_factor\n")
    loop.write_text("".join(rest))
    (repo / "attention_zoo" / "engine" / "schedule.py").write_text(
        "from __future__ import annotations\n\nimport math\n\nfrom .config import TrainConfig\n\n\n" + body)
    _git(repo, "add", "attention_zoo/engine/schedule.py")


def test_a_no_op_refactor_leaves_every_section_current_and_a_behaviour_change_ages_only_its_arm(scratch):
    before = _freshness(scratch)
    assert all("the same at HEAD" in line for line in before.values()), before

    for path in sorted((scratch / "attention_zoo").rglob("*.py")):  # a comment in every module: code unchanged
        path.write_text("# a planted comment\n" + path.read_text())
    _commit(scratch, "comments")
    assert all("the same at HEAD" in line for line in _freshness(scratch).values())

    _rename_a_local(scratch / "attention_zoo" / "variants" / "mha.py", "_attend")
    _rename_a_local(scratch / "attention_zoo" / "variants" / "tha.py", "_attend")
    _move_function(scratch)
    _commit(scratch, "a local renamed, a function moved")
    refactored = _freshness(scratch)
    assert all("behaviour identical: fingerprint equal" in line for line in refactored.values()), refactored

    tha = scratch / "attention_zoo" / "variants" / "tha.py"
    cls = next(n.name for n in ast.parse(tha.read_text()).body if isinstance(n, ast.ClassDef)
               and any(isinstance(f, ast.FunctionDef) and f.name == "_attend" for f in n.body))
    tha.write_text(tha.read_text() + f"\n\n_planted = {cls}._attend\n{cls}._attend = "
                   "lambda self, *a, **k: _planted(self, *a, **k) * 1.001\n")
    _commit(scratch, "THA's output scaled by 1.001")
    changed = _freshness(scratch)
    assert "behaviour identical" in changed["t5_mha"], changed["t5_mha"]
    assert changed["t5_tha"].startswith("**Older than its code:**") and "fingerprint differs" in changed["t5_tha"]
    assert "tha" in changed["t5_tha"].split("fingerprint differs", 1)[1]


def test_a_store_made_before_fingerprints_ages_by_its_code_and_says_so(scratch, tmp_path):
    repo = tmp_path / "old"
    shutil.copytree(scratch, repo, symlinks=True)
    _git(repo, "reset", "-q", "--hard", (repo / ".results_commit").read_text())  # before the other test's changes
    for f in (repo / "results").rglob("*.fingerprint.json"):
        f.unlink()
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "no fingerprints")
    lines = _freshness(repo)
    assert all("the same at HEAD" in line for line in lines.values())  # the code alone still says current
    loop = repo / "attention_zoo" / "engine" / "loop.py"
    loop.write_text(loop.read_text() + "\n\nPLANTED = 1\n")
    _commit(repo, "code changed")
    lines = _freshness(repo)
    assert all(line.startswith("**Older than its code:**") and "made before fingerprints existed" in line
               and "bytes only" in line for line in lines.values()), lines


def test_the_index_probes_a_changed_section_up_to_its_first_difference_only(tmp_path):
    """compute_pending (the index's parallel precomputation) stops where ``check`` stops: a store of six arms whose
    recorded probes all differ from the code costs one probe per worker, not six; ``check`` then finds them cached."""
    from attention_zoo.experiments import fingerprint_records as fr

    arms = [{"preset": "smoke", "task": "regression", "lam": lam, "d_e": 8, "variant": "mha", "flavor": "paper",
             "attention_options": "{}"} for lam in (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)]
    store = tmp_path / "synthetic.jsonl"
    store.write_text(json.dumps({"kind": "run", "run_id": "r1", "context": {"options": {"preset": "smoke"}}}) + "\n"
                     + "".join(json.dumps({"cell_id": f"c{i}", "run_id": "r1", "cell": a}) + "\n"
                               for i, a in enumerate(arms)))
    recorded = [["rows", [["planted.value", 123.0]]]]  # what no probe of today's code gives
    fr.record_path(store).write_text(json.dumps({"version": fp.VERSION, "rtol": fp.RTOL, "experiment": "synthetic",
                                                 "runs": {"r1": {"arms": [{"arm": a, "probes": recorded}
                                                                          for a in arms]}}}))
    cache = tmp_path / "cache"
    jobs = fr.pending(store, "digest", cache)
    assert len(jobs) == 1
    fr.compute_pending(jobs, workers=2)
    assert 1 <= len(list(cache.glob("*.json"))) <= 2
    assert fr.pending(store, "digest", cache) == [], "the first arm is cached: nothing left for the index to precompute"
    result = fr.check(store, "digest", cache)
    assert result.state == "differs" and result.arms == 1, result
    assert len(list(cache.glob("*.json"))) <= 2
