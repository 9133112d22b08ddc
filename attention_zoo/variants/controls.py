"""Control arms for deciding the DAMCHA paper's claims (docs/claims.md §Controls).

DAMCHA differs from MHA in three ways at once: a cross-head metric, an MLP that reads the (causal) context mean,
and many more parameters (its generator). A gain over MHA is evidence for the metric only if these controls do not
reproduce it. Each is a registered attention with the ``control`` capability, so ``list_attentions()`` keeps showing
the seven variants and any script runs a control by name (``--variants mha,damcha,mha_pm`` or the token
``controls``):

- ``mha_pm`` (parameter-matched MHA): MHA plus a position-wise MLP D → w → D added to its output (a parallel
  feed-forward: it reads no other position), w solved so the model has DAMCHA's total parameter count for the same
  ``hidden_dims``; shared by the stack when ``share_mlp`` (as DAMCHA's generator is), zero-initialised output so
  the arm starts as MHA.
- ``mha_ctx`` (context-MLP control): MHA plus DAMCHA's own generator MLP — the same widths D → hidden → D², the
  same parameter count — applied to the same context (the mean of the real tokens, or the causal prefix mean, of
  the stack input when shared), its D² outputs averaged in groups of D to one D-vector that is added to the
  attention output at every position. The same extra parameters reading the same statistic, with no metric.
- ``damcha_static`` (static metric): DAMCHA without f(x) (``use_mlp=False``: a learned D×D M0, identity init, one
  for the stack when shared as DAMCHA's generator is), the paper's own ablation, reported as a control.
- ``damcha_bm`` (budget-matched DAMCHA): DAMCHA with a collapsed generator (H·dₕ·dₕ outputs, the functionally
  distinct RowSums) and one hidden layer whose width is solved so the model has MHA's parameter count.
- ``mha_cm`` (compute-matched MHA): ``mha_pm``'s construction with the MLP's width solved from training FLOPs instead
  of parameters: the stack's analytic attention FLOPs equal DAMCHA's (same options, the stack's ``max_seq_len``), for
  the tasks where DAMCHA's generator costs far more compute per token than MHA (causal ones: one call per prefix).
- ``mha_sep`` (separate towers, the positive control of the synthetic λ axis): MHA whose head i reads only the
  i-th slice of its input and writes only the i-th slice of its output (block-diagonal Q, K, V and output
  projections), with the ``subspace_towers`` capability, so a backbone keeps the slices apart in its norms and
  feed-forward too: one tower per subspace, which meet only in the model's pooled head. A task whose error for this
  arm does not rise with the cross-subspace weight does not isolate cross-head interaction.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..registry import register_attention
from .base import AttentionBase, Masks, Rotary, StackShare, autocast_cast, check_positive_int
from .control_modules import ContextMLP, PositionwiseMLP, generator_outputs, mlp_params  # noqa: F401
from .damcha import MBasedAttention
from .damcha_generator import MetricConfig
from .mha import MultiHeadAttention
from .seed_axis import by_seed, seeds_of

DEFAULT_HIDDEN = MetricConfig().hidden_dims  # DAMCHA's default generator widths


def damcha_generator_params(d_model: int, hidden_dims: tuple[int, ...], compact_rank: int = 0) -> int:
    """G of DAMCHA's generator (``mlp`` mode): D → hidden → D² (or 2·D·r)."""
    return mlp_params((d_model, *hidden_dims, generator_outputs(d_model, compact_rank)))


def _hidden(hidden_dims) -> tuple[int, ...]:
    dims = DEFAULT_HIDDEN if hidden_dims is None else hidden_dims
    if not isinstance(dims, (list, tuple)) or not all(isinstance(h, int) and not isinstance(h, bool) and h > 0
                                                       for h in dims):
        raise ValueError(f"hidden_dims: expected a sequence of positive ints, got {hidden_dims!r}")
    return tuple(dims)


