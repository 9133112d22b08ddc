"""The host-side adapters of ``zoo.swap_attention`` (see ``adapters.py``): one module per host attention type that
speaks the host's calling convention, converts its masks to ours and owns one of our attention modules as ``.attn``.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn


# ---- host detection ----------------------------------------------------------------------------------------
def _timm_attention_cls():
    mod = sys.modules.get("timm.layers.attention")
    return getattr(mod, "Attention", None)


def _gpt2_module():
    return sys.modules.get("transformers.models.gpt2.modeling_gpt2")


def _host_kind(module: nn.Module) -> str | None:
    if isinstance(module, nn.MultiheadAttention):
        return "torch"
    timm_cls = _timm_attention_cls()
    if timm_cls is not None and type(module) is timm_cls:
        return "timm"
    gpt2 = _gpt2_module()
    if gpt2 is not None and isinstance(module, gpt2.GPT2Attention):
        return "gpt2"
    return None


def _fail(path: str, msg: str) -> ValueError:
    return ValueError(f"{path}: {msg}")


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
class _Swapped(nn.Module):
    """Base of the host adapters: owns ``attn`` (our module), knows its path and its place in a shared stack."""

    def __init__(self, attn: nn.Module, path: str):
        super().__init__()
        self.attn, self.path = attn, path
        self.layer_idx = 0
        object.__setattr__(self, "_stack", None)  # SharedStackContext, referenced (registered on the model)

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

    def _attend(self, x: Tensor, padding_mask: Tensor | None, attn_mask: Tensor | None) -> Tensor:
        stack = self._stack
        if stack is None:
            return self.attn(x, padding_mask, attn_mask)
        ctx = stack.context_for(self, x, padding_mask)
        return self.attn(x, padding_mask, attn_mask, stack_context=ctx)

    # overridden per host: the (x [B,T,D], padding_mask) of the enclosing block's call, or None if unknown
    def block_input(self, args: tuple, kwargs: dict):
        return None

    def extra_repr(self) -> str:
        return f"path={self.path!r}"


class TimmAttentionAdapter(_Swapped):
    """Stands in for ``timm.layers.Attention``: ``forward(x, attn_mask=None, is_causal=False) -> y``.

    timm's ``attn_mask`` is already in our convention (bool True = attend, or float added)."""

    def __init__(self, attn: nn.Module, path: str, proj_drop: nn.Module):
        super().__init__(attn, path)
        self.proj_drop = proj_drop

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

    def __init__(self, attn: nn.Module, path: str, batch_first: bool):
        super().__init__(attn, path)
        self.batch_first = batch_first
        self.embed_dim, self.num_heads = attn.d_model, attn.n_heads

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


class GPT2AttentionAdapter(_Swapped):
    """Stands in for HF ``GPT2Attention`` (self-attention): ``forward(hidden_states, cache=None,
    attention_mask=None, ...) -> (output, None)``.

    The block hands a 4-D mask (bool True = attend, or float with large negatives) built from causality and the
    2-D ``attention_mask``; it is read back into our ``padding_mask``. With a cache (``use_cache``), the layer's
    attention inputs are stored in the ``DynamicCache`` (as keys; values are empty) and the attention runs over
    the whole prefix, returning the new positions: exact for every variant, since they are causal.
    """

    def __init__(self, attn: nn.Module, path: str, resid_dropout: nn.Module, layer_idx: int | None):
        super().__init__(attn, path)
        self.resid_dropout = resid_dropout
        self.cache_idx = layer_idx

    def forward(self, hidden_states: Tensor, cache=None, attention_mask: Tensor | None = None,
                encoder_hidden_states: Tensor | None = None, encoder_attention_mask: Tensor | None = None,
                output_attentions: bool | None = False, **kwargs):
        if encoder_hidden_states is not None:
            raise _fail(self.path, "cross-attention (encoder_hidden_states) is not supported")
        cache = kwargs.pop("past_key_values", cache)
        x, q = hidden_states, hidden_states.shape[1]
        if cache is not None:
            x = self._extend(cache, x)
        padding, mask = self._masks(attention_mask, x.shape[0], q, x.shape[1])
        if self._stack is not None and x.shape[1] != q:
            raise _fail(self.path, "use_cache: incremental decoding is not supported with a stack-shared attention "
                                   "(its stack context covers the whole sequence); pass use_cache=False")
        y = self._attend(x, padding, mask)[:, -q:]
        return self.resid_dropout(y), None

    def _extend(self, cache, x: Tensor) -> Tensor:
        gpt2 = _gpt2_module()
        cache_utils = sys.modules.get("transformers.cache_utils")
        if gpt2 is not None and isinstance(cache, gpt2.EncoderDecoderCache):
            cache = cache.self_attention_cache
        if cache_utils is None or type(cache) is not cache_utils.DynamicCache:
            raise _fail(self.path, f"use_cache: only a DynamicCache is supported after swap_attention, got "
                                   f"{type(cache).__name__}; pass use_cache=False or the default cache")
        if self.cache_idx is None:
            raise _fail(self.path, "use_cache: the host attention has no layer_idx; pass use_cache=False")
        keys, _ = cache.update(x[:, None], x.new_empty(x.shape[0], 1, x.shape[1], 0), self.cache_idx)
        return keys[:, 0]

    def _masks(self, mask: Tensor | None, B: int, q: int, S: int):
        """(padding_mask [B,S] or None, attn_mask or None) from the host's 4-D mask [B,1,q,S]."""
        if mask is None:
            return None, None
        if not torch.is_tensor(mask) or mask.dim() != 4 or mask.shape[-1] != S or mask.shape[-2] != q:
            shape = tuple(mask.shape) if torch.is_tensor(mask) else type(mask).__name__
            raise _fail(self.path, f"attention_mask: expected the block's 4-D mask [B, 1, {q}, {S}], got {shape} "
                                   "(flex-attention block masks are not supported; use attn_implementation='sdpa')")
        if mask.dtype == torch.bool:
            keep = mask
        else:
            keep = mask > torch.finfo(mask.dtype).min / 2
            if bool((mask.masked_fill(~keep, 0.0) != 0).any()):
                raise _fail(self.path, "attention_mask: an additive bias beyond padding and causality cannot be "
                                       "carried over")
        keep = keep.expand(B, -1, -1, -1)
        padding = keep.any(dim=(1, 2))  # key j is real iff some query sees it (the last one sees every real key)
        rows = torch.arange(S - q, S, device=keep.device)
        causal = torch.arange(S, device=keep.device)[None, :] <= rows[:, None]  # [q, S]
        expected = causal[None, None] & padding[:, None, None, :]
        real_rows = padding[:, None, S - q:, None]
        if bool(((keep != expected) & real_rows).any()):
            if q != S:
                raise _fail(self.path, "attention_mask: a custom 4-D mask with a cache is not supported; pass "
                                       "use_cache=False")
            if not _hides_future(keep):
                raise _fail(self.path, "attention_mask: the mask lets queries see future keys; GPT-2 is causal")
            return padding, keep
        return (None if bool(padding.all()) else padding), None

    def block_input(self, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        mask = args[2] if len(args) > 2 else kwargs.get("attention_mask")
        if not torch.is_tensor(x) or x.dim() != 3:
            return None
        if mask is not None and (not torch.is_tensor(mask) or mask.shape[-1] != x.shape[1]):
            return None  # decoding with a cache: refused by the layer itself
        return x, self._masks(mask, x.shape[0], x.shape[1], x.shape[1])[0]
