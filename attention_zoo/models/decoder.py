"""GPT-style decoder over tokens with any registered attention."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..checks import check_choice, check_positive_int
from ..registry import get_attention_spec
from ..variants.rotary import ROPE_BASE, Rotary
from ..variants.seed_axis import by_seed, seeds_of
from .stack import AttentionStack, StackConfig


class ModelOutput(NamedTuple):
    logits: Tensor
    aux_loss: Tensor  # sum of the attentions' auxiliary losses (MoA balancing, DAMCHA KL); 0 if none


def sinusoidal_positions(max_len: int, d_model: int) -> Tensor:
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: d_model // 2])
    return pe


def check_token_ids(tokens: Tensor, vocab_size: int) -> None:
    """Ids outside [0, vocab_size) are a ValueError on CPU (read on the host: no device to wait for). On an
    accelerator, reading them back would stall every forward until the device is idle, so the check is queued on
    the device instead (``torch._assert_async``: it fails at the next synchronisation); under compilation, and on
    the meta device, nothing is checked."""
    if tokens.device.type == "cpu" and not torch.compiler.is_compiling():
        ids = tokens.detach().numpy()  # NumPy reads the memory: no tensor op, no synchronisation
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"tokens: ids must lie in [0, {vocab_size}), got [{ids.min()}, {ids.max()}]")
    elif tokens.device.type not in ("cpu", "meta") and not torch.compiler.is_compiling():
        torch._assert_async(((tokens >= 0) & (tokens < vocab_size)).all(),
                            f"tokens: ids must lie in [0, {vocab_size})")


class Decoder(nn.Module):
    """Decoder-only language model: token embedding + positions -> blocks -> (final LN) -> tied head.

    ``forward(tokens [B,T], padding_mask=None) -> ModelOutput(logits [B,T,V], aux_loss)``. Defaults are GPT-2-like
    (pre-LN, learned positions, tied output head); ``norm="post", positions="sinusoidal"`` is the DAMCHA authors'
    decoder (docs/variants.md §0.2). ``positions="rope"``: no additive position embedding; every layer's attention
    rotates its queries and keys (RoPE, base 10000, width ``attn.rotary_dim``; docs/variants.md §0.4).
    ``share_across_layers`` (alias ``share_mlp``; default True): a ``stack_shared`` attention's shared module (DAMCHA's
    metric generator) is built once at construction and run once per forward on the stack input (embeddings +
    additive positions), and every layer reuses its result; False: each layer has its own. ``causal`` (default True):
    False makes the same model bidirectional (every position sees every real token: a masked-LM encoder).
    ``emb_std``: the token embeddings' initial standard deviation (GPT-2's 0.02 by default; PyTorch's own 1.0, with an
    untied head, is what Zoology's recall models use).

    Raises:
        ValueError: non-positive sizes, unknown attention or option, ``positions="rope"`` with an attention
            without the ``rotary_ok`` capability, ``share_across_layers`` and ``share_mlp`` given with different
            values, ``causal`` or ``tie_weights`` not a bool, ``emb_std`` not positive, tokens not an integer [B,T]
            tensor within the vocabulary and ``max_seq_len``.
    """

    ensemble_parameters = ("pos_emb",)  # learned positions may carry a seed axis (engine.ensemble)

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, attention: str = "mha",
                 attention_options: dict | None = None, share_across_layers: bool | None = None,
                 d_ff: int | None = None, max_seq_len: int = 1024, dropout: float = 0.0, attn_dropout: float = 0.0,
                 norm: str = "pre", positions: str = "learned", tie_weights: bool = True,
                 share_mlp: bool | None = None, causal: bool = True, emb_std: float = 0.02):
        super().__init__()
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("max_seq_len", max_seq_len)
        check_choice("positions", positions, ("learned", "sinusoidal", "rope"))
        if positions == "rope" and not get_attention_spec(attention).rotary_ok:
            raise ValueError(f"positions: 'rope' needs an attention that applies rotary positions (rotary_ok); "
                             f"{attention!r} does not")
        for name, value in (("tie_weights", tie_weights), ("causal", causal)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}: expected a bool, got {value!r}")
        if isinstance(emb_std, bool) or not isinstance(emb_std, (int, float)) or not 0 < emb_std < float("inf"):
            raise ValueError(f"emb_std: expected a positive finite float, got {emb_std!r}")
        self.cfg = StackConfig(d_model, n_layers, n_heads, attention, dict(attention_options or {}),
                               share_across_layers, causal=causal, d_ff=d_ff, dropout=dropout,
                               attn_dropout=attn_dropout, norm=norm, max_seq_len=max_seq_len, share_mlp=share_mlp)
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.positions = positions
        if positions == "learned":
            self.pos_emb = nn.Parameter(torch.zeros(max_seq_len, d_model))
            nn.init.normal_(self.pos_emb, std=0.02)
        elif positions == "sinusoidal":
            self.register_buffer("pos_emb", sinusoidal_positions(max_seq_len, d_model), persistent=False)
        else:
            self.pos_emb = None  # positions enter each attention's logits instead
        nn.init.normal_(self.tok_emb.weight, std=emb_std)
        self.drop = nn.Dropout(dropout)
        self.stack = AttentionStack(self.cfg)
        self.ln_f = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> ModelOutput:
        if (not torch.is_tensor(tokens) or tokens.dim() != 2 or tokens.is_floating_point() or tokens.is_complex()
                or tokens.dtype == torch.bool):
            got = (tokens.dtype, tuple(tokens.shape)) if torch.is_tensor(tokens) else type(tokens).__name__
            raise ValueError(f"tokens: expected an integer tensor [B, T], got {got}")
        B, T = tokens.shape
        if B == 0 or T == 0:
            raise ValueError(f"tokens: expected at least one sequence of at least one token, got shape {(B, T)}")
        if T > self.max_seq_len:
            raise ValueError(f"tokens: sequence length {T} exceeds max_seq_len={self.max_seq_len}")
        check_token_ids(tokens, self.vocab_size)
        x = self.tok_emb(tokens)  # (B, T, D)
        rotary = None
        if self.pos_emb is not None:
            S = seeds_of(self.pos_emb, 2)
            # a grouped ensemble (engine.ensemble): one table [S, max_seq_len, D] per seed, over a seed-major batch
            x = x + self.pos_emb[:T] if not S else (by_seed(x, S) + self.pos_emb[:, None, :T]).flatten(0, 1)
        else:
            rotary = Rotary.standard(T, self.stack.layers[0].attn.rotary_dim, base=ROPE_BASE, device=x.device,
                                     dtype=x.dtype)
        h, aux = self.stack(self.drop(x), padding_mask, rotary=rotary)
        return ModelOutput(self.head(self.ln_f(h)), aux)

    def get_M_matrices(self) -> list[tuple[str, Tensor]]:
        return [(f"stack.{name}", M) for name, M in self.stack.get_M_matrices()]

    def num_params(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel() + (self.pos_emb.numel() if isinstance(self.pos_emb, nn.Parameter) else 0)
        return n