# ---- the arms --------------------------------------------------------------------------------------------------
@register_attention("mha_pm")
class ParamMatchedMHA(MultiHeadAttention):
    """Control: MHA + a parallel position-wise MLP sized to DAMCHA's total parameter count (same ``hidden_dims``)."""

    control = True
    stack_shared = True

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, dropout: float = 0.0, *,
                 flavor: str = "paper", bias: bool = True, fused: bool = True, max_seq_len: int | None = None,
                 hidden_dims: tuple[int, ...] | None = None, compact_rank: int = 0, share_mlp: bool = True,
                 stack: StackShare | None = None):
        super().__init__(d_model, n_heads, causal, dropout, flavor=flavor, bias=bias, fused=fused,
                         max_seq_len=max_seq_len)
        stack = StackShare.check(stack)
        self.hidden_dims, self.compact_rank = _hidden(hidden_dims), check_positive_int("compact_rank", compact_rank,
                                                                                        allow_zero=True)
        self.extra: PositionwiseMLP | None = None
        if stack.shared is not None:
            if not isinstance(stack.shared, PositionwiseMLP):
                raise ValueError(f"stack: shared: expected the PositionwiseMLP of build_stack_shared, got "
                                 f"{type(stack.shared).__name__}")
            object.__setattr__(self, "_shared", stack.shared)  # referenced; the stack registers it once
        else:
            self.extra = self.matched_mlp(d_model, self.hidden_dims, self.compact_rank, 1, dropout, bias)

    @staticmethod
    def matched_width(d_model: int, hidden_dims: tuple[int, ...], compact_rank: int, n_layers: int,
                      bias: bool = True) -> int:
        """w of the MLP that gives ``n_layers`` MHA layers (+ the MLP) DAMCHA's attention parameters, G + n·(2D²+2D)
        (V and O with biases plus one generator)."""
        D = d_model
        mha = 4 * D * D + (4 * D if bias else 0)
        target = damcha_generator_params(D, hidden_dims, compact_rank) + n_layers * (2 * D * D + 2 * D - mha)
        return max(0, round((target - D) / (2 * D + 1)))

    @classmethod
    def matched_mlp(cls, d_model, hidden_dims, compact_rank, n_layers, dropout, bias=True) -> PositionwiseMLP | None:
        w = cls.matched_width(d_model, hidden_dims, compact_rank, n_layers, bias)
        return PositionwiseMLP(d_model, w, dropout, n_uses=n_layers) if w > 0 else None

    @classmethod
    def build_stack_shared(cls, *, n_layers: int, d_model: int, n_heads: int, causal: bool, dropout: float = 0.0,
                           share_mlp: bool = True, hidden_dims=None, compact_rank: int = 0, bias: bool = True,
                           **options):
        if not share_mlp:
            return None
        return cls.matched_mlp(d_model, _hidden(hidden_dims), compact_rank, n_layers, dropout, bias)

    @property
    def mlp(self) -> PositionwiseMLP | None:
        return self.extra if self.extra is not None else self.__dict__.get("_shared")

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        y = super()._attend(x, masks, None, rotary)
        return y if self.mlp is None else y + self.mlp(x)

    def analytic_params(self) -> int:
        return super().analytic_params() + (self.extra.analytic_params() if self.extra is not None else 0)

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        own = self.extra.analytic_flops(batch, seq_len) if self.extra is not None else 0
        return super().analytic_flops(batch, seq_len) + own


def damcha_stack_flops(d_model: int, n_heads: int, n_layers: int, causal: bool, seq_len: int, share: bool,
                       options: dict) -> int:
    """Analytic forward FLOPs of a DAMCHA stack's attention for one sequence of ``seq_len`` (its layers and its
    shared generator), built on the meta device (no memory)."""
    import torch

    from ..registry import create_attention, get_attention_spec

    opts = {k: v for k, v in options.items() if k in get_attention_spec("damcha").options}
    with torch.device("meta"):
        shared = MBasedAttention.build_stack_shared(n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                                                    causal=causal, share_mlp=share, **opts)
        layers = [create_attention("damcha", d_model=d_model, n_heads=n_heads, causal=causal, share_mlp=share,
                                   stack=StackShare(shared, i, n_layers), **opts) for i in range(n_layers)]
    own = shared.analytic_flops(1, seq_len) if shared is not None and hasattr(shared, "analytic_flops") else 0
    return own + sum(layer.analytic_flops(1, seq_len) for layer in layers)


REFERENCE_LEN = 64  # mha_cm's matching length where no max_seq_len is given (a layer built on its own)


