"""attention_zoo: seven attention mechanisms behind one registry, and the DAMCHA paper's evidence."""

from . import (
    _moved,  # noqa: F401  (the old paths of moved modules, with a DeprecationWarning)
    variants,  # noqa: F401, I001  (registers the variants)
)
from .adapters import (
    _tvshim,  # noqa: F401, I001  (must run before anything imports torchvision)
    swap_attention,
)
from .registry import (
    AttentionSpec,
    create_attention,
    get_attention_spec,
    is_attention,
    list_attentions,
    register_attention,
)
from .variants import AttentionBase, Rotary, StackShare, collect_aux_losses

__all__ = [
    "AttentionBase",
    "AttentionSpec",
    "Rotary",
    "StackShare",
    "collect_aux_losses",
    "create_attention",
    "get_attention_spec",
    "is_attention",
    "list_attentions",
    "register_attention",
    "swap_attention",
    "models",
    "benchmark",
]

__version__ = "0.1.0"


def __getattr__(name):  # lazy: `zoo.models`, `zoo.benchmark` without importing them at package import
    import importlib

    if name == "models":
        return importlib.import_module(".models", __name__)
    if name == "benchmark":
        return importlib.import_module(".bench", __name__).benchmark
    raise AttributeError(name)


def _load_plugins() -> None:  # last: a plugin imports this package and needs its names defined
    from .plugins import load_environment_plugins

    load_environment_plugins()


_load_plugins()
