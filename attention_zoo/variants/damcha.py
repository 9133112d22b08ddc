"""DAMCHA: Data-Adaptive Mahalanobis Cross-Head Attention (arXiv 2610.13261; variants.md §7).

Per head i, scores are Mahalanobis-style forms on the raw positional slice X_i of the attention input:
S_i = X_i m_i X_iᵀ / √d_h with m_i = Σ_j M_ij, M = f_θ(context) (see damcha_generator.py). There are no W_q,
W_k; values and output keep the standard V_i = X W_v, Y = concat(A_i V_i) W_o. Because the scores are a dot
product of q_i = X_i m_i with k_i = X_i, the core runs on F.scaled_dot_product_attention, causal included.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor, nn

from ..registry import register_attention
from .base import AttentionBase, Masks, Rotary, StackShare, apply_rotary
from .damcha_generator import MetricConfig, MetricContext, StructuredMLPForM, head_queries


class StaticMetric(nn.Module):
    """One learned static D×D metric M0 (identity init) shared by a stack: DAMCHA "w/o f(x)" with sharing."""

    ensemble_parameters = ("M0",)  # may carry a seed axis (engine.ensemble)

    def __init__(self, d_model: int):
        super().__init__()
        self.M0 = nn.Parameter(torch.eye(d_model))

    def stack_context(self, x: Tensor, padding_mask: Tensor | None) -> None:
        return None  # the layers read M0 itself

    def analytic_params(self) -> int:
        return self.M0.shape[-1] ** 2

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        return 0  # RowSum(M0) is D² additions per forward, not counted (like masks and softmax)


@register_attention("damcha")
class MBasedAttention(AttentionBase):
    """DAMCHA attention layer (the authors' ``MBasedAttention``) with their option names.

    Options: ``use_M`` (False: standard Q/K/V attention), ``use_mlp`` (False: a learnable static D×D M0 per layer,
    identity init), ``share_mlp`` (DAMCHA's name for the backbone's ``share_across_layers``: one generator for
    the stack, or one per layer; read by ``build_stack_shared``, so a layer on its own is unaffected), generator
    options of ``MetricConfig`` (``hidden_dims`` — alias ``mlp_hidden`` —, ``off_diag_mode``, ``diag_scale``,
    ``off_diag_scale``, ``compact_rank``, ``use_layer_bias``, ``layer_bias_rank``, ``free_M``, ``fused_rowsum``,
    ``gen_dropout``, ``off_diag_alpha_init``, ``kl_weight``, ``query_chunk``, ``metric_cache``,
    ``collapsed_generator``), and ``use_multihead_M``, accepted for compatibility with the authors' command line
    and without effect: the per-head RowSum is always used (docs/variants.md §7.5).

    ``stack`` (a ``StackShare``) is set by the backbone: the shared generator (or None: this layer builds its own),
    this layer's ``layer_idx`` (its layer bias) and ``n_layers``. With a shared generator the layer reads the
    generator's configuration; the stack built it from the same options.

    The generator's hidden layers use the layer's ``dropout`` unless ``gen_dropout`` is given, as in the authors'
    code. Block scales (``diag_scale``/``off_diag_scale``, ``set_block_scales``) act on generated metrics only:
    the static M0 (``use_mlp=False``) takes none, as in the authors' code, so non-unit scales are rejected there.

    Raises:
        ValueError: an illegal option value (the message names it), ``hidden_dims`` and ``mlp_hidden`` both given,
            block scales with ``use_mlp=False``, or a ``stack`` that is not a ``StackShare`` or shares something
            other than a metric generator (or one this layer cannot use: ``use_M``/``use_mlp`` False).
    """

    fused_kernel = True
    reference_options = {"fused_rowsum": False}  # the explicit D×D RowSum: the benchmark's correctness gate
    stack_shared = True
    has_metric = True
    has_aux_loss = True  # bayesian off_diag_mode: KL of α
    rotary_ok = True
    flavors = ("paper",)
    extra_options = MetricConfig.names()
    ensemble_parameters = ("M0",)  # the static metric may carry a seed axis (engine.ensemble; see queries)

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, dropout: float = 0.0, *,
                 flavor: str = "paper", use_M: bool = True, use_mlp: bool = True, share_mlp: bool = True,
                 mlp_hidden: tuple[int, ...] | None = None, use_multihead_M: bool = True,
                 stack: StackShare | None = None, max_seq_len: int | None = None, **metric_options):
        # The bool options (share_mlp and use_multihead_M included) are checked by AttentionBase.__init_subclass__.
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        stack = StackShare.check(stack)
        shared = stack.shared
        if shared is not None and not isinstance(shared, (StructuredMLPForM, StaticMetric)):
            raise ValueError(f"stack: shared: expected the StructuredMLPForM or StaticMetric of build_stack_shared, "
                             f"got {type(shared).__name__}")
        if shared is not None and not use_M or isinstance(shared, StructuredMLPForM) and not use_mlp \
                or isinstance(shared, StaticMetric) and use_mlp:
            raise ValueError("stack: a shared metric generator needs use_M=True and use_mlp=True, a shared static "
                             "metric use_M=True and use_mlp=False")
        if isinstance(shared, StructuredMLPForM):
            check_metric_names(mlp_hidden, metric_options)
            cfg = shared.cfg  # built by build_stack_shared from these same options
        else:
            cfg = metric_config(mlp_hidden, metric_options)
        if use_M and not use_mlp and (cfg.diag_scale, cfg.off_diag_scale) != (1.0, 1.0):
            name = "diag_scale" if cfg.diag_scale != 1.0 else "off_diag_scale"
            raise ValueError(f"{name}: block scales act on generated metrics; the static M0 (use_mlp=False) "
                             "takes none, as in the authors' code")
        self.cfg = cfg
        self.use_M, self.use_mlp = use_M, use_mlp
        self.layer_idx, self.n_layers = stack.layer_idx, stack.n_layers
        D = d_model
        self.v_proj = nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)
        self.generator: StructuredMLPForM | None = None
        if not use_M:  # standard Q/K/V attention inside the DAMCHA code path
            self.q_proj, self.k_proj = nn.Linear(D, D), nn.Linear(D, D)
        elif not use_mlp and shared is None:  # "w/o f(x)" and unshared: this layer's static M0, RowSum = I at init
            self.M0 = nn.Parameter(torch.eye(D))
        elif shared is not None:
            # Referenced, not registered: the stack owns it, so it is counted and saved once.
            object.__setattr__(self, "_shared", shared)
        else:
            self.generator = StructuredMLPForM(D, n_heads, causal, self.n_layers, cfg, dropout=dropout)
        self._last_summary: Tensor | None = None

    # ---- stack sharing (AttentionBase's protocol) ------------------------------------------------------------
    @classmethod
    def build_stack_shared(cls, *, n_layers: int, d_model: int, n_heads: int, causal: bool, dropout: float = 0.0,
                           **options) -> StructuredMLPForM | None:
        """One metric generator for the whole stack (with ``use_mlp=False``: one static metric M0 for the stack, the
        paper's "w/o f(x)" that keeps sharing), or None when the options share none: ``share_mlp=False`` (one per
        layer) or ``use_M=False`` (no metric)."""
        if not options.get("share_mlp", True) or not options.get("use_M", True):
            return None
        if not options.get("use_mlp", True):
            return StaticMetric(d_model)
        metric_options = {k: v for k, v in options.items() if k in MetricConfig.names()}
        cfg = metric_config(options.get("mlp_hidden"), metric_options)
        return StructuredMLPForM(d_model, n_heads, causal, n_layers, cfg, dropout=dropout)

    @classmethod
    def stack_context(cls, shared: StructuredMLPForM, x: Tensor, padding_mask: Tensor | None
                      ) -> MetricContext | None:
        """The shared generator's once-per-stack call (None when each layer runs it: ``runs_per_layer``)."""
        return shared.stack_context(x, padding_mask)

    @classmethod
    def bool_options(cls) -> set[str]:
        """The constructor's bool options and those of the generator config, which arrive through ``**kwargs``."""
        return super().bool_options() | {f.name for f in MetricConfig.__dataclass_fields__.values() if f.type == "bool"}

    @classmethod
    def fvcore_handles(cls) -> dict:
        return StructuredMLPForM.fvcore_handles()

    @property
    def metric_generator(self) -> StructuredMLPForM | None:
        if self.generator is not None:
            return self.generator
        shared = self.__dict__.get("_shared")
        return shared if isinstance(shared, StructuredMLPForM) else None

    # ---- forward --------------------------------------------------------------------------------------------
    def _attend(self, x: Tensor, masks: Masks, stack_context: MetricContext | None, rotary: Rotary | None = None
                ) -> Tensor:
        v = self.split_heads(self.v_proj(x))  # (B, H, T, dh)
        if not self.use_M:
            q, k = self.split_heads(self.q_proj(x)), self.split_heads(self.k_proj(x))
        else:
            k = self.split_heads(x)  # (B, H, T, dh): raw positional slices X_i
            q = self.queries(k, x, masks.padding, stack_context)
        # RoPE on q_i = X_i m_i and k_i = X_i per head, after the metric: the context means stay position-free.
        q, k = apply_rotary(q, k, rotary)
        out = self.sdpa(q, k, v, masks)  # softmax(X_i m_i X_iᵀ / √dh) V_i
        return self.out_proj(self.merge_heads(out))

    def queries(self, xh: Tensor, x: Tensor, padding_mask: Tensor | None, stack_context) -> Tensor:
        if not self.use_mlp:
            m = self.static_metrics()
            # A grouped ensemble (engine.ensemble) holds one M0 per seed, [S, D, D], over a seed-major batch.
            m = m[None] if m.dim() == 3 else m.repeat_interleave(xh.shape[0] // m.shape[0], dim=0)
            return head_queries(xh, m)
        gen = self.metric_generator
        ctx = stack_context if stack_context is not None else gen.prepare(x, padding_mask, self.layer_idx)
        self._last_summary = ctx.summary
        return gen.queries(xh, ctx, self.layer_idx)

    def static_metrics(self) -> Tensor:
        """RowSum(M0) as [H, dh, dh] ([S, H, dh, dh] in a grouped ensemble; no block scales on the static metric)."""
        H, dh = self.n_heads, self.head_dim
        blocks = self.static_M0.unflatten(-1, (H, dh)).unflatten(-3, (H, dh))  # (…, H, dh, H, dh)
        return blocks.sum(-2)  # (…, H, dh, dh)

    @property
    def static_M0(self) -> Tensor:
        """This layer's M0, or the stack's shared one."""
        own = self.__dict__.get("_parameters", {}).get("M0")
        return own if own is not None else self.__dict__["_shared"].M0

    # ---- inspection -----------------------------------------------------------------------------------------
    def get_M_matrices(self) -> list[tuple[str, Tensor]]:
        """[(name, D×D metric)]: generated from the last batch's contexts (final prefix when causal), averaged over
        the batch; the static M0 without f(x); [] for use_M=False or before any forward."""
        if not self.use_M:
            return []
        if not self.use_mlp:
            return [("attn.M0", self.static_M0.detach().clone())]
        if self._last_summary is None:
            return []
        return [("attn.M", self.metric_generator.metric_matrix(self._last_summary, self.layer_idx))]

    def get_kl_divergence(self) -> Tensor:
        gen = self.metric_generator
        return gen.kl_divergence() if gen is not None else self.v_proj.weight.new_zeros(())

    # ---- analytic costs -------------------------------------------------------------------------------------
    def _calls_generator(self) -> bool:
        """Whether this layer runs the generator's context + hidden layers itself."""
        gen = self.metric_generator
        return gen is not None and (self.generator is not None or gen.runs_per_layer)

    def analytic_params(self) -> int:
        D = self.d_model
        n = 2 * D * D + 2 * D  # V and O
        if not self.use_M:
            return n + 2 * D * D + 2 * D
        if not self.use_mlp:
            return n + (D * D if "_shared" not in self.__dict__ else 0)  # a shared M0 is the stack's
        return n + (self.generator.analytic_params() if self.generator is not None else 0)

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        D, T, dh = self.d_model, seq_len, self.head_dim
        flops = batch * (4 * T * D * D + 4 * T * T * D)  # V, O projections; scores and A·V
        if not self.use_M:
            return flops + batch * 4 * T * D * D
        flops += batch * 2 * T * D * dh  # q_i = X_i m_i over heads: T·H·dh² MACs
        gen = self.metric_generator
        if gen is None:
            return flops
        if self._calls_generator():
            return flops + gen.trunk_flops(batch, seq_len) + gen.head_flops(batch, seq_len)
        per_layer = gen.causal and not gen.stores_metrics  # "recompute": the final layer runs in every layer
        return flops + (gen.head_flops(batch, seq_len) if per_layer else 0)

    def extra_repr(self) -> str:
        kind = "mha" if not self.use_M else ("static" if not self.use_mlp else
                                             ("shared" if self.generator is None else "own generator"))
        return f"{super().extra_repr()}, metric={kind}, layer_idx={self.layer_idx}"


def check_metric_names(mlp_hidden, metric_options: dict) -> dict:
    """The generator options with ``mlp_hidden`` (the authors' alias of ``hidden_dims``) resolved.

    Raises:
        ValueError: ``mlp_hidden`` not a sequence or contradicting ``hidden_dims``, or an unknown option name.
    """
    metric_options = dict(metric_options)
    if mlp_hidden is not None:
        if not isinstance(mlp_hidden, (list, tuple)):
            raise ValueError(f"mlp_hidden: expected a sequence of positive ints, got {mlp_hidden!r}")
        if "hidden_dims" in metric_options and tuple(metric_options["hidden_dims"]) != tuple(mlp_hidden):
            raise ValueError("mlp_hidden: give hidden_dims or its alias mlp_hidden, not both")
        metric_options["hidden_dims"] = tuple(mlp_hidden)
    unknown = sorted(set(metric_options) - set(MetricConfig.names()))
    if unknown:
        raise ValueError(f"options: damcha does not accept {', '.join(unknown)}")
    return metric_options


def metric_config(mlp_hidden, metric_options: dict) -> MetricConfig:
    """MetricConfig from the layer's keyword options (see ``check_metric_names``)."""
    return MetricConfig(**check_metric_names(mlp_hidden, metric_options))


def set_block_scales(model: nn.Module, diag_scale: float, off_diag_scale: float) -> None:
    """Inference-time block ablation (Table 3): (1, 0) diagonal-only, (0, 1) off-diagonal-only, (1, 1) full.

    Acts on metric generators only (a static M0 takes no block scales).

    Raises:
        ValueError: a scale that is not a finite number, or a model without a metric generator.
    """
    for name, v in (("diag_scale", diag_scale), ("off_diag_scale", off_diag_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name}: expected a finite float, got {v!r}")
    found = False
    for m in model.modules():
        if isinstance(m, StructuredMLPForM):
            m.block_scales = (float(diag_scale), float(off_diag_scale))
            found = True
    if not found:
        raise ValueError("model: no metric generator to scale (baselines and the static M0 take no block scales)")


# ---- inspection for the experiments (App. F–H, the RowSum analysis) ---------------------------------------------
def metric_generators(model: nn.Module) -> list[tuple[str, StructuredMLPForM]]:
    """[(module name, generator)] of every metric generator in ``model``, each once (a shared one under the stack's
    name, e.g. ``stack.shared``; unshared ones under their layers' names)."""
    return [(n or "generator", m) for n, m in model.named_modules() if isinstance(m, StructuredMLPForM)]


def metric_generator(model: nn.Module) -> StructuredMLPForM:
    """The one metric generator of ``model`` (a shared stack's, or a single layer's).

    Raises:
        ValueError: ``model`` has no generator or several (one per layer: use ``metric_generators``).
    """
    gens = metric_generators(model)
    if len(gens) != 1:
        raise ValueError(f"model: expected exactly one metric generator, found {len(gens)}"
                         + (f" ({', '.join(n for n, _ in gens)})" if gens else ""))
    return gens[0][1]


@contextlib.contextmanager
def explicit_rowsum(model: nn.Module):
    """Within the block, every generator of ``model`` runs the explicit D×D path without chunk checkpointing
    (``StructuredMLPForM.inspectable``): same values and gradients, and the metric M stays in the autograd graph."""
    with contextlib.ExitStack() as stack:
        for _, gen in metric_generators(model):
            stack.enter_context(gen.inspectable())
        yield


def block_gradient_norms(model: nn.Module, loss_fn) -> dict[str, Tensor]:
    """{generator name: [H, H] grid of ‖∂L/∂M_ij‖_F} for one evaluation of ``loss_fn(model) -> scalar`` (App. G).

    Taken on the explicit path, where the generator's D² outputs are the metric M before RowSum, so their
    gradient cut into d_h×d_h blocks is ∂L/∂M_ij. Summed over the batch (and positions for causal prefix metrics).

    Raises:
        ValueError: a generator whose output is not M (compact rank, a non-mlp mode, collapsed).
    """
    outputs: dict[str, list[Tensor]] = {}
    hooks = []
    gens = dict(metric_generators(model))
    for name, gen in gens.items():
        if not gen.outputs_metric:
            raise ValueError(f"model: generator {name} does not output M directly (mlp mode, full D² output needed)")

        def keep(_mod, _inp, out, name=name):
            out.retain_grad()
            outputs.setdefault(name, []).append(out)

        hooks.append(gen.out.register_forward_hook(keep))
    try:
        with explicit_rowsum(model):
            model.zero_grad(set_to_none=True)
            loss_fn(model).backward()
    finally:
        for h in hooks:
            h.remove()
    grids = {}
    for name, outs in outputs.items():
        H, dh = gens[name].n_heads, gens[name].head_dim
        # A causal shared generator applies its last layer once per layer to the same M: gradients add up first.
        grad = sum(o.grad for o in outs).unflatten(-1, (H, dh, H, dh)).flatten(0, -5)  # (N, H, dh, H, dh)
        grids[name] = grad.square().sum((0, 2, 4)).sqrt()  # (H, H)
    return grids
