"""The Hugging Face hosts of ``zoo.swap_attention`` (the protocol is in ``host_adapters.py``): GPT-2 and the Llama
family (``LlamaAttention``, ``MistralAttention``, ``Qwen2Attention``), which share the reading of the block's 4-D mask
and ``use_cache`` by recomputation (``HFCausalAttentionAdapter``). The Llama family hands each attention its rotary
``position_embeddings`` (cos, sin), which reach our attention as ``rotary``.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from .hosts import HostLayout, _fail, _hides_future, _Swapped


def _gpt2_module():
    return sys.modules.get("transformers.models.gpt2.modeling_gpt2")


class HFCausalAttentionAdapter(_Swapped):
    """Shared part of the Hugging Face causal-LM hosts (GPT-2, the Llama family): the block's 4-D mask read back into
    our masks, and ``use_cache`` by recomputation.

    The block hands a 4-D mask (bool True = attend, or float with large negatives) built from causality and the
    2-D ``attention_mask``; it is read back into our ``padding_mask``. With a cache (``use_cache``), the layer's
    attention *inputs* are stored in the ``DynamicCache`` as its keys (with whatever else the recomputation needs as
    its values: nothing for GPT-2, the rotary cos/sin for the Llama family) and the attention runs over the whole
    prefix, returning the new positions: exact for every variant, since they are causal.
    """

    def __init__(self, attn: nn.Module, path: str, layer_idx: int | None):
        super().__init__(attn, path)
        self.cache_idx = layer_idx

    def _extend(self, cache, x: Tensor, extra: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(x, extra) [B,q,·] of the new positions -> the whole prefix's, stored in ``cache`` for the next call."""
        cache_utils = sys.modules.get("transformers.cache_utils")
        if cache_utils is not None and isinstance(cache, cache_utils.EncoderDecoderCache):
            cache = cache.self_attention_cache
        if cache_utils is None or type(cache) is not cache_utils.DynamicCache:
            raise _fail(self.path, f"use_cache: only a DynamicCache is supported after swap_attention, got "
                                   f"{type(cache).__name__}; pass use_cache=False or the default cache")
        if self.cache_idx is None:
            raise _fail(self.path, "use_cache: the host attention has no layer_idx; pass use_cache=False")
        extra = x.new_empty(x.shape[0], x.shape[1], 0) if extra is None else extra
        keys, values = cache.update(x[:, None], extra[:, None], self.cache_idx)  # (B, 1, S, ·): one "head"
        return keys[:, 0], values[:, 0]

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
                raise _fail(self.path, f"attention_mask: the mask lets queries see future keys; {self.host_name} is "
                                       "causal")
            return padding, keep
        return (None if bool(padding.all()) else padding), None

    def _forward(self, hidden_states: Tensor, cache, attention_mask: Tensor | None, rotary_values: Tensor | None
                 ) -> Tensor:
        """The swapped attention on the new positions [B,q,D]; ``rotary_values`` [B,q,2r] (cos; sin) or None."""
        x, q = hidden_states, hidden_states.shape[1]
        if cache is not None:
            x, stored = self._extend(cache, x, rotary_values)
            rotary_values = None if rotary_values is None else stored
        padding, mask = self._masks(attention_mask, x.shape[0], q, x.shape[1])
        if self._stack is not None and x.shape[1] != q:
            raise _fail(self.path, "use_cache: incremental decoding is not supported with a stack-shared attention "
                                   "(its stack context covers the whole sequence); pass use_cache=False")
        rotary = None if rotary_values is None else tuple(rotary_values.chunk(2, dim=-1))
        return self._attend(x, padding, mask, rotary)[:, -q:]

    def _block_input(self, x, mask):
        if not torch.is_tensor(x) or x.dim() != 3:
            return None
        if mask is not None and (not torch.is_tensor(mask) or mask.shape[-1] != x.shape[1]):
            return None  # decoding with a cache: refused by the layer itself
        return x, self._masks(mask, x.shape[0], x.shape[1], x.shape[1])[0]


