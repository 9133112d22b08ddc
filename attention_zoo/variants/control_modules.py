"""The modules the control arms add to MHA (``controls``): a position-wise MLP (the parameter- and compute-matched
arms) and DAMCHA's generator MLP read on the context mean, its outputs folded to one D-vector (the context control)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .damcha_generator import token_context


def mlp_params(widths: tuple[int, ...]) -> int:
    """Weights and biases of a chain of Linear layers through ``widths`` (in, hidden…, out)."""
    return sum(i * o + o for i, o in zip(widths[:-1], widths[1:]))


def generator_outputs(d_model: int, compact_rank: int = 0) -> int:
    """Outputs of DAMCHA's generator: D² (``mlp`` mode), or 2·D·r with compact rank r."""
    return 2 * d_model * compact_rank if compact_rank else d_model * d_model


class PositionwiseMLP(nn.Module):
    """x [..., D] -> Linear(D, w) -> GELU -> Dropout -> Linear(w, D), output layer zero-initialised."""

    def __init__(self, d_model: int, width: int, dropout: float, n_uses: int = 1):
        super().__init__()
        self.d_model, self.width, self.n_uses = d_model, width, n_uses
        self.fc = nn.Linear(d_model, width)
        self.proj = nn.Linear(width, d_model)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.drop(F.gelu(self.fc(x))))

    def analytic_params(self) -> int:
        return mlp_params((self.d_model, self.width, self.d_model))

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        return self.n_uses * 2 * batch * seq_len * 2 * self.d_model * self.width


class ContextMLP(nn.Module):
    """c [..., D] -> (Linear, GELU, Dropout)* -> Linear(w_last, D·k) -> mean over groups of k -> [..., D], with
    D·k DAMCHA's generator outputs (k = D, or 2·r with compact rank r).

    The D² output rows are those of DAMCHA's generator (same widths, same parameters). With causal prefix contexts the
    mean over each group is taken on the weights (a [D, w_last] layer per call), so no D² outputs are built per
    position; with one context per sequence the layer runs and its outputs are averaged (the same values).
    """

    def __init__(self, d_model: int, hidden_dims: tuple[int, ...], causal: bool, dropout: float,
                 compact_rank: int = 0):
        super().__init__()
        self.d_model, self.hidden_dims, self.causal = d_model, hidden_dims, causal
        self.n_out = generator_outputs(d_model, compact_rank)
        layers, width = [], d_model
        for h in hidden_dims:
            layers += [nn.Linear(width, h), nn.GELU(), nn.Dropout(dropout)]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.out = nn.Linear(width, self.n_out)
        self.fold_weights = causal  # causal: one context per position, so D·k outputs per position would be costly

    def forward(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """The context term added to the attention output: [B, 1, D] (full-sequence mean) or [B, T, D] (causal)."""
        D, k = self.d_model, self.n_out // self.d_model
        z = self.trunk(token_context(x, padding_mask, self.causal))  # (B, w) or (B, T, w)
        if self.fold_weights:  # the mean of each group of k output rows, taken on the weights: no D·k outputs
            y = F.linear(z, self.out.weight.view(D, k, -1).mean(1), self.out.bias.view(D, k).mean(1))
        else:  # one context per sequence: D·k outputs are cheap, and the layer itself is called
            y = self.out(z).unflatten(-1, (D, k)).mean(-1)
        return y if self.causal else y[:, None]

    def ensemble_prepare(self) -> None:
        self.fold_weights = False  # a grouped copy replaces ``out``; its raw weights are not read

    def analytic_params(self) -> int:
        return mlp_params((self.d_model, *self.hidden_dims, self.n_out))

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        calls = seq_len if self.causal else 1
        return 2 * batch * calls * sum(i * o for i, o in zip((self.d_model, *self.hidden_dims),
                                                             (*self.hidden_dims, self.d_model)))


