"""The layout of attention_zoo (docs/design.md): the import graph, walked with ``ast``, has no circles among the
experiments' modules nor between the head-mix kernels, and no experiment family imports another; the old flat
import paths still work for one release, with a DeprecationWarning."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "attention_zoo"
EXPERIMENTS = PKG / "experiments"
FAMILIES = sorted(p.name for p in EXPERIMENTS.iterdir() if (p / "__init__.py").is_file())


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The attention_zoo modules ``name`` imports anywhere in its file (top level, functions, TYPE_CHECKING)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:  # an imported name, not a module: its module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def family_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "experiments" and parts[2] in FAMILIES else None


def cycles(nodes: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), restricted to ``nodes``."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v] & nodes:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def test_the_families_are_the_documented_ones():
    assert FAMILIES == ["efficiency", "generation", "lm", "mlm", "mqar", "scaling", "synthetic", "vision"]
    design = (ROOT / "docs" / "design.md").read_text()
    assert all(f"{f}/" in design for f in FAMILIES), "docs/design.md's layout tree names every family"


def test_no_family_imports_another_and_the_framework_imports_none():
    offenders = []
    for m, deps in GRAPH.items():
        if not m.startswith("attention_zoo.experiments"):
            continue
        own = family_of(m)
        for d in deps:
            other = family_of(d)
            if other and other != own and d != "attention_zoo.experiments":
                offenders.append(f"{m} -> {d}")
    assert not offenders, "imports across experiment families (or from the framework into one):\n" + "\n".join(
        offenders)


def test_nothing_below_the_experiments_imports_them():
    lower = [f"{m} -> {d}" for m, deps in GRAPH.items() if not m.startswith("attention_zoo.experiments")
             and m not in ("attention_zoo.bench",)  # bench's `train` mode runs the synthetic family's benchmark
             for d in deps if d.startswith("attention_zoo.experiments")]
    assert not lower, "\n".join(lower)


def test_no_import_circles_among_the_experiments_or_the_headmix_kernels():
    experiments = {m for m in MODULES if m.startswith("attention_zoo.experiments.")}
    variants = {m for m in MODULES if m.startswith("attention_zoo.variants.")}
    assert cycles(experiments) == []
    assert cycles(variants) == []


def test_the_registry_names_a_module_of_its_family():
    from attention_zoo.experiments.protocol import EXPERIMENTS

    for e in EXPERIMENTS.values():
        assert e.module_path in MODULES, e
        assert family_of(e.module_path) == e.family
        assert (ROOT / "reproduce" / f"{e.name}.py").is_file()
        assert e.module_path in (ROOT / "reproduce" / f"{e.name}.py").read_text()


OLD_PATHS = """
import warnings
warnings.simplefilter("error")
import attention_zoo.experiments  # the package itself does not warn
from attention_zoo.experiments.vision import table6_vit as new
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as w:
    from attention_zoo.experiments import table6_vit as old
    import attention_zoo.experiments.synthetic_fit as fit
    from attention_zoo.experiments.synthetic import PRESETS
    from attention_zoo.experiments.generation import build_model
