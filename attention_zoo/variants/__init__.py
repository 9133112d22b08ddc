"""One module per attention variant; importing this package registers them all."""

from . import mha  # noqa: F401
from .base import AttentionBase, Masks, collect_aux_losses, resolve_masks  # noqa: F401

# Variants register themselves on import; a missing module is a bug, not an optional extra.
for _name in ("tha", "dcmha", "colmha", "mma", "moa", "damcha"):
    try:
        __import__(f"{__name__}.{_name}")
    except ModuleNotFoundError as exc:  # only tolerate the module itself not existing yet
        if exc.name != f"{__name__}.{_name}":
            raise
