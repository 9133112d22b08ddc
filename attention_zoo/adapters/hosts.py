"""The host-side adapters of ``zoo.swap_attention`` (see ``adapters.py``): one module per host attention type that
speaks the host's calling convention, converts its masks to ours and owns one of our attention modules as ``.attn``.

Each adapter class declares the host it stands in for through one protocol, which ``swap_attention`` runs without
knowing the host: ``matches(module)`` (is this the host's attention type?), ``layout(host, path, parent, attr)`` (a
``HostLayout``: width, heads, dropout, causality, the projections to copy and why they cannot be, the rotary width
it hands), ``from_host(attn, path, host)`` (the adapter), ``is_block(parent, adapter)`` (whether ``parent`` is a
host block whose call ``block_input`` reads) and ``block_input(args, kwargs)``. Here: the base, timm's and torch's
adapters; the Hugging Face ones (GPT-2, the Llama family) are in ``hf_adapters.py``.
"""

from __future__ import annotations

import abc
import sys
from typing import NamedTuple

import torch
from torch import Tensor, nn


def _fail(path: str, msg: str) -> ValueError:
    return ValueError(f"{path}: {msg}")


class HostLayout(NamedTuple):
    """What a host attention fixes for the attention that replaces it."""

    d_model: int
    n_heads: int
    dropout: float
    causal: bool  # the default of swap_attention's ``causal=``
    weights: tuple  # (w_in [3D, D] rows q; k; v, b_in or None, w_out [D, D], b_out or None), nn.Linear layout
    why_not_copy: str | None  # why the projections cannot be copied faithfully, or None
    causal_lm: bool = False  # a causal language model: causal=False is refused
    rotary_width: int | None = None  # the host hands rotary (cos, sin) of this width to each attention call


# ---- mask helpers ------------------------------------------------------------------------------------------
def _hides_future(keep: Tensor) -> bool:
    """Whether a bool visibility mask [..., T, S] (T == S) hides every future key."""
    T, S = keep.shape[-2:]
    if T != S:
        return False
    future = torch.ones(T, S, dtype=torch.bool, device=keep.device).triu(1)
    return not bool((keep & future).any())


def _is_causal_only(keep: Tensor) -> bool:
    T, S = keep.shape[-2:]
    return T == S and bool((keep == torch.ones(T, S, dtype=torch.bool, device=keep.device).tril()).all())


def _pure_causal(mask: Tensor) -> bool:
    """A mask (our convention) that expresses causality and nothing else (no bias, no other hidden key)."""
    if mask.dtype != torch.bool and bool((mask.isfinite() & (mask != 0)).any()):
        return False
    return _is_causal_only(_visible(mask))


def _visible(mask: Tensor) -> Tensor:
    """Our visibility of a mask in our convention (bool True = visible, or float added, -inf = hidden)."""
    return mask if mask.dtype == torch.bool else ~torch.isneginf(mask)


# ---- the adapters ------------------------------------------------------------------------------------------
class _Swapped(nn.Module, abc.ABC):
    """Base of the host adapters: owns ``attn`` (our module), knows its path and its place in a shared stack."""

    host_name = "?"  # for messages about the host
    host_types = "?"  # the attention types it stands in for, as the list of supported hosts names them

    def __init__(self, attn: nn.Module, path: str):
        super().__init__()
        self.attn, self.path = attn, path
        self.layer_idx = 0
        object.__setattr__(self, "_stack", None)  # SharedStackContext, referenced (registered on the model)

    # ---- the host protocol (module docstring) ----
    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return False

    @classmethod
    @abc.abstractmethod
    def layout(cls, host: nn.Module, path: str, parent: nn.Module | None, attr: str | None) -> HostLayout:
        """The host's geometry and options (every adapter reads its own host type)."""

    @classmethod
    @abc.abstractmethod
    def from_host(cls, attn: nn.Module, path: str, host: nn.Module) -> _Swapped:
        """The adapter around our ``attn``, taking over what it keeps from ``host``."""

    @classmethod
    def is_block(cls, parent: nn.Module | None, adapter: _Swapped) -> bool:
        return False

    @property
    def causal(self) -> bool:
        return self.attn.causal

    def _check_causality(self, causal_call: bool, seq_len: int) -> None:
        if seq_len == 1:
            return  # one position: causal and non-causal attention coincide, so either call is valid
        if causal_call and not self.causal:
            raise _fail(self.path, "called causally (is_causal or a mask hiding every future key) but the swapped "
                                   "attention was built non-causal; pass causal=True to swap_attention")
        if not causal_call and self.causal:
            raise _fail(self.path, "called without a causal mask but the swapped attention was built causal; pass "
                                   "causal=False to swap_attention (or call the host with is_causal=True)")

    def _attend(self, x: Tensor, padding_mask: Tensor | None, attn_mask: Tensor | None, rotary=None) -> Tensor:
        stack = self._stack
        ctx = None if stack is None else stack.context_for(self, x, padding_mask)
        return self.attn(x, padding_mask, attn_mask, stack_context=ctx, rotary=rotary)

    # overridden per host: the (x [B,T,D], padding_mask) of the enclosing block's call, or None if unknown
    def block_input(self, args: tuple, kwargs: dict):
        return None

    def extra_repr(self) -> str:
        return f"path={self.path!r}"


