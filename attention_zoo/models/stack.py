"""A stack of transformer blocks around any registered attention, shared by every backbone.

Stack-wise sharing is a protocol, not a name check (``AttentionBase``, docs/design.md "Stack sharing"): when the
backbone shares across layers and the attention's spec has ``stack_shared``, the stack asks the class for one
shared module (``cls.build_stack_shared``), hands every layer a ``StackShare(shared, layer_idx, n_layers)``, and on
each forward computes ``cls.stack_context(shared, x, padding_mask)`` once on its input (after the positional
encoding), which every layer receives as ``stack_context``.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import torch
from torch import Tensor, nn

from ..checks import check_choice, check_fraction, check_positive_int
from ..registry import create_attention, get_attention_spec
from ..variants.base import Rotary, StackShare, autocast_cast
from ..variants.seed_axis import by_seed, seeds_of


def resolve_share_flag(share_across_layers: bool | None, share_mlp: bool | None) -> bool:
    """The backbone's sharing flag from its generic name and its alias ``share_mlp`` (DAMCHA's name); True when
    neither is given.

    Raises:
        ValueError: a value that is not a bool, or the two names given with different values.
    """
    for name, v in (("share_across_layers", share_across_layers), ("share_mlp", share_mlp)):
        if v is not None and not isinstance(v, bool):
            raise ValueError(f"{name}: expected a bool, got {v!r}")
    if share_across_layers is not None and share_mlp is not None and share_across_layers != share_mlp:
        raise ValueError(f"share_mlp: share_mlp={share_mlp} contradicts share_across_layers={share_across_layers} "
                         "(share_mlp is its alias; give one)")
    return next((v for v in (share_across_layers, share_mlp) if v is not None), True)


@dataclass
class StackConfig:
    d_model: int
    n_layers: int
    n_heads: int
    attention: str = "mha"
    attention_options: dict = field(default_factory=dict)
    # One stack-shared module (a ``stack_shared`` attention's, e.g. DAMCHA's metric generator) instead of one per
    # layer; None means True. ``share_mlp`` is accepted as its alias (the name DAMCHA's options use).
    share_across_layers: bool | None = None
    causal: bool = False
    d_ff: int | None = None  # default 4·d_model
    dropout: float = 0.0  # residual and FFN dropout
    attn_dropout: float = 0.0  # attention-weight dropout
    norm: str = "pre"  # "pre" (GPT-2/ViT) or "post" (the DAMCHA authors' decoder)
    max_seq_len: int | None = None
    share_mlp: InitVar[bool | None] = None

    def __post_init__(self, share_mlp: bool | None):
        for name in ("d_model", "n_layers", "n_heads"):
            check_positive_int(name, getattr(self, name))
        if self.d_ff is not None:
            check_positive_int("d_ff", self.d_ff)
        check_fraction("dropout", self.dropout)
        check_fraction("attn_dropout", self.attn_dropout)
        check_choice("norm", self.norm, ("pre", "post"))
        self.share_across_layers = resolve_share_flag(self.share_across_layers, share_mlp)
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal: expected a bool, got {self.causal!r}")
        if self.attention_options is None:
            self.attention_options = {}
        if not isinstance(self.attention_options, dict):
            raise ValueError(f"attention_options: expected a dict, got {type(self.attention_options).__name__}")
        # The same flag under DAMCHA's option name: it reaches the variant's build_stack_shared with the options, so
        # it must agree with the backbone's.
        opt_share = self.attention_options.get("share_mlp")
        if opt_share is not None and opt_share != self.share_across_layers:
            raise ValueError(f"share_mlp: backbone share_across_layers={self.share_across_layers} contradicts "
                             f"attention_options share_mlp={opt_share}")


# Read access under the alias (the dataclass keeps ``share_mlp`` an init-only argument, so ``replace`` works).
StackConfig.share_mlp = property(lambda self: self.share_across_layers, doc="Alias of ``share_across_layers``.")


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__(nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model),
                         nn.Dropout(dropout))


class SliceNorm(nn.Module):
    """LayerNorm over each of ``groups`` equal slices of the last axis (a ``subspace_towers`` stack): no statistic
    crosses slices. Its weight and bias are D-vectors, as nn.LayerNorm's (with a seed axis in a grouped ensemble)."""

    ensemble_parameters = ("weight", "bias")

    def __init__(self, d_model: int, groups: int):
        super().__init__()
        self.groups = groups
        self.weight, self.bias = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        G, S = self.groups, seeds_of(self.weight, 1) or 1
        xs = by_seed(x.unflatten(-1, (G, -1)), S)  # (S, B, ..., G, D/G)
        y = nn.functional.layer_norm(xs, xs.shape[-1:])
        shape = (S,) + (1,) * (y.dim() - 3) + (G, -1)
        return (y * self.weight.reshape(shape) + self.bias.reshape(shape)).flatten(0, 1).flatten(-2)  # (S·B, ..., D)


