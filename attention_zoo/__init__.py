"""attention_zoo: seven attention mechanisms behind one registry, and the DAMCHA paper's evidence."""

from . import (
    _tvshim,  # noqa: F401  (must run before anything imports torchvision)
    variants,  # noqa: F401  (registers the variants)
)
from .registry import (
    AttentionSpec,
    create_attention,
    get_attention_spec,
    is_attention,
    list_attentions,
    register_attention,
)
from .variants import AttentionBase, collect_aux_losses

__all__ = [
    "AttentionBase",
    "AttentionSpec",
    "collect_aux_losses",
    "create_attention",
    "get_attention_spec",
    "is_attention",
    "list_attentions",
    "register_attention",
    "models",
]

__version__ = "0.1.0"


def __getattr__(name):  # lazy: `zoo.models` without importing the backbones at package import
    if name == "models":
        import importlib

        return importlib.import_module(".models", __name__)
    raise AttributeError(name)
