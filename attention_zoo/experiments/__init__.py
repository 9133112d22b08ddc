"""The experiments floor: the framework at this level (``protocol``: the Experiment protocol and its registry;
``launchers``; ``run_all``: the ``reproduce/all.py`` driver; ``results_index``; ``common``: the shared flags and
the store's provenance; ``dryrun``: ``--dry-run``) and one package per experiment family (``synthetic``, ``generation``,
``lm``, ``vision``, ``efficiency``). A family imports the framework and the layers below, never another family.

The modules of the flat layout (``attention_zoo.experiments.<module>``) moved into the family packages; their old
import paths keep working for one release with a ``DeprecationWarning`` (``MOVED`` and the README's changelog): every
name the old module had is reachable through its old path, also those that moved on into other modules
(``MOVED_NAMES``), and ``python -m`` of an old path names the new module and runs it where it is a program
(``run_moved``)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import runpy
import sys
import warnings
from pathlib import Path

# Old flat module -> its new home (relative to this package). Remove with the next release.
MOVED = {
    "synthetic": "synthetic.sweep", "synthetic_fit": "synthetic.fit", "synthetic_report": "synthetic.report",
    "train_speed": "synthetic.train_speed",
    "generation": "generation.training", "generation_common": "generation.shared",
    "generation_scoring": "generation.scoring", "table1_generation": "generation.table1_generation",
    "table3_depth_blocks": "generation.table3_depth_blocks", "table4_ablation": "generation.table4_ablation",
    "appendix_e_kde": "generation.appendix_e_kde", "appendix_fgh": "generation.appendix_fgh",
    "metric_figures": "generation.metric_figures",
    "table5_gpt2": "lm.table5_gpt2", "table5_report": "lm.table5_report",
    "table6_vit": "vision.table6_vit", "table6_data": "vision.table6_data", "table6_report": "vision.table6_report",
    "efficiency": "efficiency.timing", "table2_efficiency": "efficiency.table2_efficiency",
    "table2_report": "efficiency.table2_report", "table7_complexity": "efficiency.table7_complexity",
    "paper_flops": "efficiency.paper_flops", "rowsum_analysis": "efficiency.rowsum_analysis",
}


# Names the old flat modules had (their own and those they imported) that their new home does not: where each lives
# now ("~." = "attention_zoo."; "module:attribute", or a module). Reached through the old path with a
# DeprecationWarning (``_Alias``, ``forward_old_module``). Remove with MOVED.
MOVED_NAMES = {
    "synthetic": {
        "cli_main": "~.cli:cli_main",
    },
    "synthetic_fit": {
        "AttentionStack": "~.models.stack:AttentionStack", "StackConfig": "~.models.stack:StackConfig",
        "dataclass": "dataclasses:dataclass", "lru_cache": "functools:lru_cache",
    },
    "generation": {
        "AUTHOR_TOKENIZERS": "~.experiments.generation.data:AUTHOR_TOKENIZERS",
        "BYTES_PER_TOKEN": "~.experiments.generation.data:BYTES_PER_TOKEN",
        "ImageData": "~.experiments.generation.data:ImageData", "Path": "pathlib:Path",
        "TEXT_LENGTHS": "~.experiments.generation.data:TEXT_LENGTHS",
        "TextData": "~.experiments.generation.data:TextData", "TrainConfig": "~.engine.config:TrainConfig",
        "asdict": "dataclasses:asdict", "atomic_write_bytes": "~.io:atomic_write_bytes",
        "cell_id": "~.results:cell_id", "dataclass": "dataclasses:dataclass", "di": "~.data.images",
        "dt": "~.data.image_tasks", "functools": "functools", "hashlib": "hashlib", "io": "io", "json": "json",
        "lm_loss": "~.engine.loop:lm_loss", "mi": "~.metrics.images",
        "resolved_options_json": "~.registry:resolved_options_json", "s2s": "~.data.seq2seq", "torch": "torch",
    },
    "generation_scoring": {
        "TYPE_CHECKING": "typing:TYPE_CHECKING", "cell_id": "~.results:cell_id", "hashlib": "hashlib",
    },
    "table1_generation": {
        "ANALOG": "~.experiments.generation.tables_report:ANALOG",
        "BETTER": "~.experiments.generation.table1_report:BETTER",
        "CI_METRICS": "~.experiments.generation.table1_report:CI_METRICS",
        "DELTA_PANELS": "~.experiments.generation.table1_report:DELTA_PANELS",
        "IMAGE_METRICS": "~.experiments.generation.table1_report:IMAGE_METRICS",
        "NOT_COMPARABLE": "~.experiments.generation.tables_report:NOT_COMPARABLE",
        "PAPER": "~.experiments.generation.table1_report:PAPER",
        "PAPER_NAMES": "~.experiments.generation.tables_report:PAPER_NAMES",
        "RELATIVE": "~.experiments.generation.table1_report:RELATIVE",
        "TEXT_METRICS": "~.experiments.generation.table1_report:TEXT_METRICS", "cli_main": "~.cli:cli_main",
        "flat_wide": "~.experiments.generation.tables_report:flat_wide", "frame_verdicts": "~.claims:frame_verdicts",
        "image_text_notes": "~.experiments.generation.tables_report:image_text_notes", "math": "math",
        "means": "~.experiments.generation.tables_report:means",
        "paired_section": "~.experiments.generation.tables_report:paired_section",
        "paper_comparison": "~.experiments.generation.table1_report:paper_comparison",
        "params_section": "~.experiments.generation.tables_report:params_section",
        "pct": "~.experiments.generation.tables_report:pct", "pd": "pandas", "plots": "~.plots", "report": "~.report",
        "seeds_line": "~.experiments.generation.tables_report:seeds_line",
        "verdict_markdown": "~.claims.table:verdict_markdown",
    },
    "table3_depth_blocks": {
        "BETTER": "~.experiments.generation.table3_report:BETTER",
        "INFERENCE": "~.experiments.generation.ablations:INFERENCE",
        "PAPER": "~.experiments.generation.table3_report:PAPER", "cli_main": "~.cli:cli_main",
        "frame_verdicts": "~.claims:frame_verdicts", "math": "math",
        "paper_comparison": "~.experiments.generation.table3_report:paper_comparison", "pd": "pandas",
        "plots": "~.plots", "report": "~.report", "t_interval": "~.claims.stats:t_interval",
        "temperature_rows": "~.experiments.generation.table3_report:temperature_rows",
        "verdict_markdown": "~.claims.table:verdict_markdown",
    },
    "table4_ablation": {
        "BETTER": "~.experiments.generation.table4_report:BETTER",
        "LABELS": "~.experiments.generation.table4_report:LABELS",
        "METRICS": "~.experiments.generation.table4_report:METRICS",
        "PANELS": "~.experiments.generation.table4_report:PANELS",
        "PAPER": "~.experiments.generation.table4_report:PAPER",
        "STAND_INS": "~.experiments.generation.table4_report:STAND_INS", "cli_main": "~.cli:cli_main",
        "frame_verdicts": "~.claims:frame_verdicts", "math": "math",
        "paper_comparison": "~.experiments.generation.table4_report:paper_comparison", "pd": "pandas",
        "plots": "~.plots", "relative_changes": "~.experiments.generation.table4_report:relative_changes",
        "report": "~.report", "verdict_markdown": "~.claims.table:verdict_markdown",
    },
    "appendix_e_kde": {
        "ResultStore": "~.results:ResultStore", "cli_main": "~.cli:cli_main",
    },
    "appendix_fgh": {
        "cli_main": "~.cli:cli_main",
    },
    "table5_gpt2": {
        "PAPER_DATASETS": "~.experiments.lm.table5_report:PAPER_DATASETS", "cli_main": "~.cli:cli_main",
        "dataclass": "dataclasses:dataclass", "field": "dataclasses:field",
    },
    "table6_vit": {
        "Mixup": "~.data.imagefolder:Mixup", "cli_main": "~.cli:cli_main", "dataclass": "dataclasses:dataclass",
        "field": "dataclasses:field",
    },
    "table6_data": {
        "TYPE_CHECKING": "typing:TYPE_CHECKING",
    },
    "table2_efficiency": {
        "cli_main": "~.cli:cli_main",
    },
    "table7_complexity": {
        "cli_main": "~.cli:cli_main",
    },
    "rowsum_analysis": {
        "cli_main": "~.cli:cli_main",
    },
}


def _moved_name(old: str, name: str):
    """The object the old module ``old`` had as ``name`` that moved out of its new home, or ``_MISSING``."""
    target = MOVED_NAMES.get(old, {}).get(name)
    if target is None:
        return _MISSING
    module, _, attr = target.replace("~.", "attention_zoo.", 1).partition(":")
    value = importlib.import_module(module)
    if attr:
        value = getattr(value, attr)
    warnings.warn(f"{__name__}.{old}.{name} moved to {module}{'.' + attr if attr else ''}; the old path goes in the "
                  "next release", DeprecationWarning, stacklevel=3)
    return value


def _old_names(old: str, module_name: str):
    """A module ``__getattr__`` giving the names ``old`` had that moved elsewhere (``MOVED_NAMES``)."""

    def __getattr__(name: str):
        value = _moved_name(old, name)
        if value is _MISSING:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return value

    return __getattr__


def run_moved(old: str) -> int:
    """``python -m attention_zoo.experiments.<old>``: a note naming the new module, then the new module run as a
    program where it is one, else a pointer to the script that runs it (the old modules had no command line)."""
    new = f"{__name__}.{MOVED[old]}"
    print(f"note: {__name__}.{old} moved to {new}; the old path goes in the next release", file=sys.stderr)
    spec = importlib.util.find_spec(new)
    source = Path(spec.origin).read_text() if spec is not None and spec.origin else ""
    if '__name__ == "__main__"' in source:
        runpy.run_module(new, run_name="__main__", alter_sys=True)
        return 0
    from .protocol import EXPERIMENTS

    script = next((f"reproduce/{e.name}.py" for e in EXPERIMENTS.values() if e.module_path == new), None)
    print(f"note: {new} has no command line of its own; " + (f"run the experiment with `python {script}`" if script
                                                             else "import it from Python"), file=sys.stderr)
    return 0


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{__name__}.{old} moved to {__name__}.{new}; the old path goes in the next release",
                  DeprecationWarning, stacklevel=3)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``attention_zoo.experiments.<old>`` as the module at its new path (the same module object, so
    monkeypatching either name patches both), with a DeprecationWarning."""

    def find_spec(self, fullname, path=None, target=None):
        pkg, _, old = fullname.rpartition(".")
        if pkg != __name__ or old not in MOVED or old in _FAMILIES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        old = spec.name.rpartition(".")[2]
        _warn(old, MOVED[old])
        module = importlib.import_module(f"{__name__}.{MOVED[old]}")
        spec.loader_state = module.__spec__
        if old in MOVED_NAMES and "__getattr__" not in vars(module):  # what moved on out of its new home
            module.__getattr__ = _old_names(old, module.__name__)
        return module

    def get_code(self, fullname):
        """``python -m`` of an old path (runpy asks the loader for code): ``run_moved``."""
        old = fullname.rpartition(".")[2]
        return compile(f"import sys\nfrom {__name__} import run_moved\nsys.exit(run_moved({old!r}))\n",
                       f"<{fullname}>", "exec")

    def exec_module(self, module):
        # The module ran at its new path; the import system stamped the alias's spec on it: give it its own back.
        module.__spec__ = module.__spec__.loader_state


_FAMILIES = ("synthetic", "generation", "efficiency")  # old module names that are now family packages


def forward_old_module(package: str):
    """``__getattr__`` for a family package that has the name of an old flat module: an attribute of that module
    (``from attention_zoo.experiments.synthetic import PRESETS``) still resolves, with a DeprecationWarning."""
    old = package.rpartition(".")[2]
    target = f"{__name__}.{MOVED[old]}"

    def __getattr__(name: str):
        if name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is not None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(target), name, _MISSING)
        if value is _MISSING:
            value = _moved_name(old, name)  # moved on out of the new module
            if value is _MISSING:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            return value
        _warn(old, MOVED[old])
        return value

    return __getattr__


_MISSING = object()
if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
