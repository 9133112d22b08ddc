"""attention_zoo: seven attention mechanisms behind one registry, and the DAMCHA paper's evidence."""

import os as _os

# Before torch allocates anything: PyTorch's CPU allocator reads this once, at its first allocation, and then backs
# every tensor of >= 2 MiB with transparent huge pages. A buffer allocated afresh each step (DAMCHA's 134 MB
# generator-weight gradient at D = 256) is then faulted in 2 MiB at a time instead of 4 KiB: the largest cost of
# DAMCHA's CPU step beyond MHA's that is not arithmetic. Values are unchanged. Set THP_MEM_ALLOC_ENABLE=0 to opt
# out; every environment record says which applied (docs/conventions.md, "CPU").
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from . import (  # noqa: E402
    _tvshim,  # noqa: F401  (must run before anything imports torchvision)
    variants,  # noqa: F401  (registers the variants)
)
from .adapters import swap_attention  # noqa: E402
from .registry import (  # noqa: E402
    AttentionSpec,
    create_attention,
    get_attention_spec,
    is_attention,
    list_attentions,
    register_attention,
)
from .variants import AttentionBase, Rotary, StackShare, collect_aux_losses  # noqa: E402

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
