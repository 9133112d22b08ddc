"""The experiments floor: the framework at this level (``protocol``: the Experiment protocol and its registry;
``launchers``; ``run_all``: the ``reproduce/all.py`` driver; ``results_index``; ``common``: the shared flags and
the store's provenance; ``dryrun``: ``--dry-run``) and one package per experiment family (``synthetic``, ``generation``,
``lm``, ``vision``, ``efficiency``). A family imports the framework and the layers below, never another family.

The modules of the flat layout (``attention_zoo.experiments.<module>``) moved into the family packages; their old
import paths keep working for one release with a ``DeprecationWarning`` (``MOVED`` and the README's changelog)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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
        return module

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
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _warn(old, MOVED[old])
        return value

    return __getattr__


_MISSING = object()
if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
