"""DCMHA: Dynamically Composable Multi-Head Attention (Xiao et al. 2024, arXiv 2405.08553; docs/variants.md §3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..registry import register_attention
from .base import AttentionBase, Masks, Rotary, apply_rotary, check_choice, check_positive_int
from .headmix import MixStage, mix_heads, mixed_attention, rezero, softmax_fp32
from .headmix_batched import use_batched
from .headmix_workspace import Workspace
from .seed_axis import by_seed, seeds_of

RMS_EPS = 1e-6  # flax nn.RMSNorm default, as in the reference generator


def query_rows(masks: Masks, rows: slice) -> Masks:
    """The masks restricted to a block of query rows (axis -2; broadcast axes kept)."""

    def pick(t):
        return t if t is None or t.shape[-2] == 1 else t[..., rows, :]

    return Masks(pick(masks.keep), pick(masks.bias), pick(masks.dead), masks.padding, masks.causal, masks.causal_only)


def compose(a: Tensor, qw: tuple | None, kw: tuple | None, static: Tensor | None) -> Tensor:
    """DCMHA ``Compose`` over the head axis of a [B,H,T,S] tensor; every term reads the original ``a``.

    qw = (w1, w2, dd) with w1, w2 [B,T,R,H] and dd [B,T,H] from the query token; kw likewise [B,S,R,H] and
    [B,S,H] from the key token; static is [H_out, H_in]. Returns, at every (t, s),
    a + static a + sum_r w2_r <w1_r, a> (query-wise and key-wise) + (qdd + kdd) * a.
    """
    out = a if static is None else a + mix_heads(static, a)
    gate = None
    if qw is not None:
        w1, w2, dd = qw
        low = torch.einsum("bhts,btrh->btrs", a, w1)  # (B, T, R, S): R projections of the head vector
        out = out + torch.einsum("btrs,btrh->bhts", low, w2)  # (B, H, T, S)
        gate = dd.transpose(1, 2)[..., None]  # (B, H, T, 1)
    if kw is not None:
        w1, w2, dd = kw
        low = torch.einsum("bhts,bsrh->bsrt", a, w1)  # (B, S, R, T)
        out = out + torch.einsum("bsrt,bsrh->bhts", low, w2)  # (B, H, T, S)
        kgate = dd.transpose(1, 2)[:, :, None, :]  # (B, H, 1, S)
        gate = kgate if gate is None else gate + kgate  # (B, H, T, S)
    return out if gate is None else torch.addcmul(out, a, gate)


@register_attention("dcmha")
class DynamicallyComposableMHA(AttentionBase):
    """Dynamically composable MHA: input-dependent cross-head composition of logits and of weights.

    ``paper`` (the JAX ``CrossHeadProjection`` of Caiyun-AI/DCFormer taken as the specification):
    logits = QK^T/sqrt(dh) -> Compose_pre -> mask (finite negative) -> softmax (fp32) -> Compose_post
    -> re-zero masked entries / dead rows -> dropout -> ·V -> out_proj. ``Compose`` = identity + optional
    static H x H + query-wise and key-wise rank-R terms + tanh diagonal gates (see ``compose``). Its weights
    come from a generator with one split c per (stage in {pre, post}) x (side in {query, key}) that is on:
    h_c = GELU(x W1_c) (C = 2RH; ``gelu_approximate="tanh"``, the JAX code's GELU, by default, or ``"none"``,
    the exact GELU of DCFormer's PyTorch code), [w1; w2] = h_c W2_c, w1 RMS-normalised over H (no scale, eps 1e-6),
    gate_c = tanh(x Wd_c); no biases. Init as the reference: W1 ~ N(0, 2/(D+C)),
    W2 ~ N(0, (0.01 * 2/(H+R) / sqrt(C))^2), Wd ~ N(0, (0.005 * sqrt(2/(D+H)))^2), static ~ N(0, 0.01/H),
    so the module starts close to MHA. On the CPU queries are processed in blocks of ``query_chunk`` rows (exact:
    every step is per query row), which bounds the [B,H,chunk,S] intermediates of a no-grad forward (with
    autograd every block's saved tensors stay alive until backward).

    Parameters as built: 4D^2 (+4D bias) + n (D C + 2 R C H + D H) (+ H^2 per stage with ``use_static``),
    n = number of splits. With the defaults (R = 2, C = 4H, n = 4) this is exactly the documented
    4D^2 + 4D + 20DH + 64H^2 (docs/variants.md §3.5; 90,624 at D = 128, H = 8), not an approximation.
    ``bias`` (default True, as every projection of the DAMCHA comparison's block; docs/variants.md §3.3) adds
    the 4D; ``bias=False`` is the references' bias-free q/k/v/o.

    ``damcha_repo`` (the DAMCHA authors' ``DCMHAAttention``): one pre-softmax composition per query,
    alpha = softmax over source heads of Router(x_t) reshaped [H_in, H_out], Router = Linear(D, r) -> tanh
    -> Linear(r, H^2), r = max(4, H // 2); g = sigmoid(Linear(D, H)(x_t)); scores = g * (alpha^T scores)
    + (1 - g) * scores, applied as the single per-query matrix diag(g) alpha^T + diag(1 - g); then mask,
    softmax, dropout, ·V, out_proj. Default init gives alpha ~ 1/H and g ~ 0.5, so it does not start as MHA.
    The paper-only options (rank, use_static, pre/post_compose, query/key_wise, gelu_approximate) must keep their
    defaults.

    Raises:
        ValueError: bad ``flavor``, ``rank``, ``query_chunk``, ``gelu_approximate``, a paper-only option changed under
            ``flavor="damcha_repo"``, or bad sizes/dropout (see ``AttentionBase``).
    """

    needs_full_logits = True
    rotary_ok = True
    flavors = ("paper", "damcha_repo")
    ensemble_parameters = ("dyn_w2",)  # may carry a seed axis (engine.ensemble; use_static models are not grouped)

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        causal: bool = False,
        dropout: float = 0.0,
        *,
        flavor: str = "paper",
        bias: bool = True,
        rank: int = 2,
        use_static: bool = False,
        pre_compose: bool = True,
        post_compose: bool = True,
        query_wise: bool = True,
        key_wise: bool = True,
        gelu_approximate: str = "tanh",
        query_chunk: int = 64,
        max_seq_len: int | None = None,
    ):
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        self.rank = check_positive_int("rank", rank)
        self.query_chunk = check_positive_int("query_chunk", query_chunk)
        self.workspace = Workspace()  # the CPU core's memory kept between steps (not state: not saved or moved)
        self.gelu_approximate = check_choice("gelu_approximate", gelu_approximate, ("tanh", "none"))  # F.gelu's
        switches = {"use_static": use_static, "pre_compose": pre_compose, "post_compose": post_compose,
                    "query_wise": query_wise, "key_wise": key_wise}  # fmt: skip
        for name, value in switches.items():
            if not isinstance(value, bool):
                raise ValueError(f"{name}: expected a bool, got {value!r}")
        if flavor == "damcha_repo":
            defaults = {"rank": 2, "use_static": False, "pre_compose": True, "post_compose": True,
                        "query_wise": True, "key_wise": True, "gelu_approximate": "tanh"}  # fmt: skip
            for name, value in {"rank": rank, "gelu_approximate": gelu_approximate, **switches}.items():
                if value != defaults[name]:
                    raise ValueError(f"{name}: only used by flavor='paper', leave it at {defaults[name]!r}")
        self.bias, self.use_static = bool(bias), use_static
        D, H, R = d_model, n_heads, rank
        self.qkv = nn.Linear(D, 3 * D, bias=bias)  # rows: [W_q; W_k; W_v] (mha.py layout)
        self.out_proj = nn.Linear(D, D, bias=bias)
        self.stages, self.splits = (), ()  # paper composition stages and generator splits
        if flavor == "damcha_repo":
            self.router_dim = max(4, H // 2)
            self.router = nn.Sequential(nn.Linear(D, self.router_dim), nn.Tanh(), nn.Linear(self.router_dim, H * H))
            self.gate = nn.Linear(D, H)
            return
        sides = tuple(s for s, on in (("q", query_wise), ("k", key_wise)) if on)
        # a stage exists if it is on and has a term besides the identity
        self.stages = tuple(
            s for s, on in (("pre", pre_compose), ("post", post_compose)) if on and (sides or use_static)
        )
        self.splits = tuple(f"{stage}_{side}" for stage in self.stages for side in sides)
        n, C = len(self.splits), 2 * R * H
        self.hidden_dim = C
        if n:
            self.dyn_w1 = nn.Linear(D, n * C, bias=False)  # W1_c for every split c, side by side
            self.dyn_w2 = nn.Parameter(torch.empty(n, C, 2 * R * H))  # W2_c: hidden -> [w1; w2] (2R x H)
            self.dyn_d = nn.Linear(D, n * H, bias=False)  # Wd_c: the diagonal gates
        if use_static:
            self.static = nn.Parameter(torch.empty(len(self.stages), H, H))  # [stage, out, in]
        self.reset_composition()

    def reset_composition(self) -> None:
        """The reference's small init (see the class docstring)."""
        D, H, R, C = self.d_model, self.n_heads, self.rank, self.hidden_dim
        with torch.no_grad():
            if self.splits:
                self.dyn_w1.weight.normal_(0.0, (2.0 / (D + C)) ** 0.5)
                self.dyn_w2.normal_(0.0, 0.01 * 2.0 / (H + R) / C**0.5)
                self.dyn_d.weight.normal_(0.0, 0.005 * (2.0 / (D + H)) ** 0.5)
            if self.use_static:
                self.static.normal_(0.0, 0.1 / H**0.5)

    def dynamic_weights(self, x: Tensor) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
        """x [B,T,D] -> {split: (w1 [B,T,R,H] RMS-normalised over H, w2 [B,T,R,H], gate [B,T,H])}."""
        B, T, _ = x.shape
        n, R, H = len(self.splits), self.rank, self.n_heads
        hidden = F.gelu(self.dyn_w1(x), approximate=self.gelu_approximate).view(B, T, n, -1)  # (B, T, n, C)
        S = seeds_of(self.dyn_w2, 3)
        if S:  # a grouped ensemble: one W2 per seed over a seed-major batch
            w = torch.einsum("sbtnc,snck->sbtnk", by_seed(hidden, S), self.dyn_w2).reshape(B, T, n, 2 * R, H)
        else:
            w = torch.einsum("btnc,nck->btnk", hidden, self.dyn_w2).view(B, T, n, 2 * R, H)  # (B, T, n, 2R, H)
        w1, w2 = w.split(R, dim=3)  # (B, T, n, R, H) each
        # the norm in at least fp32 (as flax's RMSNorm): in fp16, w1's tiny squares underflow to 0 and the
        # gradient of rsqrt(0 + eps) overflows
        wf = w1.float() if w1.dtype in (torch.float16, torch.bfloat16) else w1
        w1 = (wf * torch.rsqrt(wf.pow(2).mean(-1, keepdim=True) + RMS_EPS)).to(w1.dtype)
        gate = torch.tanh(self.dyn_d(x)).view(B, T, n, H)  # (B, T, n, H)
        # unbind, not one index per split: its backward is one stack per tensor instead of a zero-filled
        # gradient per split and their sum (kernel launches on an accelerator)
        return dict(zip(self.splits, zip(w1.unbind(2), w2.unbind(2), gate.unbind(2), strict=True), strict=True))

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        B, T, D = x.shape
        q, k, v = self.split_qkv(self.qkv(x))  # (B, H, T, dh) each
        q, k = apply_rotary(q, k, rotary)  # before the logits; Compose mixes relative logits, its weights read x
        q = q * self.head_dim**-0.5  # Compose is linear, so scaling q equals scaling the logits
        k_t = k.transpose(-2, -1)  # (B, H, dh, S)
        dyn = self.dynamic_weights(x) if self.splits else {}
        if self.flavor == "paper":
            stages = []
            for stage in ("pre", "post"):
                if stage not in self.stages:
                    stages += [None, []]
                    continue
                qw, kw = dyn.get(f"{stage}_q", ()), dyn.get(f"{stage}_k", ())
                static = [self.static[self.stages.index(stage)]] if self.use_static else []
                stages += [MixStage(True, self.use_static, bool(qw), bool(kw)), [*static, *qw, *kw]]
            out = mixed_attention(q, k, v, masks, *stages, chunk=self.query_chunk,
                                  dropout=self.dropout_p if self.training else 0.0, workspace=self.workspace)
            return self.out_proj(self.merge_heads(out))
        if self.flavor == "damcha_repo":
            alpha = torch.softmax(self.router(x).view(B, T, self.n_heads, self.n_heads), dim=2)  # (B, T, in, out)
            g = torch.sigmoid(self.gate(x))[..., None]  # (B, T, out, 1)
            eye = torch.eye(self.n_heads, dtype=x.dtype, device=x.device)
            mix = g * alpha.transpose(2, 3) + (1 - g) * eye  # (B, T, out, in)
        # blocks of query rows bound the CPU's temporaries; off the CPU one block, as the paper flavour's batched core
        chunk = T if use_batched(x.device) else self.query_chunk
        outs = []
        for t0 in range(0, T, chunk):
            rows = slice(t0, t0 + chunk)
            m = query_rows(masks, rows)
            logits = q[:, :, rows] @ k_t  # (B, H, c, S)
            if self.flavor == "paper":
                logits = self._compose_stage("pre", logits, dyn, rows)
            else:
                logits = torch.einsum("btoi,bits->bots", mix[:, rows], logits)
            w = softmax_fp32(m.apply(logits, torch.finfo(logits.dtype).min))  # finite: nothing -inf is composed
            w = rezero(self._compose_stage("post", w, dyn, rows), m)  # (B, H, c, S)
            outs.append(self.attn_drop(w) @ v)  # (B, H, c, dh)
        return self.out_proj(self.merge_heads(torch.cat(outs, dim=2)))

    def _compose_stage(self, stage: str, a: Tensor, dyn: dict, rows: slice) -> Tensor:
        if stage not in self.stages:
            return a
        qw = dyn.get(f"{stage}_q")
        qw = None if qw is None else tuple(t[:, rows] for t in qw)
        static = self.static[self.stages.index(stage)] if self.use_static else None
        return compose(a, qw, dyn.get(f"{stage}_k"), static)

    def compute_path(self, device: torch.device, dtype: torch.dtype) -> str:
        return "batched head-mix core" if use_batched(torch.device(device)) else "blocked head-mix core (CPU)"

    def analytic_params(self) -> int:
        D, H = self.d_model, self.n_heads
        mha = 4 * D * D + (4 * D if self.bias else 0)
        if self.flavor == "damcha_repo":
            r = self.router_dim
            return mha + D * r + r + r * H * H + H * H + D * H + H
        C, R, n = self.hidden_dim, self.rank, len(self.splits)
        return mha + n * (D * C + 2 * R * C * H + D * H) + (len(self.stages) * H * H if self.use_static else 0)

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        """Dense forward FLOPs (2 per MAC) on top of MHA's 8TD^2 + 4T^2 D.

        paper: generator 2T n (DC + 2RCH + DH); per stage and (t, s): 2RH + H MACs per side that is on
        (R projections, R expansions, one gate) + H^2 with ``use_static`` -> defaults: 2T(20DH + 64H^2)
        + 40H T^2 (docs/variants.md §3.5). damcha_repo: 2(T(Dr + rH^2) + TDH + T^2 H^2). Softmax, RMS norm,
        GELU/tanh, masking and the identity branch are elementwise and excluded.
        """
        D, H, T = self.d_model, self.n_heads, seq_len
        mha = 8 * T * D * D + 4 * T * T * D
        if self.flavor == "damcha_repo":
            r = self.router_dim
            return batch * (mha + 2 * (T * (D * r + r * H * H) + T * D * H + T * T * H * H))
        C, R, n = self.hidden_dim, self.rank, len(self.splits)
        generator = T * n * (D * C + 2 * R * C * H + D * H)
        per_pair = n * (2 * R * H + H) + (len(self.stages) * H * H if self.use_static else 0)
        return batch * (mha + 2 * (generator + T * T * per_pair))