class TimmAttentionAdapter(_Swapped):
    """Stands in for ``timm.layers.Attention``: ``forward(x, attn_mask=None, is_causal=False) -> y``.

    timm's ``attn_mask`` is already in our convention (bool True = attend, or float added)."""

    host_name = host_types = "timm Attention"

    def __init__(self, attn: nn.Module, path: str, proj_drop: nn.Module):
        super().__init__(attn, path)
        self.proj_drop = proj_drop

    @classmethod
    def matches(cls, module):
        timm_cls = getattr(sys.modules.get("timm.layers.attention"), "Attention", None)
        return timm_cls is not None and type(module) is timm_cls

    @classmethod
    def layout(cls, host, path, parent, attr):
        D, H = host.qkv.in_features, host.num_heads
        if host.proj.out_features != D:
            raise _fail(path, f"dim_out={host.proj.out_features} differs from dim={D}; our attentions map D to D")
        why = None
        if host.attn_dim != D:
            why = f"attn_head_dim={host.head_dim} gives an inner width {host.attn_dim} != dim={D}"
        elif not isinstance(host.q_norm, nn.Identity) or not isinstance(host.k_norm, nn.Identity):
            why = "qk_norm has no counterpart in our attention"
        elif not isinstance(host.norm, nn.Identity) or host.gate is not None:
            why = "scale_norm/gated attention has no counterpart in our attention"
        w = (host.qkv.weight, host.qkv.bias, host.proj.weight, host.proj.bias)
        return HostLayout(D, H, host.attn_drop.p, False, w, why)

    @classmethod
    def from_host(cls, attn, path, host):
        return cls(attn, path, host.proj_drop)

    @classmethod
    def is_block(cls, parent, adapter):
        return getattr(parent, "attn", None) is adapter  # timm blocks: forward(x, attn_mask=None, is_causal=False)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        causal_call = bool(is_causal) or (attn_mask is not None and _hides_future(_visible(attn_mask)))
        self._check_causality(causal_call, x.shape[1])
        if attn_mask is not None and causal_call and _pure_causal(attn_mask):
            attn_mask = None  # causality itself is enforced by the causal attention
        return self.proj_drop(self._attend(x, None, attn_mask))

    def block_input(self, args, kwargs):
        x = args[0] if args else kwargs.get("x")
        return (x, None) if torch.is_tensor(x) and x.dim() == 3 else None


