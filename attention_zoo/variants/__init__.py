"""One module per attention variant; importing this package registers them all."""

from . import (  # noqa: F401  (each registers itself)
    colmha,
    controls,  # noqa: F401, I001  (the control arms, after the variants they extend)
    damcha,
    dcmha,
    mha,
    mma,
    moa,
    tha,
)
from .base import AttentionBase, Masks, StackShare, collect_aux_losses, resolve_masks  # noqa: F401
from .rotary import Rotary, apply_rotary  # noqa: F401
