r"""Synthetic tasks of the DAMCHA paper's Appendix I (Figures 12–13): four feature subspaces, one per head slice.

The paper gives no generators [U]; these are ours. A sequence has T tokens of width D = 4·d_e, split into four
subspaces X_i = X[:, i·d_e:(i+1)·d_e] (i = 0..3). With H = 4 heads and no input projection, head i's raw
positional slice is exactly subspace i.

**Tokens** (both tasks): every subspace has a per-sequence latent μ_i (its "topic") plus token noise,

    x_{i,t} = μ_i + s·ε_{i,t},   ε_{i,t} ~ N(0, I_{d_e}),   t = 1..T,

so the subspace means x̄_i = (1/T) Σ_t x_{i,t} carry the signal and cross-token aggregation (attention) removes
the token noise. Every random draw comes from a ``torch.Generator`` seeded with ``seed``: the same seed gives
the same data, and the task constants, inputs and target noise do not depend on λ (a λ sweep at one seed
changes only the target's mixing weight).

**Regression** (Figure 12). μ_i ~ N(0, I), so x̄_i ~ N(0, v·I) with v = 1 + s²/T. Task constants: symmetric
A_i = (G_i + G_iᵀ)/2 and B_ij (G, B i.i.d. N(0, 1) entries) for the six pairs i < j. The within-subspace term is
the mean pairwise bilinear similarity of subspace i's tokens, and the cross term that between the tokens of
subspaces i and j:

    f_i(X_i)      = [(1/T²) Σ_{t,u} x_{i,t}ᵀ A_i x_{i,u} − v·tr A_i] / (√2·v·‖A_i‖_F)
                  = (x̄_iᵀ A_i x̄_i − v·tr A_i) / (√2·v·‖A_i‖_F)
    c_ij(X_i,X_j) = [(1/T²) Σ_{t,u} x_{i,t}ᵀ B_ij x_{j,u}] / (v·‖B_ij‖_F) = x̄_iᵀ B_ij x̄_j / (v·‖B_ij‖_F)
    W = ½ Σ_i f_i,   C = (1/√6) Σ_{i<j} c_ij
    y = (W + λ·C)/√(1 + λ²) + σ·η,   η ~ N(0, 1).

Each f_i and c_ij has mean 0 and variance 1 under the token distribution, and they are pairwise uncorrelated
(odd Gaussian moments vanish), so W and C have unit variance, λ is the ratio of cross to within standard
deviation, and the noise-free target has mean 0 and variance 1 at every λ (normalised by constants, not by
batch statistics). The irreducible test MSE is σ². **λ = 0** gives y = ½ Σ_i f_i(X_i) + noise, a sum of
per-subspace functions: every mixed second difference across two subspaces vanishes, so a model whose heads
never exchange information across slices can represent it exactly. **λ > 0** adds the bilinear cross-subspace
terms, whose mixed differences are non-zero.

**Classification** (Figure 13). K = 6 classes, one per unordered subspace pair (i, j), exactly balanced per
split. Latents of fixed total energy κ: μ_i ~ N(0, (κ/d_e)·I) independently for all four subspaces, then for a
sequence of class c = (i, j) the pair is aligned, μ_j ← R_c μ_i, with R_c a Haar-random orthogonal d_e×d_e task
constant. Every subspace has the same marginal distribution, so no single subspace reveals the label: only the
cross-subspace similarity x̄_jᵀ R_c x̄_i does. The signal energy does not grow with d_e while the number of
noise directions does, so wider subspaces make the pair harder to find; ``oracle_scores`` is the statistic of
an observer who knows every R_c (a reference accuracy, not a bound for the learners).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..checks import check_int_at_least, check_real

N_SUBSPACES = 4
PAIRS = tuple((i, j) for i in range(N_SUBSPACES) for j in range(i + 1, N_SUBSPACES))  # class c ↔ PAIRS[c]
N_CLASSES = len(PAIRS)


@dataclass
class SyntheticData:
    """Train/test tensors of one task instance; inputs are [N, T, 4·d_e]."""

    x_train: Tensor
    y_train: Tensor  # float [N] (regression) or int64 labels [N] (classification)
    x_test: Tensor
    y_test: Tensor
    y_test_clean: Tensor | None = None  # regression: the noise-free test target
    n_classes: int | None = None  # classification: K = 6; None for regression
    constants: dict[str, Tensor] = field(default_factory=dict)  # task constants (A, B or R)
    info: dict = field(default_factory=dict)


def _check_sizes(n_train: int, n_test: int, d_e: int, seq_len: int) -> None:
    for name, value, minimum in (("n_train", n_train, 1), ("n_test", n_test, 1), ("d_e", d_e, 1),
                                 ("seq_len", seq_len, 2)):
        check_int_at_least(name, value, minimum)


def make_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed``, an int in [0, 2**32) (torch's CPU generator keeps 32 bits).

    Raises:
        ValueError: ``seed`` outside [0, 2**32) or not an int.
    """
    if check_int_at_least("seed", seed, 0) >= 2**32:
        raise ValueError(f"seed: expected an int in [0, 2**32), got {seed!r}")
    return torch.Generator().manual_seed(seed)