class SliceFeedForward(nn.Module):
    """A feed-forward network per slice (``groups`` towers, d_ff/groups hidden units each): block-diagonal weights,
    so no slice reads another."""

    ensemble_parameters = ("w1", "b1", "w2", "b2")

    def __init__(self, d_model: int, d_ff: int, dropout: float, groups: int):
        super().__init__()
        d, f = d_model // groups, max(1, d_ff // groups)
        self.groups = groups
        self.w1 = nn.Parameter(torch.randn(groups, d, f) / d**0.5)
        self.b1 = nn.Parameter(torch.zeros(groups, f))
        self.w2 = nn.Parameter(torch.randn(groups, f, d) / f**0.5)
        self.b2 = nn.Parameter(torch.zeros(groups, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        G, S = self.groups, seeds_of(self.w1, 3) or 1
        x, w1, w2, b1, b2 = autocast_cast(x, self.w1, self.w2, self.b1, self.b2)  # the dtype a Linear would compute in
        xs = by_seed(x.unflatten(-1, (G, -1)), S).flatten(1, -3)  # (S, N, G, d)
        w1, w2 = w1.reshape(S, *w1.shape[-3:]), w2.reshape(S, *w2.shape[-3:])
        b1, b2 = b1.reshape(S, 1, G, -1), b2.reshape(S, 1, G, -1)
        h = self.drop(nn.functional.gelu(torch.einsum("sngd,sgdf->sngf", xs, w1) + b1))
        y = self.drop(torch.einsum("sngf,sgfd->sngd", h, w2) + b2)  # (S, N, G, d)
        return y.reshape(*x.shape)  # (S·B, ..., D)


class Block(nn.Module):
    """Pre-LN: x + Attn(LN(x)), x + FFN(LN(x)). Post-LN (docs/variants.md §0.2): LN(x + Attn(x)), LN(x + FFN(x)).
    ``towers`` > 1 (a ``subspace_towers`` attention): per-slice norms and feed-forward, one tower per head slice."""

    def __init__(self, attn: nn.Module, d_model: int, d_ff: int, dropout: float, norm: str, towers: int = 1):
        super().__init__()
        self.attn, self.pre = attn, norm == "pre"
        if towers > 1:
            self.ln1, self.ln2 = SliceNorm(d_model, towers), SliceNorm(d_model, towers)
            self.ffn = SliceFeedForward(d_model, d_ff, dropout, towers)
        else:
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.ffn = FeedForward(d_model, d_ff, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None, attn_mask: Tensor | None, stack_context,
                rotary: Rotary | None = None) -> Tensor:
        kw = {"stack_context": stack_context, "rotary": rotary}
        if self.pre:
            x = x + self.drop(self.attn(self.ln1(x), padding_mask, attn_mask, **kw))
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.drop(self.attn(x, padding_mask, attn_mask, **kw)))
        return self.ln2(x + self.ffn(x))


class AttentionStack(nn.Module):
    """``n_layers`` blocks of one attention variant; returns (hidden [B,T,D], aux_loss scalar).

    ``shared``: the module the attention's ``build_stack_shared`` built for this stack (registered here, so it is
    counted and saved once), or None.
    """

    def __init__(self, cfg: StackConfig):
        super().__init__()
        self.cfg = cfg
        spec = get_attention_spec(cfg.attention)
        self._attention_cls = spec.cls
        opts = dict(cfg.attention_options)
        common = dict(d_model=cfg.d_model, n_heads=cfg.n_heads, causal=cfg.causal, dropout=cfg.attn_dropout)
        if cfg.max_seq_len is not None and "max_seq_len" in spec.options:
            opts.setdefault("max_seq_len", cfg.max_seq_len)
        self.shared = None
        if spec.stack_shared and cfg.share_across_layers:
            # Built at construction so .to(), optimizers and state_dict see it before the first forward.
            self.shared = spec.cls.build_stack_shared(n_layers=cfg.n_layers, **common, **opts)
        layers = []
        for i in range(cfg.n_layers):
            stack = StackShare(self.shared, i, cfg.n_layers) if spec.stack_shared else None
            attn = create_attention(cfg.attention, **common, stack=stack, **opts)
            layers.append(Block(attn, cfg.d_model, cfg.d_ff or 4 * cfg.d_model, cfg.dropout, cfg.norm,
                                towers=cfg.n_heads if spec.subspace_towers else 1))
        self.layers = nn.ModuleList(layers)
        # Only variants that declare an auxiliary loss set one: the others' stacks skip the collection walk.
        self.collects_aux_loss = spec.has_aux_loss
        self.has_metric = spec.has_metric

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                rotary: Rotary | None = None):
        """x [B,T,D] -> (hidden [B,T,D], aux_loss); ``rotary``: the positions every layer's attention rotates its
        queries and keys by (``rotary_ok`` attentions)."""
        ctx = None
        if self.shared is not None:
            # Validated (and made bool) before the shared module sees it, as each layer would do.
            padding_mask = self.layers[0].attn.check_inputs(x, padding_mask, None)[0]
            ctx = self._attention_cls.stack_context(self.shared, x, padding_mask)
        for layer in self.layers:
            x = layer(x, padding_mask, attn_mask, ctx, rotary)
        aux = []
        if self.collects_aux_loss:
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
        if not self.has_metric:
            return []
        return [(f"layers.{i}.{name}", M) for i, attn in enumerate(self.attentions())
                for name, M in attn.get_M_matrices()]
