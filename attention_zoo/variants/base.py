"""Shared machinery of every attention: input validation, the forward skeleton, the hooks (docs/design.md).

Mask convention (docs/design.md): ``padding_mask`` bool/int [B,T], True = real token; ``attn_mask`` bool/int
(True = visible) or float (added to the logits), shaped [T,S], [B,T,S] or [B,H,T,S]. Everything is
resolved once (``masks.resolve_masks``) into a boolean ``keep`` mask plus a finite additive ``bias``; query rows
with no visible key ("dead" rows) get zero logits before the softmax and zero output after it, so they stay finite.
Rotary positions (``rotary``, ``rotary.py``) reach the variants that declare ``rotary_ok``.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import (  # noqa: F401 - the variants take their checks from here
    _err,
    bool_params,
    check_bool_options,
    check_choice,
    check_fraction,
    check_positive_int,
)
from .autocast import autocast_cast, autocast_enabled, autocast_off  # noqa: F401 - re-exported, as below
from .masks import Masks, resolve_masks  # noqa: F401 - re-exported: the variants take them from here
from .rotary import Rotary, apply_rotary  # noqa: F401 - re-exported, as above


@dataclass(frozen=True)
class StackShare:
    """What a backbone tells one attention layer of its stack (the ``stack`` argument of a ``stack_shared`` variant).

    ``shared``: the module that ``build_stack_shared`` built for the stack, or None when the layers do not share
    (each layer then builds what it needs itself); ``layer_idx``: this layer's position, 0-based; ``n_layers``: the
    depth of the stack. Set by the backbone (``AttentionStack``, an adapter), never a user option: it is not among a
    spec's ``options`` and result cells do not record it.

    Raises:
        ValueError: ``shared`` not a module or None, ``n_layers`` not a positive int, ``layer_idx`` outside
            [0, n_layers).
    """

    shared: nn.Module | None = None
    layer_idx: int = 0
    n_layers: int = 1

    def __post_init__(self):
        if self.shared is not None and not isinstance(self.shared, nn.Module):
            raise _err("stack", f"shared: expected the module built by build_stack_shared or None, got "
                                f"{type(self.shared).__name__}")
        check_positive_int("n_layers", self.n_layers)
        check_positive_int("layer_idx", self.layer_idx, allow_zero=True)
        if self.layer_idx >= self.n_layers:
            raise _err("layer_idx", f"expected < n_layers={self.n_layers}, got {self.layer_idx}")

    @classmethod
    def check(cls, stack) -> StackShare:
        """``stack`` as given to a layer's constructor: None means a layer on its own (index 0 of 1, nothing shared).

        Raises:
            ValueError: ``stack`` neither a StackShare nor None.
        """
        if stack is None:
            return cls()
        if not isinstance(stack, cls):
            raise _err("stack", f"expected a StackShare (set by the backbone) or None, got {stack!r}")
        return stack


def value_shape(value) -> list[int] | None:
    """Shape of a traced TorchScript value (what an fvcore op handle receives), None when the tracer lost it."""
    return value.type().sizes() if value.isCompleteTensor() else None


class AttentionBase(nn.Module, abc.ABC):
    """Base of every registered attention: ``y = attn(x, padding_mask=None, attn_mask=None)``, x,y [B,T,D].

    Subclasses implement ``_attend(x, masks, stack_context)``, ``analytic_params()`` and
    ``analytic_flops(batch, seq_len)`` and set the capability flags below. Optional hooks, with neutral defaults
    here (docs/design.md, "Hooks"): ``extra_keep``, ``get_M_matrices``, ``fvcore_handles``, the stack-sharing
    protocol ``build_stack_shared`` / ``stack_context`` with the ``stack: StackShare`` constructor argument, and
    rotary positions: a variant with ``rotary_ok = True`` implements ``_attend(x, masks, stack_context,
    rotary=None)`` and rotates the queries and keys it forms (``apply_rotary``), whose widths ``rotary_widths()``
    declares.
    """

    # capability flags, read by the registry (see registry.CAPABILITY_FLAGS)
    causal_ok = True
    fused_kernel = False
    needs_full_logits = False
    data_dependent_compute = False
    has_aux_loss = False
    stack_shared = False
    has_metric = False
    rotary_ok = False  # applies the rotary positions handed to forward (``rotary``) to its queries and keys
    # One tower per head slice: the head slices never meet in this attention, and a backbone that reads the flag
    # keeps them apart in its norms and feed-forward too (per-slice), so they meet only in the model's head.
    subspace_towers = False
    # Why a measurement differs from what the formulas lead one to expect; reports print them where it shows.
    flop_count_note = ""  # the FLOP counters vs analytic_flops
    memory_note = ""  # training memory below MHA's
    flavors: tuple[str, ...] = ("paper",)
    registry_name = "?"

    def __init_subclass__(cls, **kwargs):
        """Every variant's ``bool`` options reject non-bools, driven by the constructor's annotations, so a
        string such as ``use_layer_bias="no"`` cannot silently switch an option on."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_checks_bools", False):
            return

        @functools.wraps(init)
        def checked_init(self, *args, **kw):
            check_bool_options(init, args, kw)
            init(self, *args, **kw)

        init._bool_params = bool_params(init)
        checked_init._checks_bools = True
        cls.__init__ = checked_init

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        causal: bool = False,
        dropout: float = 0.0,
        flavor: str = "paper",
        max_seq_len: int | None = None,
    ):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise _err("n_heads", f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if not isinstance(causal, bool):
            raise _err("causal", f"expected a bool, got {causal!r}")
        if causal and not self.causal_ok:
            raise _err("causal", f"{type(self).__name__} does not support causal masking")
        check_choice("flavor", flavor, self.flavors)
        if max_seq_len is not None:
            check_positive_int("max_seq_len", max_seq_len)
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.causal, self.flavor, self.max_seq_len = causal, flavor, max_seq_len
        self.dropout_p = check_fraction("dropout", dropout)
        self.attn_drop = nn.Dropout(self.dropout_p)
        self.aux_loss: Tensor | None = None  # set by forward in variants with has_aux_loss

    # ---- public forward -------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        stack_context=None,
        rotary: Rotary | tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """x [B,T,D] -> y [B,T,D]; outputs at padded query positions are zero. ``rotary``: RoPE ``(cos, sin)``,
        [T, r] or [B, T, r] each, applied to the queries and keys (variants with ``rotary_ok``).

        Raises:
            ValueError: x not a floating [B,T,d_model] tensor of the parameters' dtype (outside autocast) or
                longer than max_seq_len; padding_mask not bool/int [B,T]; attn_mask not bool/int/float of shape
                [T,S], [B,T,S] or [B,H,T,S], or a float mask with NaN or +inf; stack_context given to a variant
                without stack sharing; rotary given to a variant without ``rotary_ok`` or malformed
                (``Rotary.check``).
        """
        padding_mask, attn_mask = self.check_inputs(x, padding_mask, attn_mask)
        if stack_context is not None and not self.stack_shared:
            raise _err("stack_context", f"{type(self).__name__} does not take a stack context")
        if rotary is not None and not self.rotary_ok:
            raise _err("rotary", f"{type(self).__name__} does not apply rotary positions (no rotary_ok capability)")
        rotary = Rotary.check(rotary, x.shape[0], x.shape[1], self.rotary_widths(), x.device)
        if padding_mask is not None:
            # Padded positions join no computation that mixes positions (keys, context means, routing), so
            # whatever they hold (NaN or ±Inf included) cannot reach the real tokens' outputs.
            x = x.masked_fill(~padding_mask[..., None], 0.0)
        B, T, _ = x.shape
        extra = self.extra_keep(T, x.device)
        masks = resolve_masks(B, T, self.n_heads, self.causal, padding_mask, attn_mask, x.device, extra)
        # Only rotary_ok variants take the argument: an attention without positions keeps the three-argument hook.
        y = self._attend(x, masks, stack_context) if rotary is None else self._attend(x, masks, stack_context, rotary)
        if masks.padding is not None:
            y = y.masked_fill(~masks.padding[..., None], 0.0)
        return y

    def check_inputs(self, x, padding_mask, attn_mask):
        if not torch.is_tensor(x) or x.dim() != 3:
            shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
            raise _err("x", f"expected a 3-D tensor [B, T, {self.d_model}], got {shape}")
        if not x.is_floating_point():
            raise _err("x", f"expected a floating-point dtype, got {x.dtype}")
        param = next(self.parameters(), None)
        if param is not None and x.dtype != param.dtype and not torch.is_autocast_enabled(x.device.type):
            raise _err("x", f"dtype {x.dtype} does not match the module's parameters ({param.dtype}); convert the "
                            f"input or the module with .to()")
        B, T, D = x.shape
        if D != self.d_model:
            raise _err("x", f"expected last dimension d_model={self.d_model}, got {D} (shape {tuple(x.shape)})")
        if T == 0 or B == 0:
            raise _err("x", f"expected non-empty batch and sequence, got shape {tuple(x.shape)}")
        if self.max_seq_len is not None and T > self.max_seq_len:
            raise _err("x", f"sequence length {T} exceeds max_seq_len={self.max_seq_len}")
        if padding_mask is not None:
            if not torch.is_tensor(padding_mask) or tuple(padding_mask.shape) != (B, T):
                got = tuple(padding_mask.shape) if torch.is_tensor(padding_mask) else type(padding_mask).__name__
                raise _err("padding_mask", f"expected shape [B, T] = {(B, T)}, got {got}")
            if padding_mask.is_floating_point() or padding_mask.is_complex():
                raise _err("padding_mask", f"expected a bool or integer dtype, got {padding_mask.dtype}")
            padding_mask = padding_mask.to(device=x.device, dtype=torch.bool)
        if attn_mask is not None:
            if not torch.is_tensor(attn_mask):
                raise _err("attn_mask", f"expected a tensor, got {type(attn_mask).__name__}")
            if attn_mask.is_complex():
                raise _err("attn_mask", f"expected a bool, integer or float dtype, got {attn_mask.dtype}")
            shape = tuple(attn_mask.shape)
            ok = attn_mask.dim() in (2, 3, 4) and shape[-2:] == (T, T)
            if ok and attn_mask.dim() >= 3 and shape[0] not in (1, B):
                ok = False
            if ok and attn_mask.dim() == 4 and shape[1] not in (1, self.n_heads):
                ok = False
            if not ok:
                raise _err(
                    "attn_mask",
                    f"expected shape [T, S], [B, T, S] or [B, H, T, S] = [{B}, {self.n_heads}, {T}, {T}], got {shape}",
                )
            attn_mask = attn_mask.to(x.device)
            if attn_mask.is_floating_point():
                if bool((torch.isnan(attn_mask) | torch.isposinf(attn_mask)).any()):
                    raise _err("attn_mask", "a float mask must be finite or -inf (masked); it contains NaN or +inf")
                attn_mask = attn_mask.to(x.dtype)
        return padding_mask, attn_mask

    # ---- hooks ------------------------------------------------------------------------------------------
    def compile_fallback(self) -> str | None:
        """Why ``torch.compile`` of this attention (as built: flavour and options) is not faster than eager, or None.

        A variant returns a reason when its compiled forward+backward is measured slower than its eager one; the
        benchmark (``attention_zoo.bench`` with ``compile=True``) then times the eager module in the compiled row,
        says why and warns. Default None: compile."""
        return None

    def compute_path(self, device: torch.device, dtype: torch.dtype) -> str:
        """Which implementation runs on ``device`` for inputs of ``dtype``, where that differs by device (THA's and
        DCMHA's blocked CPU core or batched core, MoA's grouped GEMM, per-expert loop or CPU stream); "" where it
        does not. Benchmark rows report it, so a ratio says what it measured."""
        return ""

    def extra_keep(self, seq_len: int, device: torch.device) -> Tensor | None:
        """A variant's own visibility mask broadcastable to [B,H,T,S] (MMA head groups), or None."""
        return None

    def get_M_matrices(self) -> list[tuple[str, Tensor]]:
        """[(name, D×D metric)] for variants with ``has_metric``, for plots; none by default."""
        return []

    def rotary_widths(self) -> tuple[int, ...]:
        """Widths of the query/key vectors this attention rotates (``rotary_ok``); a rotary of width r applies when r
        divides each of them. Default: the head width."""
        return (self.head_dim,)

    @property
    def rotary_dim(self) -> int:
        """The rotary width a backbone builds for this attention (``Decoder(positions="rope")``): the largest width
        dividing the head width and every rotated width, so wider spaces (ColMHA's D̃) rotate head-wide blocks."""
        return math.gcd(self.head_dim, *self.rotary_widths())

    @classmethod
    def bool_options(cls) -> set[str]:
        """Names of the options typed ``bool`` (from the constructor's annotations), which option parsers read
        as true/false/yes/no/1/0. A variant that takes options through ``**kwargs`` adds its own."""
        return {name for name, _ in bool_params(getattr(cls.__init__, "__wrapped__", cls.__init__))}

    @classmethod
    def fvcore_handles(cls) -> dict[str, Callable[[list, list], int]]:
        """fvcore op handles for ops this variant emits that fvcore cannot count: ``{op name: handle(inputs,
        outputs) -> MACs}``, e.g. ``"prim::PythonOp.<Function class>"`` for a custom autograd Function (opaque to
        the tracer). ``measure.flops`` collects them from every registered variant. ``value_shape`` reads a
        traced value's shape. None by default."""
        return {}

    @classmethod
    def routing(cls, replay: list | None = None):
        """For a variant whose computation follows data-dependent discrete decisions (``data_dependent_compute``:
        MoA's top-k routing): a context manager under which every such decision its modules make is recorded in
        call order (``replay`` None: it yields the list that fills), or taken from ``replay`` (a list a recording
        filled) instead of being made. A correctness check compares two precisions under the same decisions, so
        a near tie that rounding flips is not taken for a wrong result. None (the default): no such decisions.
        Outside the context nothing changes."""
        return None

    # ---- stack sharing (docs/design.md, "Stack sharing"); used when the class sets ``stack_shared = True`` ------
    # The protocol, as a backbone runs it (models/stack.py; adapters do the same):
    #   shared = cls.build_stack_shared(n_layers=N, d_model=D, n_heads=H, causal=c, dropout=p, **options)
    #   layer_i = cls(D, H, c, p, stack=StackShare(shared, i, N), **options)      # for i in range(N)
    #   per forward: ctx = cls.stack_context(shared, x0, padding_mask) if shared is not None else None,
    #                then layer_i(x_i, padding_mask, attn_mask, stack_context=ctx)
    @classmethod
    def build_stack_shared(cls, *, n_layers: int, d_model: int, n_heads: int, causal: bool, dropout: float = 0.0,
                           **options) -> nn.Module | None:
        """The module one stack of ``n_layers`` layers of this variant shares (DAMCHA: its metric generator), built
        from the same keyword ``options`` as the layers; None when these options share nothing.

        A backbone calls it once, at construction and only when it shares across layers, registers the result
        (so ``.to()``, optimizers and ``state_dict`` see it once) and hands it to every layer inside its
        ``stack`` argument. The layers read what they need from it (its configuration included) instead of
        parsing their own copy. None by default.
        """
        return None

    @classmethod
    def stack_context(cls, shared: nn.Module, x: Tensor, padding_mask: Tensor | None) -> Any:
        """Once per forward, on the stack input x [B,T,D] (after the positional encoding) with a validated bool
        ``padding_mask``: whatever every layer of the stack receives as ``stack_context`` (DAMCHA: the generator's
        context, hidden activations and, where stored, metrics). None (the default) means each layer works from
        its own input."""
        return None

    @abc.abstractmethod
    def _attend(self, x: Tensor, masks: Masks, stack_context) -> Tensor:
        """x [B,T,D] -> y [B,T,D] under the resolved masks (``rotary_ok`` variants: ``_attend(x, masks,
        stack_context, rotary=None)``, with the validated ``Rotary`` or None)."""

    @abc.abstractmethod
    def analytic_params(self) -> int:
        """Parameters of this module as built (shared stack modules excluded), from the closed form."""

    @abc.abstractmethod
    def analytic_flops(self, batch: int, seq_len: int) -> int:
        """Forward FLOPs (2 per multiply-add, dense kernels, softmax/masking excluded) for [batch, seq_len]."""

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}, flavor={self.flavor!r}"

    # ---- helpers for subclasses -------------------------------------------------------------------------
    def split_heads(self, t: Tensor) -> Tensor:
        B, T, _ = t.shape
        return t.view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, d)

    def split_qkv(self, qkv: Tensor, heads: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """A fused [B,T,3·H·d] projection (rows [W_q; W_k; W_v]) -> q, k, v [B,H,T,d] (views). Unbound along the
        q/k/v axis before the heads move, so backward stacks the three gradients straight into the projection's
        layout: one copy, where unbinding a (3, B, H, T, d) permute takes a stack and then a transposing copy."""
        B, T, _ = qkv.shape
        H = self.n_heads if heads is None else heads
        q, k, v = qkv.view(B, T, 3, H, -1).unbind(2)  # (B, T, H, d) each
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def merge_heads(self, t: Tensor) -> Tensor:
        B, H, T, d = t.shape
        return t.transpose(1, 2).reshape(B, T, H * d)  # (B, T, H*d)

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, masks: Masks, scale: float | None = None) -> Tensor:
        """Fused attention core with the harness masks; dead rows give zero output."""
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout_p if self.training else 0.0, scale=scale, **masks.sdpa_args(q.dtype)
        )
        return masks.zero_dead(out)

    def softmax_attention(self, scores: Tensor, v: Tensor, masks: Masks, neg: float | None = None) -> Tensor:
        """Explicit core on given logits [B,H,T,S]: mask, fp32-safe softmax, dropout, ·V."""
        weights = torch.softmax(masks.apply(scores, neg), dim=-1)
        weights = masks.zero_invisible(weights) if masks.dead is not None else weights
        return self.attn_drop(weights) @ v


def collect_aux_losses(model: nn.Module) -> Tensor | None:
    """Sum the ``aux_loss`` set by the last forward of every submodule (each module counted once)."""
    total = None
    for m in model.modules():
        loss = getattr(m, "aux_loss", None)
        if torch.is_tensor(loss):
            total = loss if total is None else total + loss
    return total