def haar_orthogonal(d: int, generator: torch.Generator) -> Tensor:
    """A Haar-distributed orthogonal d×d matrix (QR of a Gaussian with the sign of R's diagonal fixed)."""
    q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def subspaces(x: Tensor) -> Tensor:
    """[N, T, 4·d_e] -> [N, T, 4, d_e]: subspace i is columns i·d_e:(i+1)·d_e (head i's positional slice)."""
    if x.dim() != 3 or x.shape[-1] % N_SUBSPACES:
        raise ValueError(f"x: expected [N, T, 4·d_e], got shape {tuple(x.shape)}")
    N, T, D = x.shape
    return x.view(N, T, N_SUBSPACES, D // N_SUBSPACES)  # (N, T, 4, d_e)


def mean_variance(seq_len: int, token_noise: float, latent_var: float = 1.0) -> float:
    """v: the per-coordinate variance of a subspace mean x̄_i = μ_i + s·ε̄_i."""
    return latent_var + token_noise**2 / seq_len


# ---- regression (Figure 12) ---------------------------------------------------------------------------------
def regression_constants(d_e: int, generator: torch.Generator) -> dict[str, Tensor]:
    """Within metrics A [4, d_e, d_e] (symmetric) and cross metrics B [6, d_e, d_e] (float64)."""
    G = torch.randn(N_SUBSPACES, d_e, d_e, generator=generator, dtype=torch.float64)
    B = torch.randn(N_CLASSES, d_e, d_e, generator=generator, dtype=torch.float64)
    return {"A": (G + G.transpose(-1, -2)) / 2, "B": B}


def regression_parts(x: Tensor, constants: dict[str, Tensor], token_noise: float = 1.0) -> tuple[Tensor, Tensor]:
    """Normalised within terms f [N, 4] and cross terms c [N, 6] (pair order ``PAIRS``) of each sequence."""
    xs = subspaces(x).to(torch.float64)
    T = xs.shape[1]
    v = mean_variance(T, token_noise)
    m = xs.mean(1)  # (N, 4, d_e): x̄_i, the mean pairwise similarity reduces to a form in the means
    A, B = constants["A"].to(m.device), constants["B"].to(m.device)
    trace = torch.diagonal(A, dim1=-2, dim2=-1).sum(-1)  # (4,)
    f = (torch.einsum("nia,iab,nib->ni", m, A, m) - v * trace) / (math.sqrt(2) * v * A.flatten(1).norm(dim=1))
    i, j = zip(*PAIRS)
    c = torch.einsum("nka,kab,nkb->nk", m[:, list(i)], B, m[:, list(j)]) / (v * B.flatten(1).norm(dim=1))
    return f, c


def regression_target(x: Tensor, constants: dict[str, Tensor], lam: float, token_noise: float = 1.0) -> Tensor:
    """Noise-free target (W + λ·C)/√(1+λ²) of each sequence [N] (float64)."""
    lam = check_real("lam", lam)
    f, c = regression_parts(x, constants, token_noise)
    W, C = f.sum(1) / 2, c.sum(1) / math.sqrt(N_CLASSES)
    return (W + lam * C) / math.sqrt(1 + lam**2)


def _tokens(n: int, seq_len: int, d_e: int, latent_std: float, token_noise: float, generator: torch.Generator):
    mu = latent_std * torch.randn(n, 1, N_SUBSPACES, d_e, generator=generator, dtype=torch.float64)
    eps = torch.randn(n, seq_len, N_SUBSPACES, d_e, generator=generator, dtype=torch.float64)
    return mu, eps


def make_regression(n_train: int = 4096, n_test: int = 1024, d_e: int = 8, seq_len: int = 16, lam: float = 0.0,
                    noise: float = 0.1, token_noise: float = 1.0, seed: int = 0,
                    dtype: torch.dtype = torch.float32) -> SyntheticData:
    """The Figure 12 regression task (module docstring). Inputs, constants and noise do not depend on ``lam``.

    Raises:
        ValueError: a size below its minimum (``n_train``, ``n_test``, ``d_e`` >= 1, ``seq_len`` >= 2), a
            non-finite ``lam``, or a negative ``noise`` / ``token_noise``; the message names the argument.
    """
    _check_sizes(n_train, n_test, d_e, seq_len)
    lam, noise = check_real("lam", lam), check_real("noise", noise, 0.0)
    token_noise = check_real("token_noise", token_noise, 0.0)
    g = make_generator(seed)
    consts = regression_constants(d_e, g)
    n = n_train + n_test
    mu, eps = _tokens(n, seq_len, d_e, 1.0, token_noise, g)
    x = (mu + token_noise * eps).reshape(n, seq_len, N_SUBSPACES * d_e)  # (N, T, D)
    clean = regression_target(x, consts, lam, token_noise)
    y = clean + noise * torch.randn(n, generator=g, dtype=torch.float64)
    x, y = x.to(dtype), y.to(dtype)
    return SyntheticData(x[:n_train], y[:n_train], x[n_train:], y[n_train:], y_test_clean=clean[n_train:].to(dtype),
                         constants=consts,
                         info={"task": "regression", "d_e": d_e, "seq_len": seq_len, "lam": lam, "noise": noise,
                               "token_noise": token_noise, "seed": seed, "mse_floor": noise**2})


# ---- classification (Figure 13) -----------------------------------------------------------------------------
def classification_constants(d_e: int, generator: torch.Generator) -> dict[str, Tensor]:
    """One Haar-random rotation R_c [6, d_e, d_e] per class (subspace pair)."""
    return {"R": torch.stack([haar_orthogonal(d_e, generator) for _ in PAIRS])}


def balanced_labels(n: int, generator: torch.Generator, n_classes: int = N_CLASSES) -> Tensor:
    """A random permutation of (0, 1, …, K−1, 0, 1, …): class counts differ by at most one."""
    return (torch.arange(n) % n_classes)[torch.randperm(n, generator=generator)]


def oracle_scores(x: Tensor, constants: dict[str, Tensor]) -> Tensor:
    """[N, 6]: x̄_jᵀ R_c x̄_i for each class c = (i, j); argmax is the observer who knows every R_c."""
    m = subspaces(x).to(torch.float64).mean(1)  # (N, 4, d_e)
    i, j = zip(*PAIRS)
    R = constants["R"].to(m.device)
    return torch.einsum("nka,kab,nkb->nk", m[:, list(j)], R, m[:, list(i)])


def make_classification(n_train: int = 4096, n_test: int = 1024, d_e: int = 8, seq_len: int = 16,
                        kappa: float = 2.0, token_noise: float = 1.0, seed: int = 0,
                        dtype: torch.dtype = torch.float32) -> SyntheticData:
    """The Figure 13 classification task (module docstring): which subspace pair shares its latent.

    Raises:
        ValueError: a size below its minimum (``n_train``, ``n_test``, ``d_e`` >= 1, ``seq_len`` >= 2), or a
            negative ``kappa`` / ``token_noise``; the message names the argument.
    """
    _check_sizes(n_train, n_test, d_e, seq_len)
    kappa, token_noise = check_real("kappa", kappa, 0.0), check_real("token_noise", token_noise, 0.0)
    g = make_generator(seed)
    consts = classification_constants(d_e, g)
    n = n_train + n_test
    labels = torch.cat([balanced_labels(n_train, g), balanced_labels(n_test, g)])
    mu, eps = _tokens(n, seq_len, d_e, math.sqrt(kappa / d_e), token_noise, g)
    mu = mu.squeeze(1)  # (N, 4, d_e)
    for c, (i, j) in enumerate(PAIRS):  # align the class's pair: μ_j = R_c μ_i
        sel = labels == c
        mu[sel, j] = mu[sel, i] @ consts["R"][c].T
    x = (mu.unsqueeze(1) + token_noise * eps).reshape(n, seq_len, N_SUBSPACES * d_e).to(dtype)  # (N, T, D)
    return SyntheticData(x[:n_train], labels[:n_train], x[n_train:], labels[n_train:], n_classes=N_CLASSES,
                         constants=consts,
                         info={"task": "classification", "d_e": d_e, "seq_len": seq_len, "kappa": kappa,
                               "token_noise": token_noise, "seed": seed})