class GPT2AttentionAdapter(HFCausalAttentionAdapter):
    """Stands in for HF ``GPT2Attention`` (self-attention): ``forward(hidden_states, cache=None,
    attention_mask=None, ...) -> (output, None)``; masks and cache as ``HFCausalAttentionAdapter``."""

    host_name, host_types = "GPT-2", "HF GPT2Attention"

    def __init__(self, attn: nn.Module, path: str, resid_dropout: nn.Module, layer_idx: int | None):
        super().__init__(attn, path, layer_idx)
        self.resid_dropout = resid_dropout

    @classmethod
    def matches(cls, module):
        gpt2 = _gpt2_module()
        return gpt2 is not None and isinstance(module, gpt2.GPT2Attention)

    @classmethod
    def layout(cls, host, path, parent, attr):
        if host.is_cross_attention:
            raise _fail(path, "cross-attention (GPT2Attention with is_cross_attention=True) is not supported")
        why = None
        if abs(host.scaling - host.head_dim**-0.5) > 1e-12:
            why = (f"the host scales logits by {host.scaling:g} (scale_attn_weights / "
                   "scale_attn_by_inverse_layer_idx), ours by head_dim**-0.5")
        # Conv1D stores weights as [in, out]: transpose to nn.Linear's [out, in].
        w = (host.c_attn.weight.t(), host.c_attn.bias, host.c_proj.weight.t(), host.c_proj.bias)
        return HostLayout(host.embed_dim, host.num_heads, host.attn_dropout.p, True, w, why, causal_lm=True)

    @classmethod
    def from_host(cls, attn, path, host):
        return cls(attn, path, host.resid_dropout, host.layer_idx)

    @classmethod
    def is_block(cls, parent, adapter):
        return parent is not None and isinstance(parent, _gpt2_module().GPT2Block)

    def forward(self, hidden_states: Tensor, cache=None, attention_mask: Tensor | None = None,
                encoder_hidden_states: Tensor | None = None, encoder_attention_mask: Tensor | None = None,
                output_attentions: bool | None = False, **kwargs):
        if encoder_hidden_states is not None:
            raise _fail(self.path, "cross-attention (encoder_hidden_states) is not supported")
        cache = kwargs.pop("past_key_values", cache)
        return self.resid_dropout(self._forward(hidden_states, cache, attention_mask, None)), None

    def block_input(self, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        return self._block_input(x, args[2] if len(args) > 2 else kwargs.get("attention_mask"))


# The Llama-family attentions: same projections (q/k/v/o Linear), same call (hidden_states, position_embeddings,
# attention_mask, cache); they differ in biases (Qwen2: q/k/v) and in sliding windows (Mistral, Qwen2).
_LLAMA_FAMILY = (("llama", "LlamaAttention"), ("mistral", "MistralAttention"), ("qwen2", "Qwen2Attention"))


def _llama_classes() -> tuple[type, ...]:
    mods = ((sys.modules.get(f"transformers.models.{m}.modeling_{m}"), name) for m, name in _LLAMA_FAMILY)
    return tuple(getattr(mod, name) for mod, name in mods if mod is not None and hasattr(mod, name))


def _joint_bias(linears: tuple[nn.Linear, ...]) -> Tensor | None:
    """The biases of projections side by side (a missing one as zeros), or None when none has one."""
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat([lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in linears])


class LlamaAttentionAdapter(HFCausalAttentionAdapter):
    """Stands in for HF ``LlamaAttention``, ``MistralAttention`` and ``Qwen2Attention``: ``forward(hidden_states,
    position_embeddings, attention_mask, cache=None, ...) -> (output, None)``.

    The host's rotary ``(cos, sin)`` [B or 1, q, head_dim] of the new positions reach our attention as ``rotary``
    (every variant rotates its own queries and keys, docs/variants.md §0.4); with a cache they are stored beside the
    attention inputs, so the recomputation over the prefix sees each position's own rotation.
    """

    host_name, host_types = "the Llama-family model", "HF LlamaAttention/MistralAttention/Qwen2Attention"

    @classmethod
    def matches(cls, module):
        classes = _llama_classes()
        return bool(classes) and isinstance(module, classes)

    @classmethod
    def layout(cls, host, path, parent, attr):
        cfg = host.config
        D, H, H_kv, dh = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, host.head_dim
        # Qwen2 sets a window per layer (host.sliding_window), Mistral one for the model (config.sliding_window).
        window = host.sliding_window if hasattr(host, "sliding_window") else getattr(cfg, "sliding_window", None)
        if window is not None:
            raise _fail(path, f"sliding_window={window}: sliding-window attention has no counterpart in our "
                              "attentions; build the host with sliding_window=None (Qwen2: use_sliding_window=False)")
        why = None
        if H * dh != D:
            why = f"head_dim={dh} gives an inner width {H * dh} != hidden_size={D}"
        elif H_kv != H:
            why = (f"grouped K/V heads (num_key_value_heads={H_kv} < num_attention_heads={H}) have no counterpart "
                   "in our attentions, which give every head its own keys and values")
        elif abs(host.scaling - dh**-0.5) > 1e-12:
            why = f"the host scales logits by {host.scaling:g}, ours by head_dim**-0.5"
        qkv = (host.q_proj, host.k_proj, host.v_proj)
        w_in = torch.cat([lin.weight for lin in qkv]) if why is None else None  # (3D, D) rows q; k; v
        w = (w_in, _joint_bias(qkv), host.o_proj.weight, host.o_proj.bias)
        return HostLayout(D, H, float(host.attention_dropout), True, w, why, causal_lm=True, rotary_width=dh)

    @classmethod
    def from_host(cls, attn, path, host):
        return cls(attn, path, host.layer_idx)

    @classmethod
    def is_block(cls, parent, adapter):
        return getattr(parent, "self_attn", None) is adapter  # LlamaDecoderLayer and its Mistral/Qwen2 copies

    def forward(self, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor] | None = None,
                attention_mask: Tensor | None = None, cache=None, **kwargs):
        cache = kwargs.pop("past_key_values", cache)
        if position_embeddings is None:
            raise _fail(self.path, "position_embeddings: the host handed no rotary (cos, sin); call the model, not "
                                   "the attention")
        cos, sin = position_embeddings  # (B|1, q, r) each
        rotary = torch.cat([cos, sin], dim=-1).expand(hidden_states.shape[0], -1, -1)  # (B, q, 2r)
        return self._forward(hidden_states, cache, attention_mask, rotary), None

    def block_input(self, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None and cache.get_seq_length(self.cache_idx or 0) > 0:
            return None  # decoding with a cache: refused by the layer itself
        return self._block_input(x, args[1] if len(args) > 1 else kwargs.get("attention_mask"))