@register_attention("mha_cm")
class ComputeMatchedMHA(ParamMatchedMHA):
    """Control: MHA + a parallel position-wise MLP whose width gives the stack DAMCHA's analytic attention FLOPs
    (same ``hidden_dims`` and ``compact_rank``, at the stack's ``max_seq_len``; at ``REFERENCE_LEN`` tokens where none
    is given)."""

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, dropout: float = 0.0, *,
                 flavor: str = "paper", bias: bool = True, fused: bool = True, max_seq_len: int | None = None,
                 hidden_dims: tuple[int, ...] | None = None, compact_rank: int = 0, share_mlp: bool = True,
                 stack: StackShare | None = None):
        self._flops_key = (max_seq_len or REFERENCE_LEN, causal, share_mlp)
        super().__init__(d_model, n_heads, causal, dropout, flavor=flavor, bias=bias, fused=fused,
                         max_seq_len=max_seq_len, hidden_dims=hidden_dims, compact_rank=compact_rank,
                         share_mlp=share_mlp, stack=stack)

    def matched_mlp(self, d_model, hidden_dims, compact_rank, n_layers, dropout, bias=True):
        seq_len, causal, share = self._flops_key
        return type(self).flops_mlp(d_model, self.n_heads, hidden_dims, compact_rank, n_layers, dropout, seq_len,
                                    causal, share, bias)

    @staticmethod
    def flops_mlp(d_model, n_heads, hidden_dims, compact_rank, n_layers, dropout, seq_len, causal, share,
                  bias=True) -> PositionwiseMLP | None:
        """The MLP (used by each of ``n_layers`` layers) whose FLOPs make up DAMCHA's surplus over MHA."""
        target = damcha_stack_flops(d_model, n_heads, n_layers, causal, seq_len, share,
                                    {"hidden_dims": hidden_dims, "compact_rank": compact_rank})
        mha = n_layers * (8 * seq_len * d_model * d_model + 4 * seq_len * seq_len * d_model)
        w = max(0, round((target - mha) / (n_layers * 4 * seq_len * d_model)))
        return PositionwiseMLP(d_model, w, dropout, n_uses=n_layers) if w > 0 else None

    @classmethod
    def build_stack_shared(cls, *, n_layers: int, d_model: int, n_heads: int, causal: bool, dropout: float = 0.0,
                           share_mlp: bool = True, hidden_dims=None, compact_rank: int = 0, bias: bool = True,
                           max_seq_len: int | None = None, **options):
        if not share_mlp:
            return None
        return cls.flops_mlp(d_model, n_heads, _hidden(hidden_dims), compact_rank, n_layers, dropout,
                             max_seq_len or REFERENCE_LEN, causal, True, bias)


@register_attention("mha_ctx")
class ContextMLPMHA(MultiHeadAttention):
    """Control: MHA + DAMCHA's generator MLP (same widths and parameters) on the same context mean, added."""

    control = True
    stack_shared = True

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, dropout: float = 0.0, *,
                 flavor: str = "paper", bias: bool = True, fused: bool = True, max_seq_len: int | None = None,
                 hidden_dims: tuple[int, ...] | None = None, compact_rank: int = 0, share_mlp: bool = True,
                 stack: StackShare | None = None):
        super().__init__(d_model, n_heads, causal, dropout, flavor=flavor, bias=bias, fused=fused,
                         max_seq_len=max_seq_len)
        stack = StackShare.check(stack)
        self.hidden_dims = _hidden(hidden_dims)
        rank = check_positive_int("compact_rank", compact_rank, allow_zero=True)
        self.context_mlp: ContextMLP | None = None
        if stack.shared is not None:
            if not isinstance(stack.shared, ContextMLP):
                raise ValueError(f"stack: shared: expected the ContextMLP of build_stack_shared, got "
                                 f"{type(stack.shared).__name__}")
        else:
            self.context_mlp = ContextMLP(d_model, self.hidden_dims, causal, dropout, rank)

    @classmethod
    def build_stack_shared(cls, *, n_layers: int, d_model: int, n_heads: int, causal: bool, dropout: float = 0.0,
                           share_mlp: bool = True, hidden_dims=None, compact_rank: int = 0, **options):
        return ContextMLP(d_model, _hidden(hidden_dims), causal, dropout, compact_rank) if share_mlp else None

    @classmethod
    def stack_context(cls, shared: ContextMLP, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        return shared(x, padding_mask)  # once per forward, on the stack input, like DAMCHA's generator

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        ctx = stack_context if stack_context is not None else self.context_mlp(x, masks.padding)
        return super()._attend(x, masks, None, rotary) + ctx

    def analytic_params(self) -> int:
        own = self.context_mlp.analytic_params() if self.context_mlp is not None else 0
        return super().analytic_params() + own

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        own = self.context_mlp.analytic_flops(batch, seq_len) if self.context_mlp is not None else 0
        return super().analytic_flops(batch, seq_len) + own


@register_attention("damcha_static")
class StaticMetricDAMCHA(MBasedAttention):
    """Control: DAMCHA without f(x) — a learned static D×D metric M0 per layer (identity init)."""

    control = True

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, dropout: float = 0.0, *,
                 flavor: str = "paper", share_mlp: bool = True, stack: StackShare | None = None,
                 max_seq_len: int | None = None):
        super().__init__(d_model, n_heads, causal, dropout, flavor=flavor, use_mlp=False, share_mlp=share_mlp,
                         stack=stack, max_seq_len=max_seq_len)

    extra_options = ()

    @classmethod
    def build_stack_shared(cls, **options):
        return super().build_stack_shared(**{**options, "use_mlp": False})  # one static M0 for a sharing stack