class TorchMultiheadAttentionAdapter(_Swapped):
    """Stands in for ``nn.MultiheadAttention`` in self-attention use: ``forward(query, key, value,
    key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True, is_causal=False)
    -> (output, None)``.

    Host conventions: ``key_padding_mask`` bool True = padded (or float, -inf = padded); ``attn_mask`` [T,S] or
    [B·H,T,S], bool True = *not* allowed (or float added). Attributes read by ``nn.TransformerEncoderLayer`` are
    provided; its fused fast path is declined (``_qkv_same_embed_dim=False``, ``in_proj_bias=None``).
    """

    _qkv_same_embed_dim = False  # nn.TransformerEncoder(Layer) fast paths check these and then stay off
    in_proj_bias = None
    in_proj_weight = None

    host_name = host_types = "torch.nn.MultiheadAttention"

    def __init__(self, attn: nn.Module, path: str, batch_first: bool):
        super().__init__(attn, path)
        self.batch_first = batch_first
        self.embed_dim, self.num_heads = attn.d_model, attn.n_heads

    @classmethod
    def matches(cls, module):
        return isinstance(module, nn.MultiheadAttention)

    @classmethod
    def layout(cls, host, path, parent, attr):
        if isinstance(parent, nn.TransformerDecoderLayer) and attr == "multihead_attn":
            raise _fail(path, "cross-attention (TransformerDecoderLayer.multihead_attn) is not supported")
        if not host._qkv_same_embed_dim:
            raise _fail(path, f"kdim/vdim ({host.kdim}/{host.vdim}) differ from embed_dim={host.embed_dim}: a "
                              "cross-attention layout, not supported")
        why = None
        if host.bias_k is not None or host.add_zero_attn:
            why = "add_bias_kv/add_zero_attn (extra key/value slots) has no counterpart in our attention"
        w = (host.in_proj_weight, host.in_proj_bias, host.out_proj.weight, host.out_proj.bias)
        return HostLayout(host.embed_dim, host.num_heads, host.dropout, False, w, why)

    @classmethod
    def from_host(cls, attn, path, host):
        return cls(attn, path, host.batch_first)

    @classmethod
    def is_block(cls, parent, adapter):
        return isinstance(parent, nn.TransformerEncoderLayer)

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                key_padding_mask: Tensor | None = None, need_weights: bool = True, attn_mask: Tensor | None = None,
                average_attn_weights: bool = True, is_causal: bool = False):
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise _fail(self.path, "cross-attention (key/value other than the query) is not supported; swapped "
                                   "attentions are self-attention")
        x, unbatched = query, query.dim() == 2
        if unbatched:
            x = x.unsqueeze(0)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            x = x.transpose(0, 1)
        B, T, _ = x.shape
        padding, bias = self._padding(key_padding_mask, B, T)
        mask = self._attn_mask(attn_mask, B, T)
        causal_call = bool(is_causal) or (mask is not None and _hides_future(_visible(mask)))
        self._check_causality(causal_call, T)
        if mask is not None and causal_call and _pure_causal(mask):
            mask = None  # causality itself is enforced by the causal attention
        if bias is not None:  # a float key_padding_mask with finite non-zero entries: an additive key bias
            bias = bias[:, None, None, :].expand(B, 1, T, T)
            if mask is None:
                mask = bias
            else:
                m = mask if mask.dim() == 4 else mask[None, None]
                m = torch.zeros_like(bias).masked_fill(~m, float("-inf")) if m.dtype == torch.bool else m
                mask = m + bias
        y = self._attend(x, padding, mask)
        if unbatched:
            y = y.squeeze(0)
        elif not self.batch_first:
            y = y.transpose(0, 1)
        return y, None

    def _padding(self, kpm: Tensor | None, B: int, T: int):
        if kpm is None:
            return None, None
        if tuple(kpm.shape) != (B, T):
            raise _fail(self.path, f"key_padding_mask: expected shape [B, S] = {(B, T)}, got {tuple(kpm.shape)}")
        if kpm.dtype == torch.bool:
            return ~kpm, None
        if kpm.is_floating_point():
            padded = torch.isneginf(kpm)
            rest = kpm.masked_fill(padded, 0.0)
            return ~padded, (rest if bool((rest != 0).any()) else None)
        return kpm == 0, None

    def _attn_mask(self, mask: Tensor | None, B: int, T: int) -> Tensor | None:
        if mask is None:
            return None
        if mask.dim() == 3:
            if mask.shape[0] != B * self.num_heads:
                raise _fail(self.path, f"attn_mask: expected [T, S] or [B*num_heads, T, S] = "
                                       f"[{B * self.num_heads}, {T}, {T}], got {tuple(mask.shape)}")
            mask = mask.reshape(B, self.num_heads, T, T)
        if mask.dtype == torch.bool:
            return ~mask  # torch: True = not allowed; ours: True = visible
        if mask.is_floating_point():
            return mask
        return mask == 0

    def block_input(self, args, kwargs):
        src = args[0] if args else kwargs.get("src")
        if not torch.is_tensor(src) or src.dim() != 3:
            return None
        kpm = args[2] if len(args) > 2 else kwargs.get("src_key_padding_mask")
        x = src if self.batch_first else src.transpose(0, 1)
        padding = None if kpm is None else self._padding(kpm, x.shape[0], x.shape[1])[0]
        return x, padding
