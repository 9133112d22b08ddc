"""User variants from outside the package: ``--include`` on every CLI and the ``attention_zoo.variants`` entry-point
group.

A plugin is a module (a dotted import path or a ``.py`` file) that registers one or more attentions with
``@register_attention`` when imported. ``load_plugins`` imports it and records it in ``$ATTENTION_ZOO_INCLUDE``, so
every process started afterwards (the memory-measuring subprocesses, worker pools) imports it too when it imports
``attention_zoo``. Installed packages can instead declare, in their ``pyproject.toml``::

    [project.entry-points."attention_zoo.variants"]
    mine = "my_package.my_attention"

and are loaded when ``attention_zoo`` is imported.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import warnings
import zlib
from pathlib import Path

ENV = "ATTENTION_ZOO_INCLUDE"
GROUP = "attention_zoo.variants"
_loaded: set[str] = set()


def module_name(path: Path) -> str:
    """The module name a ``.py`` plugin is imported under (one per file)."""
    return f"attention_zoo_plugin_{zlib.crc32(str(path.resolve()).encode()):08x}_{path.stem}"


def _failed(spec: str, exc: BaseException) -> ValueError:
    return ValueError(f"include: {spec!r} failed to import ({type(exc).__name__}: {' '.join(str(exc).split())})")


def _import(spec: str) -> None:
    """Import a plugin; whatever it raises at import (a missing dependency, a bug, a duplicate registration, a
    ``sys.exit``) becomes a ValueError naming it, never a traceback from inside the plugin. Ctrl-C still stops."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise ValueError(f"include: {spec!r} is not a file")
        name = module_name(path)
        if name in sys.modules:
            return
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            del sys.modules[name]
            raise _failed(spec, exc) from exc
        except BaseException:
            del sys.modules[name]
            raise
        return
    try:
        importlib.import_module(spec)
    except ImportError as exc:
        raise ValueError(f"include: cannot import {spec!r} ({exc})") from exc
    except (Exception, SystemExit) as exc:
        raise _failed(spec, exc) from exc


def load_plugins(specs: list[str] | tuple[str, ...]) -> None:
    """Import each plugin once (module path or ``.py`` file) and pass it on to child processes via the environment.

    Raises:
        ValueError: a file that does not exist, or a module that cannot be found or raises anything at import.
    """
    for spec in specs:
        key = str(Path(spec).resolve()) if spec.endswith(".py") else spec
        if key in _loaded:
            continue
        _import(key)
        _loaded.add(key)
        known = [s for s in os.environ.get(ENV, "").split(os.pathsep) if s]
        if key not in known:
            os.environ[ENV] = os.pathsep.join([*known, key])


def load_environment_plugins() -> None:
    """The plugins named in ``$ATTENTION_ZOO_INCLUDE`` and the installed entry points (at package import). A plugin
    that fails to load is reported with a warning instead of breaking every import of the package."""
    specs = [s for s in os.environ.get(ENV, "").split(os.pathsep) if s]
    for spec in specs:
        try:
            load_plugins([spec])
        except Exception as exc:  # noqa: BLE001 - warn, keep the package importable
            warnings.warn(f"attention_zoo: plugin {spec!r} from ${ENV} failed to load: {exc}", stacklevel=2)
    for ep in importlib.metadata.entry_points(group=GROUP):
        if ep.value in _loaded:
            continue
        try:
            ep.load()
            _loaded.add(ep.value)
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"attention_zoo: entry point {ep.name!r} ({ep.value}) failed to load: {exc}", stacklevel=2)


class _IncludeAction(argparse.Action):
    """Imports the plugin as soon as the option is parsed, so later options (``--variants mine``) can use it."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            load_plugins([values])
        except ValueError as exc:
            parser.error(str(exc))
        items = list(getattr(namespace, self.dest, None) or [])
        setattr(namespace, self.dest, [*items, values])


def add_include_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--include", action=_IncludeAction, default=[], metavar="MODULE_OR_FILE",
                   help="import a module or .py file that registers your own attention (repeatable); it is "
                        "available to --variants and to the measuring subprocesses")


__all__ = ["ENV", "GROUP", "add_include_argument", "load_environment_plugins", "load_plugins"]
