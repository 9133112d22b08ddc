"""One module per attention variant; importing this package registers them all."""

from . import colmha, damcha, dcmha, mha, mma, moa, tha  # noqa: F401  (each registers itself)
from .base import AttentionBase, Masks, StackShare, collect_aux_losses, resolve_masks  # noqa: F401
from .rotary import Rotary, apply_rotary  # noqa: F401