@register_attention("damcha_bm")
class BudgetMatchedDAMCHA(MBasedAttention):
    """Control: DAMCHA whose generator (collapsed, one hidden layer) is narrowed to MHA's parameter count."""

    control = True
    extra_options = ()

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, dropout: float = 0.0, *,
                 flavor: str = "paper", share_mlp: bool = True, stack: StackShare | None = None,
                 max_seq_len: int | None = None):
        # A shared generator (built by build_stack_shared for the whole stack) brings its own width; a layer with its
        # own generator fills one layer's budget.
        width = self.budget_width(d_model, n_heads, 1)
        super().__init__(d_model, n_heads, causal, dropout, flavor=flavor, share_mlp=share_mlp, stack=stack,
                         max_seq_len=max_seq_len, hidden_dims=(width,), collapsed_generator=True)

    @staticmethod
    def budget_width(d_model: int, n_heads: int, n_layers: int) -> int:
        """The hidden width w whose collapsed generator, (D+1)·w + (w+1)·D²/H parameters, fills the n·(2D²+2D)
        attention parameters MHA has beyond DAMCHA's V and O (so the model matches MHA's count)."""
        D, out = d_model, d_model * d_model // n_heads
        budget = n_layers * (2 * D * D + 2 * D)
        return max(1, round((budget - out) / (D + 1 + out)))

    @classmethod
    def build_stack_shared(cls, *, n_layers: int, d_model: int, n_heads: int, causal: bool, dropout: float = 0.0,
                           share_mlp: bool = True, **options):
        if not share_mlp:
            return None
        width = cls.budget_width(d_model, n_heads, n_layers)
        return super().build_stack_shared(n_layers=n_layers, d_model=d_model, n_heads=n_heads, causal=causal,
                                          dropout=dropout, hidden_dims=(width,), collapsed_generator=True)


CONTROL_TARGETS = {"mha_pm": "damcha", "mha_ctx": "damcha", "damcha_bm": "mha"}  # whose parameter count each matches
__all__ = ["CONTROL_TARGETS", "BudgetMatchedDAMCHA", "ContextMLP", "ContextMLPMHA", "ParamMatchedMHA",
           "PositionwiseMLP", "StaticMetricDAMCHA", "damcha_generator_params", "mlp_params"]


@register_attention("mha_sep")
class SeparateTowersAttention(AttentionBase):
    """MHA with block-diagonal projections: head i attends over, and writes to, slice i of the width only."""

    control = True
    fused_kernel = True
    subspace_towers = True
    flavors = ("paper",)
    ensemble_parameters = ("w_qkv", "w_out", "b_qkv", "b_out")  # may carry a seed axis (engine.ensemble)

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, dropout: float = 0.0, *,
                 flavor: str = "paper", bias: bool = True, max_seq_len: int | None = None):
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        H, d = n_heads, self.head_dim
        self.bias = bool(bias)
        self.w_qkv = nn.Parameter(torch.randn(H, d, 3 * d) / d**0.5)  # per head: its slice -> its q, k, v
        self.w_out = nn.Parameter(torch.randn(H, d, d) / d**0.5)  # per head: its output -> its slice
        self.b_qkv = nn.Parameter(torch.zeros(H, 3 * d)) if bias else None
        self.b_out = nn.Parameter(torch.zeros(H, d)) if bias else None

    def _attend(self, x: Tensor, masks: Masks, stack_context) -> Tensor:
        S = seeds_of(self.w_qkv, 3) or 1  # a grouped ensemble: S seeds' weights, the batch seed-major [S·B, ...]
        x, w_qkv, w_out, b_qkv, b_out = autocast_cast(x, self.w_qkv, self.w_out, self.b_qkv, self.b_out)  # as a Linear
        w_qkv, w_out = w_qkv.reshape(S, *w_qkv.shape[-3:]), w_out.reshape(S, *w_out.shape[-3:])
        xs = by_seed(x.unflatten(-1, (self.n_heads, self.head_dim)), S)  # (S, B, T, H, d)
        qkv = torch.einsum("sbthd,shde->sbhte", xs, w_qkv)  # (S, B, H, T, 3d)
        if b_qkv is not None:
            qkv = qkv + b_qkv.reshape(S, 1, self.n_heads, 1, -1)
        q, k, v = qkv.flatten(0, 1).chunk(3, dim=-1)  # (S·B, H, T, d) each
        out = torch.einsum("sbhtd,shde->sbthe", by_seed(self.sdpa(q, k, v, masks), S), w_out)  # (S, B, T, H, d)
        if b_out is not None:
            out = out + b_out.reshape(S, 1, 1, self.n_heads, -1)
        return out.flatten(0, 1).flatten(-2)  # (S·B, T, D)

    def analytic_params(self) -> int:
        D, H = self.d_model, self.n_heads
        return 4 * D * D // H + (4 * D if self.bias else 0)

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        D, H, T = self.d_model, self.n_heads, seq_len
        return batch * (8 * T * D * D // H + 4 * T * T * D)  # block-diagonal projections + QK^T and AV
