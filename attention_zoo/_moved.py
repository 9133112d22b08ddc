"""Old paths of modules that moved into a package, kept for one release (README changelog): ``import
attention_zoo.<old>`` gives the module at its new path — the same module object — with a DeprecationWarning, and
``python -m attention_zoo.<old>`` runs the new one. Nothing is imported until an old path is asked for."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

PACKAGE = __name__.rpartition(".")[0]
# old module (directly under the package) -> its new home. Remove with the next release.
MOVED = {"host_adapters": "adapters.hosts", "hf_adapters": "adapters.hf", "host_weights": "adapters.weights",
         "_tvshim": "adapters._tvshim", "_tvhook": "adapters._tvhook", "plots_style": "plots.style",
         "bench_plot": "plots.bench"}


def _new(fullname: str) -> str | None:
    pkg, _, old = fullname.rpartition(".")
    return f"{PACKAGE}.{MOVED[old]}" if pkg == PACKAGE and old in MOVED else None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``attention_zoo.<old>`` and loads the module at its new path under it."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if _new(fullname) else None

    def create_module(self, spec):
        new = _new(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release", DeprecationWarning,
                      stacklevel=3)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # The module ran at its new path; the import system stamped the alias's spec on it: give it its own back.
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname):
        """``python -m`` of an old path (runpy asks the loader for code): a note, then the new module as a program."""
        new = _new(fullname)
        note = f"note: {fullname} moved to {new}; the old path goes in the next release"
        return compile(f"import runpy, sys\nprint({note!r}, file=sys.stderr)\n"
                       f"runpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n", f"<{fullname}>", "exec")


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
