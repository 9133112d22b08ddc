"""MoA: Mixture of Attention Heads (Zhang et al., "Mixture of Attention Heads: Selecting Attention Heads Per
Token", arXiv 2210.05144; reference code yikangshen/MoA), in two flavours (variants.md §6).

``paper``: E experts, each a query projection W_q^e and an output projection W_o^e; one key/value projection
shared by all experts. A zero-initialised router picks the top-k experts per token; the gates are the full
softmax probabilities of the selected experts (not renormalised). Only the k selected experts are computed:
tokens are grouped by expert and one grouped GEMM runs each expert on its rows (the reference's ParallelLinear;
group offsets stay on the device, so routing needs no host sync where torch's grouped GEMM covers the dtype; the
CPU runs the experts one at a time, so no temporary holds all N·k pairs), so compute scales with k, not E.
Because K and V are shared, the k query "slots" of every token attend in one SDPA call with the slots as heads.
Switch, z and CV balancing losses are returned in ``self.aux_loss``.
Design note: a dense compute-all-E-then-gather path doubles the projection FLOPs at k/E = 1/2 and stops scaling
with k, so the sparse path is the one implemented; on the CPU its cost was the N·k × D temporaries of the gathered
rows, which streaming one expert at a time removes.

``damcha_repo``: the DAMCHA authors' ``MoAAttention`` -- E experts with their own W_q, W_k, W_v, all
computed densely; a biased router picks top-k, the gates are a softmax over the k selected logits; the gated
outputs are concatenated by rank slot into one shared output projection. No auxiliary loss. The authors' module
is always causal (it is a decoder); with ``causal=False`` this harness runs the same computation non-causally.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..registry import register_attention
from .base import (
    AttentionBase,
    Masks,
    Rotary,
    apply_rotary,
    check_positive_int,
    value_shape,
)
from .moa_experts import _expert_linear, _ExpertLinear, grouped_path  # noqa: F401 - re-exported
from .seed_axis import by_seed, seeds_of

_NOISE_EPS = 1e-2  # floor of the noisy-gating std (reference MoE.top_k_gating)
_CV_EPS = 1e-10  # reference cv_squared


def _check_weight(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < math.inf:
        raise ValueError(f"{name}: expected a finite float >= 0, got {value!r}")
    return float(value)


@register_attention("moa")
class MixtureOfAttentionHeads(AttentionBase):
    """Mixture of Attention Heads (MoA, arXiv 2210.05144): per-token top-k routing over attention experts.

    Options: ``n_experts`` E (default 2H), ``top_k`` k (default H). ``paper`` only: ``head_dim`` d_h, the width of
    every expert's query and of the shared key/value (default D/H; the MoA authors use 128 or 256 with 8-12
    experts), ``switch_weight``, ``z_weight``, ``cv_weight`` (aux-loss weights), ``noisy_gating`` (learned Gaussian
    noise on the router logits in training). After every forward ``aux_loss`` holds the weighted balancing loss
    (a zero scalar in ``damcha_repo``) and ``last_expert_load`` the number of real tokens routed to each
    expert ([E], detached). The zero-initialised ``paper`` router gives all experts equal probability at
    step 0; ties are broken towards the lowest expert index (a stable sort: ``torch.topk`` on CPU breaks them
    the other way), so every token starts on experts 0..k-1 until the router and the balancing loss learn.
    A per-head ``attn_mask`` [B,H,T,S] must be identical across heads: experts are not heads.

    Raises:
        ValueError: ``n_experts``/``top_k``/``head_dim`` not positive ints, ``top_k > n_experts``; a negative or
            non-finite aux-loss weight; ``noisy_gating`` or ``head_dim`` set with ``flavor="damcha_repo"``; a per-head
            ``attn_mask`` whose heads differ; and everything ``AttentionBase`` rejects.
    """

    fused_kernel = True
    data_dependent_compute = True
    has_aux_loss = True
    rotary_ok = True
    flavors = ("paper", "damcha_repo")
    # A grouped ensemble (engine.ensemble) holds [S, E, …] experts: seed s's tokens route among its own E experts,
    # run as experts s·E … s·E + E − 1 of one dispatch, and its balancing loss is its own (the losses are summed).
    ensemble_parameters = ("w_q", "w_k", "w_v", "w_o")

    @classmethod
    def fvcore_handles(cls) -> dict:
        """The grouped expert GEMM traces as an opaque PythonOp: (input rows, weights [E, n_in, n_out], pair
        positions, ...) -> every (token, slot) pair runs one n_in×n_out GEMV."""
        def grouped_expert_matmul(inputs, outputs):
            w = value_shape(inputs[1])
            return math.prod(value_shape(inputs[2])) * w[-2] * w[-1]

        return {f"prim::PythonOp.{_ExpertLinear.__name__}": grouped_expert_matmul}

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        causal: bool = False,
        dropout: float = 0.0,
        *,
        flavor: str = "paper",
        n_experts: int | None = None,
        top_k: int | None = None,
        head_dim: int | None = None,
        switch_weight: float = 0.01,
        z_weight: float = 0.001,
        cv_weight: float = 0.0,
        noisy_gating: bool = False,
        max_seq_len: int | None = None,
    ):
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        self.n_experts = check_positive_int("n_experts", 2 * n_heads if n_experts is None else n_experts)
        self.top_k = check_positive_int("top_k", n_heads if top_k is None else top_k)
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k: expected at most n_experts={self.n_experts}, got {self.top_k}")
        self.switch_weight = _check_weight("switch_weight", switch_weight)
        self.z_weight = _check_weight("z_weight", z_weight)
        self.cv_weight = _check_weight("cv_weight", cv_weight)
        if not isinstance(noisy_gating, bool):
            raise ValueError(f"noisy_gating: expected a bool, got {noisy_gating!r}")
        if noisy_gating and flavor == "damcha_repo":
            raise ValueError("noisy_gating: only the 'paper' flavour has noisy gating")
        self.noisy_gating = noisy_gating
        if head_dim is not None:
            if flavor == "damcha_repo":
                raise ValueError("head_dim: only the 'paper' flavour takes it (the DAMCHA authors' code uses D/H)")
            self.head_dim = check_positive_int("head_dim", head_dim)  # replaces the base's D/H
        self.last_expert_load: Tensor | None = None
        D, E, k, dh = d_model, self.n_experts, self.top_k, self.head_dim
        if flavor == "paper":
            self.router = nn.Linear(D, E, bias=False)
            nn.init.zeros_(self.router.weight)
            self.noise = nn.Linear(D, E, bias=False) if noisy_gating else None
            if self.noise is not None:
                nn.init.zeros_(self.noise.weight)
            self.w_q = nn.Parameter(torch.empty(E, D, dh))  # per-expert query projections
            self.w_o = nn.Parameter(torch.empty(E, dh, D))  # per-expert output projections
            for w in (self.w_q, self.w_o):  # xavier per expert matrix (reference ParallelExperts)
                nn.init.uniform_(w, -math.sqrt(6 / (D + dh)), math.sqrt(6 / (D + dh)))
            self.kv = nn.Linear(D, 2 * dh, bias=False)  # rows: [W_k; W_v], shared by all experts
            for w in self.kv.weight.split(dh):
                nn.init.xavier_uniform_(w, gain=2**-0.5)
        else:
            self.router = nn.Linear(D, E)
            self.w_q, self.w_k, self.w_v = (nn.Parameter(torch.empty(E, D, dh)) for _ in range(3))
            for w in (self.w_q, self.w_k, self.w_v):  # the repo's xavier on the (E*D, d_h) view
                nn.init.xavier_uniform_(w.view(E * D, dh))
            self.out_proj = nn.Linear(k * dh, D)

    def check_inputs(self, x, padding_mask, attn_mask):
        padding_mask, attn_mask = super().check_inputs(x, padding_mask, attn_mask)
        if attn_mask is not None and attn_mask.dim() == 4 and attn_mask.shape[1] > 1:
            if not bool((attn_mask == attn_mask[:, :1]).all()):
                raise ValueError("attn_mask: MoA has no fixed heads; a [B,H,T,S] mask must be the same for every head")
            attn_mask = attn_mask[:, :1]  # (B, 1, T, S)
        return padding_mask, attn_mask

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        real = None if masks.padding is None else masks.padding.reshape(-1)  # (B*T,) True = real token
        run = self._paper if self.flavor == "paper" else self._damcha_repo
        return run(x, masks, real, rotary)

    # ---- paper -------------------------------------------------------------------------------------------
    def _paper(self, x: Tensor, masks: Masks, real: Tensor | None, rotary: Rotary | None) -> Tensor:
        B, T, D = x.shape
        N, E, k, dh = B * T, self.n_experts, self.top_k, self.head_dim
        xf = x.reshape(N, D)
        logits = self.router(xf)  # (N, E)
        if self.noise is not None and self.training:
            logits = logits + torch.randn_like(logits) * (F.softplus(self.noise(xf)) + _NOISE_EPS)
        probs = torch.softmax(logits, dim=-1)
        if real is not None:
            probs = probs * real[:, None]  # padded tokens route nowhere and join no statistic
        gates, idx = _top_k(probs, k)  # (N, k): full-softmax probabilities, not renormalised
        S = seeds_of(self.w_q, 3)
        self.aux_loss = self._balance_loss(logits, probs, gates, idx, real, max(S, 1))
        w_q, w_o, flat = self.w_q, self.w_o, idx.reshape(-1)
        if S:  # a grouped ensemble: seed s's experts are experts s·E … s·E + E − 1 of one dispatch
            w_q, w_o = w_q.flatten(0, 1), w_o.flatten(0, 1)  # (S·E, …)
            flat = (by_seed(idx, S) + torch.arange(0, S * E, E, device=idx.device)[:, None, None]).reshape(-1)
        pos = torch.argsort(flat, stable=True)  # (N*k,) pair indices t*k+j grouped by expert
        counts = torch.zeros(w_q.shape[0], dtype=flat.dtype, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        offs = counts.cumsum(0).to(torch.int32)  # (E,) group ends, on device
        q = _expert_linear(xf, w_q, pos, offs, k, 1)  # (N*k, dh) slot layout
        q = q.view(B, T, k, dh).transpose(1, 2)  # (B, k, T, dh): rank slots act as heads
        kv = self.kv(x).view(B, 1, T, 2, dh)  # shared K/V: one "group" that all k slots read (GQA)
        q, k_ = apply_rotary(q, kv[..., 0, :], rotary)  # each expert's query and the shared key
        o = F.scaled_dot_product_attention(  # GQA: no [B,k,T,dh] copies of K/V or of their gradients
            q, k_, kv[..., 1, :], dropout_p=self.dropout_p if self.training else 0.0, enable_gqa=True,
            **masks.sdpa_args(q.dtype),
        )
        o = masks.zero_dead(o).transpose(1, 2) * gates.view(B, T, k, 1)  # (B, T, k, dh)
        y = _expert_linear(o.reshape(N * k, dh), w_o, pos, offs, 1, k)  # (N, D), slots summed
        return y.view(B, T, D)

    def _balance_loss(self, logits: Tensor, probs: Tensor, gates: Tensor, idx: Tensor, real: Tensor | None,
                      n_seeds: int = 1):
        """switch·L_switch + z·L_z + cv·L_cv over real tokens; also records the per-expert load. ``n_seeds`` > 1 (a
        grouped ensemble's seed-major tokens): each seed's loss over its own tokens, summed over the seeds."""
        E = self.n_experts
        routed = torch.zeros_like(probs).scatter(1, idx, 1.0)  # (N, E) one-hot of the selected experts
        lse_sq = torch.logsumexp(logits, dim=-1).square()  # (N,)
        if real is not None:
            routed, lse_sq = routed * real[:, None], lse_sq * real
        if n_seeds > 1:
            return self._seed_balance_loss(probs, gates, idx, real, routed, lse_sq, n_seeds)
        load = routed.sum(0)  # (E,) real tokens routed to each expert
        self.last_expert_load = load.detach().long()
        n_real = float(routed.shape[0]) if real is None else real.sum().clamp_min(1)
        switch = E * (F.normalize(probs.sum(0), p=1, dim=0) * F.normalize(load, p=1, dim=0)).sum()
        z = lse_sq.sum() / n_real
        summed = F.normalize(torch.zeros_like(probs).scatter(1, idx, gates).sum(0), p=1, dim=0)  # (E,)
        cv = summed.var() / (summed.mean().square() + _CV_EPS) if E > 1 else summed.new_zeros(())
        return self.switch_weight * switch + self.z_weight * z + self.cv_weight * cv

    def _seed_balance_loss(self, probs, gates, idx, real, routed, lse_sq, S: int):
        """``_balance_loss`` per seed of a seed-major batch, summed over the seeds (the same terms, on [S, E])."""
        E = self.n_experts
        load = by_seed(routed, S).sum(1)  # (S, E)
        self.last_expert_load = load.detach().long()
        n_real = float(routed.shape[0] // S) if real is None else by_seed(real, S).sum(1).clamp_min(1)
        switch = E * (F.normalize(by_seed(probs, S).sum(1), p=1, dim=1) * F.normalize(load, p=1, dim=1)).sum()
        z = (by_seed(lse_sq, S).sum(1) / n_real).sum()
        summed = F.normalize(by_seed(torch.zeros_like(probs).scatter(1, idx, gates), S).sum(1), p=1, dim=1)
        cv = (summed.var(1) / (summed.mean(1).square() + _CV_EPS)).sum() if E > 1 else summed.new_zeros(())
        return self.switch_weight * switch + self.z_weight * z + self.cv_weight * cv

    # ---- damcha_repo ---------------------------------------------------------------------------------------
    def _damcha_repo(self, x: Tensor, masks: Masks, real: Tensor | None, rotary: Rotary | None) -> Tensor:
        B, T, D = x.shape
        E, k, dh = self.n_experts, self.top_k, self.head_dim
        top, idx = _top_k(self.router(x), k)  # (B, T, k) logits in rank order
        gates = torch.softmax(top, dim=-1)  # renormalised over the k selected
        S = seeds_of(self.w_q, 3)
        if S:  # a grouped ensemble: [S, E, D, dh] experts, one (D, 3E·dh) projection per seed
            w = torch.cat([self.w_q, self.w_k, self.w_v], dim=1).permute(0, 2, 1, 3).reshape(S, D, 3 * E * dh)
            qkv = torch.bmm(by_seed(x, S).reshape(S, -1, D), w).reshape(B, T, 3 * E * dh)
        else:
            w = torch.cat([self.w_q, self.w_k, self.w_v]).permute(1, 0, 2).reshape(D, 3 * E * dh)  # (D, 3E*dh)
            qkv = x @ w
        q, k_, v = self.split_qkv(qkv, heads=E)  # 3 x (B, E, T, dh)
        q, k_ = apply_rotary(q, k_, rotary)
        out = self.sdpa(q, k_, v, masks).transpose(1, 2)  # (B, T, E, dh): every expert, dense
        out = out.gather(2, idx[..., None].expand(B, T, k, dh)) * gates[..., None]  # (B, T, k, dh) by rank
        routed = torch.zeros(B * T, E, device=x.device).scatter(1, idx.reshape(-1, k), 1.0)  # (B*T, E)
        self.last_expert_load = (routed if real is None else routed * real[:, None]).sum(0).long()
        self.aux_loss = x.new_zeros(())
        return self.out_proj(out.reshape(B, T, k * dh))

    # ---- costs ---------------------------------------------------------------------------------------------
    def compute_path(self, device: torch.device, dtype: torch.dtype) -> str:
        return f"experts: {grouped_path(device, dtype)}" if self.flavor == "paper" else ""

    @classmethod
    def routing(cls, replay: list | None = None):
        """Records or replays the top-k routing of every MoA layer (``routing``; ``AttentionBase.routing``)."""
        return routing(replay)

    def compile_fallback(self) -> str | None:
        """``paper``: the top-k dispatch has data-dependent expert group sizes, so the routing breaks the compiled
        graph and the expert GEMMs run per expert between the pieces; measured 1.2-1.4x slower than eager (B=4,
        T=512, D=256, H=8, fwd+bwd, 2 threads, AMD EPYC). ``damcha_repo`` (dense experts) compiles."""
        if self.flavor == "paper":
            return ("MoA paper: data-dependent top-k routing breaks the graph; compiled pieces measured 1.2-1.4x "
                    "slower than eager")
        return None

    def analytic_params(self) -> int:
        """``paper``: 2EDd_h + 2Dd_h + DE (+DE noise router), d_h = ``head_dim``; ``damcha_repo``: 3EDd_h + kd_hD +
        D + DE + E (docs/variants.md §9)."""
        D, E, k, dh = self.d_model, self.n_experts, self.top_k, self.head_dim
        if self.flavor == "paper":
            return 2 * E * D * dh + 2 * D * dh + D * E * (2 if self.noisy_gating else 1)
        return 3 * E * D * dh + k * dh * D + D + D * E + E

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        """Forward FLOPs with k active experts per token (``paper``: noise router counted, as in training)."""
        D, E, k, dh, T = self.d_model, self.n_experts, self.top_k, self.head_dim, seq_len
        if self.flavor == "paper":
            router = 2 * D * E * (2 if self.noisy_gating else 1)
            return batch * (T * (router + 4 * k * D * dh + 4 * D * dh) + 4 * k * dh * T * T)
        return batch * (6 * T * E * D * dh + 4 * E * T * T * dh + 2 * T * D * E + 2 * T * k * dh * D)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, n_experts={self.n_experts}, top_k={self.top_k}, head_dim={self.head_dim}"


_ROUTES: dict | None = None  # inside ``routing``: its state (a plain global, so compiled graphs see None as a constant)


@contextlib.contextmanager
def routing(replay: list[Tensor] | None = None):
    """``AttentionBase.routing`` for MoA: every ``_top_k`` inside records its indices in call order (``replay``
    None: the yielded list fills), or takes them from ``replay`` (the values are then the scores at those indices,
    as the sort would have given them for the same choice).

    Raises:
        ValueError: (on use) a replayed call whose indices do not fit its scores, or more calls than recorded.
    """
    global _ROUTES
    state = {"routes": [] if replay is None else list(replay), "replay": replay is not None, "next": 0}
    outer, _ROUTES = _ROUTES, state
    try:
        yield state["routes"]
    finally:
        _ROUTES = outer


def _top_k(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k values and indices along the last axis, ties broken towards the lower index (stable sort); inside
    ``routing`` the indices are recorded or replayed."""
    state = _ROUTES
    if state is not None and state["replay"]:
        if state["next"] >= len(state["routes"]):
            raise ValueError("routing: more routing decisions than the replayed recording holds")
        idx = state["routes"][state["next"]].to(scores.device)
        state["next"] += 1
        if idx.shape != (*scores.shape[:-1], k):
            raise ValueError(f"routing: a replayed decision of shape {tuple(idx.shape)} for scores "
                             f"{tuple(scores.shape)} and k={k}")
        return scores.gather(-1, idx), idx
    values, idx = scores.sort(dim=-1, descending=True, stable=True)
    if state is not None:
        state["routes"].append(idx[..., :k].detach().clone())
    return values[..., :k], idx[..., :k]
