"""A stack of transformer blocks around any registered attention, shared by every backbone.

Stack-wise sharing is a capability, not a name check: an attention whose spec has ``stack_shared`` builds one
shared module for the stack (``cls.build_stack_shared``); the stack calls it once on its input (after the
positional encoding) and hands the result to every layer as ``stack_context``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..checks import check_choice, check_fraction, check_positive_int
from ..registry import create_attention, get_attention_spec


@dataclass
class StackConfig:
    d_model: int
    n_layers: int
    n_heads: int
    attention: str = "mha"
    attention_options: dict = field(default_factory=dict)
    share_mlp: bool = True  # one stack-shared module (DAMCHA's metric generator) instead of one per layer
    causal: bool = False
    d_ff: int | None = None  # default 4·d_model
    dropout: float = 0.0  # residual and FFN dropout
    attn_dropout: float = 0.0  # attention-weight dropout
    norm: str = "pre"  # "pre" (GPT-2/ViT) or "post" (the DAMCHA authors' decoder)
    max_seq_len: int | None = None

    def __post_init__(self):
        for name in ("d_model", "n_layers", "n_heads"):
            check_positive_int(name, getattr(self, name))
        if self.d_ff is not None:
            check_positive_int("d_ff", self.d_ff)
        check_fraction("dropout", self.dropout)
        check_fraction("attn_dropout", self.attn_dropout)
        check_choice("norm", self.norm, ("pre", "post"))
        for name in ("share_mlp", "causal"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        if self.attention_options is None:
            self.attention_options = {}
        if not isinstance(self.attention_options, dict):
            raise ValueError(f"attention_options: expected a dict, got {type(self.attention_options).__name__}")
        opt_share = self.attention_options.get("share_mlp")
        if opt_share is not None and opt_share != self.share_mlp:
            raise ValueError(f"share_mlp: backbone share_mlp={self.share_mlp} contradicts attention_options "
                             f"share_mlp={opt_share}")


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__(nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model),
                         nn.Dropout(dropout))


class Block(nn.Module):
    """Pre-LN: x + Attn(LN(x)), x + FFN(LN(x)). Post-LN (docs/variants.md §0.2): LN(x + Attn(x)), LN(x + FFN(x))."""

    def __init__(self, attn: nn.Module, d_model: int, d_ff: int, dropout: float, norm: str):
        super().__init__()
        self.attn, self.pre = attn, norm == "pre"
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None, attn_mask: Tensor | None, stack_context) -> Tensor:
        if self.pre:
            x = x + self.drop(self.attn(self.ln1(x), padding_mask, attn_mask, stack_context=stack_context))
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.drop(self.attn(x, padding_mask, attn_mask, stack_context=stack_context)))
        return self.ln2(x + self.ffn(x))


class AttentionStack(nn.Module):
    """``n_layers`` blocks of one attention variant; returns (hidden [B,T,D], aux_loss scalar)."""

    def __init__(self, cfg: StackConfig):
        super().__init__()
        self.cfg = cfg
        spec = get_attention_spec(cfg.attention)
        opts = {k: v for k, v in cfg.attention_options.items() if k != "share_mlp"}
        common = dict(d_model=cfg.d_model, n_heads=cfg.n_heads, causal=cfg.causal, dropout=cfg.attn_dropout)
        if cfg.max_seq_len is not None and "max_seq_len" in spec.options:
            opts.setdefault("max_seq_len", cfg.max_seq_len)
        self.shared = None
        if spec.stack_shared:
            # Built at construction so .to(), optimizers and state_dict see it before the first forward.
            self.shared = spec.cls.build_stack_shared(n_layers=cfg.n_layers, share=cfg.share_mlp, **common, **opts)
            opts = {**opts, "shared": self.shared, "share_mlp": cfg.share_mlp}
        layers = []
        for i in range(cfg.n_layers):
            layer_opts = {**opts, "layer_idx": i, "n_layers": cfg.n_layers} if spec.stack_shared else opts
            attn = create_attention(cfg.attention, **common, **layer_opts)
            layers.append(Block(attn, cfg.d_model, cfg.d_ff or 4 * cfg.d_model, cfg.dropout, cfg.norm))
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, attn_mask: Tensor | None = None):
        ctx = None
        if self.shared is not None:
            # Validated (and made bool) before the shared generator sees it, as each layer would do.
            padding_mask = self.layers[0].attn.check_inputs(x, padding_mask, None)[0]
            ctx = self.shared.stack_context(x, padding_mask)
        for layer in self.layers:
            x = layer(x, padding_mask, attn_mask, ctx)
        aux = []
        for m in self.modules():  # each module once, so a shared generator's KL counts once
            if torch.is_tensor(getattr(m, "aux_loss", None)):
                aux.append(m.aux_loss)
                m.aux_loss = None  # collected; a graph tensor left on a module would also block deepcopy
        aux_loss = torch.stack(aux).sum() if aux else x.new_zeros(())
        return x, aux_loss

    def attentions(self) -> list[nn.Module]:
        return [layer.attn for layer in self.layers]

    def get_M_matrices(self) -> list[tuple[str, Tensor]]:
        """Per-layer D×D metrics of attentions that have one (empty for baselines)."""
        out = []
        for i, attn in enumerate(self.attentions()):
            if get_attention_spec(self.cfg.attention).has_metric:
                out += [(f"layers.{i}.{name}", M) for name, M in attn.get_M_matrices()]
        return out