from attention_zoo.experiments.synthetic import sweep, fit as new_fit
assert old is new and fit is new_fit and PRESETS is sweep.PRESETS and callable(build_model)
assert new.__spec__.name == new.__name__ == "attention_zoo.experiments.vision.table6_vit"
moved = {str(x.message).split()[0] for x in w if issubclass(x.category, DeprecationWarning)}
print(sorted(moved))
"""


def test_old_import_paths_work_and_warn():
    res = subprocess.run([sys.executable, "-c", OLD_PATHS], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(sorted(f"attention_zoo.experiments.{m}" for m in
                                            ("table6_vit", "synthetic_fit", "synthetic", "generation")))


def test_every_moved_module_has_a_new_home():
    from attention_zoo.experiments import MOVED

    for old, new in MOVED.items():
        assert f"attention_zoo.experiments.{new}" in MODULES, (old, new)
        assert not (EXPERIMENTS / f"{old}.py").exists(), f"a stub file is left at {old}.py"
    readme = (ROOT / "README.md").read_text()
    changelog = readme[readme.index("## Changelog"):]
    assert all(f"experiments.{old}" in changelog and f"experiments.{new}" in changelog for old, new in MOVED.items())


def _listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


def test_dry_run_lists_cells_skips_and_cost_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """On a copy of the committed Table 6 store: the finished seeds are skipped, a new seed would run, priced from
    the store's own timings; not a byte changes. On a fresh --out: nothing is created."""
    import json

    from attention_zoo import envinfo
    from attention_zoo.experiments.generation import table3_depth_blocks
    from attention_zoo.experiments.vision import table6_vit

    out = tmp_path / "table6_vit"
    shutil.copytree(ROOT / "results" / "table6_vit", out)
    # the store's cells are keyed by the CPU that measured them: this machine passes for it (the plan is the point)
    cpu = json.loads((out / "table6_vit.env.json").read_text())["cpu_model"]
    monkeypatch.setattr(envinfo, "cpu_model", lambda: cpu)
    before = _listing(tmp_path)
    assert table6_vit.main(["--dry-run", "--out", str(out), "--variants", "mha,damcha", "--flavour", "paper",
                            "--seeds", "0,1,2", "3", "--device", "cpu", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "would run: 2" in text and "would skip (finished): 6" in text and "seed=3" in text
    assert "data: digits" in text and "2 same kind" in text
    assert _listing(tmp_path) == before

    fresh = tmp_path / "fresh"
    assert table3_depth_blocks.main(["--dry-run", "--out", str(fresh), "--depths", "1", "2", "--seeds", "0",
                                     "--device", "cpu", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "would run: 2" in text and "would skip (finished): 0" in text and "estimate:" in text
    assert not fresh.exists() and _listing(tmp_path) == before


def test_all_py_dry_run_plans_each_script_and_warns_of_a_paper_preset_on_cpu(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "reproduce" / "all.py"), "--dry-run", "--preset", "paper",
                          "--device", "cpu", "--out", str(tmp_path / "r"), "--only", "synthetic,benchmark"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "== synthetic:" in res.stdout and "would run: 385" in res.stdout and "== benchmark:" in res.stdout
    assert "warning: the paper preset would train on a CPU" in res.stdout
    assert not (tmp_path / "r").exists()


def test_old_flag_spellings_parse_with_a_deprecation_note(capsys):
    from attention_zoo.experiments.efficiency.table7_complexity import build_parser as table7
    from attention_zoo.experiments.lm.table5_gpt2 import build_parser as table5

    args = table5().parse_args(["--max-steps", "7", "--seeds", "0,1", "2", "--datasets", "shakespeare"])
    assert (args.max_steps, args.seeds, args.datasets, args.flavour) == (7, [0, 1, 2], "shakespeare", "paper")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-steps is deprecated" in err and "use --steps" in err
    assert table5().parse_args(["--preset", "paper"]).seeds == [0, 1, 2, 3, 4]  # five seeds where no preset says
    assert table5().parse_args([]).seeds == [0]
    assert table7().parse_args(["--seq-lens", "16,32", "64"]).seq_lens == [16, 32, 64]
    assert capsys.readouterr().err == ""


def test_all_py_takes_its_old_results_flag_with_a_note(tmp_path, capsys):
    from attention_zoo.experiments import run_all

    assert run_all.main(["--index-only", "--results", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "README.md").is_file()
    assert "--results is deprecated" in capsys.readouterr().err


# ---- the rooms (a house that can be tidied): short files, few loose modules, imports that run one way ----------------
# Render and low layers: what each may import of the package (the lower layers only). plots and claims do not
# import each other's way up: both read the report helpers below them.
LOWER = {"attention_zoo.report": ("attention_zoo.io",),
         "attention_zoo.plots": ("attention_zoo.io", "attention_zoo.report", "attention_zoo.registry",
                                 "attention_zoo.plots")}


def test_no_module_of_the_package_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_at_most_twelve_modules_sit_directly_under_the_package():
    loose = sorted(p.name for p in PKG.glob("*.py"))
    assert len(loose) <= 12, loose


def test_the_figure_helpers_and_the_report_import_nothing_above_them():
    for low, allowed in LOWER.items():
        for mod in [m for m in MODULES if m == low or m.startswith(low + ".")]:
            above = {t for t in GRAPH[mod] if not t.startswith(allowed)}
            assert not above, f"{mod} imports {sorted(above)} (a lower layer importing a higher one)"


@pytest.mark.parametrize(("old", "new"), [("host_adapters", "adapters.hosts"), ("hf_adapters", "adapters.hf"),
                                          ("host_weights", "adapters.weights"), ("_tvshim", "adapters._tvshim"),
                                          ("_tvhook", "adapters._tvhook"), ("plots_style", "plots.style"),
                                          ("bench_plot", "plots.bench")])
def test_a_moved_top_level_module_keeps_its_old_path_for_a_release(old, new):
    code = (f"import warnings, importlib\nwarnings.simplefilter('error')\n"
            f"new = importlib.import_module('attention_zoo.{new}')\n"
            f"try:\n    importlib.import_module('attention_zoo.{old}')\nexcept DeprecationWarning as w:\n"
            f"    print('warned', 'attention_zoo.{new}' in str(w))\nwarnings.simplefilter('ignore')\n"
            f"print(importlib.import_module('attention_zoo.{old}') is new)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-1000:]
    assert run.stdout.split() == ["warned", "True", "True"]


def test_python_dash_m_of_the_old_startup_hook_path_runs_the_new_one():
    run = subprocess.run([sys.executable, "-m", "attention_zoo._tvhook", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "attention_zoo.adapters._tvhook" in run.stdout
    assert "moved to attention_zoo.adapters._tvhook" in run.stderr


def test_the_old_adapters_module_names_still_resolve_with_a_warning():
    import warnings

    import attention_zoo.adapters as adapters
    from attention_zoo.adapters import swap

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert adapters.HOSTS is swap.HOSTS
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
