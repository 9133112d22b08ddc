"""The drop-in family: ``swap_attention`` puts any registered attention into a host model (``swap``), through the
host protocol and the timm/torch adapters (``hosts``), the Hugging Face adapters (``hf``) and the weight copy and
swap report (``weights``); ``_tvshim`` (and its start-up hook ``_tvhook``) keeps torchvision importable beside the
CPU build of torch. The shim is imported first: nothing here may import torchvision before it."""

from . import _tvshim  # noqa: F401  (must run before anything imports torchvision)
from .hosts import _Swapped  # noqa: F401 - the adapters' base class, for tests and new host adapters
from .swap import SharedStackContext, swap_attention

__all__ = ["SharedStackContext", "swap_attention"]


def __getattr__(name: str):
    """What the old flat ``attention_zoo.adapters`` module held beside the swap API (its imported adapters, constants)
    still resolves from ``swap``, with a DeprecationWarning; the old path goes in the next release."""
    import warnings

    from . import swap

    if name.startswith("__") or not hasattr(swap, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} moved to {__name__}.swap.{name}; the old path goes in the next release",
                  DeprecationWarning, stacklevel=2)
    return getattr(swap, name)
