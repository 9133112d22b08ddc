"""The layout of attention_zoo (docs/design.md): the import graph, walked with ``ast``, has no circles among the
experiments' modules nor between the head-mix kernels, and no experiment family imports another; the old flat
import paths still work for one release, with a DeprecationWarning."""

import ast
import subprocess
import sys
from pathlib import Path

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
    assert FAMILIES == ["efficiency", "generation", "lm", "synthetic", "vision"]
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
