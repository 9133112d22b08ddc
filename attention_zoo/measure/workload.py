"""A measurable unit of work built from a JSON-able spec: model, fixed inputs and a training loss.

The same spec builds the same model and the same seeded inputs in this process and in a fresh subprocess
(the CPU peak-RSS path), so every measurement kind sees identical work (docs/conventions.md §1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_choice, check_positive_int
from ..registry import create_attention
from ..variants.base import AttentionBase, collect_aux_losses

KINDS = ("attention", "decoder")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}

_DEFAULTS = dict(
    kind="attention",  # one attention layer on [B,T,D] features, or a token Decoder
    attention="mha",
    options={},  # attention options (flavor included)
    d_model=64,
    n_heads=4,
    causal=False,  # attention kind only; the Decoder is always causal
    n_layers=2,
    d_ff=None,
    vocab_size=256,
    norm="pre",
    positions="learned",
    share_mlp=True,
    dropout=0.0,
    batch=2,
    seq_len=32,
    seed=0,
    dtype="float32",  # parameters and inputs
    amp=None,  # None, "bfloat16" or "float16": the forward runs under torch.autocast on the device
)
AMP_DTYPES = (None, "bfloat16", "float16")


def workload_spec(**overrides) -> dict:
    """A complete spec (defaults filled in). Raises ValueError for an unknown key or a bad kind/dtype."""
    unknown = sorted(set(overrides) - set(_DEFAULTS))
    if unknown:
        raise ValueError(f"spec: unknown keys {', '.join(unknown)}; accepted: {', '.join(_DEFAULTS)}")
    spec = {**_DEFAULTS, **overrides}
    spec["options"] = dict(spec["options"] or {})
    check_choice("kind", spec["kind"], KINDS)
    check_choice("dtype", spec["dtype"], tuple(DTYPES))
    check_choice("amp", spec["amp"], AMP_DTYPES)
    for name in ("batch", "seq_len", "d_model", "n_heads", "n_layers", "vocab_size"):
        check_positive_int(name, spec[name])
    return spec


@dataclass
class Workload:
    """``model(*inputs)`` is the measured forward; ``loss(output)`` the scalar a training step backpropagates."""

    model: nn.Module
    inputs: tuple
    loss: Callable[[object], Tensor]
    spec: dict

    @property
    def batch(self) -> int:
        return self.spec["batch"]

    @property
    def seq_len(self) -> int:
        return self.spec["seq_len"]

    def forward(self):
        if self.spec.get("amp") is None:
            return self.model(*self.inputs)
        device = next((t.device for t in self.inputs if torch.is_tensor(t)), torch.device("cpu"))
        with torch.autocast(device.type, dtype=DTYPES[self.spec["amp"]]):
            return self.model(*self.inputs)

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def compute_path(self) -> str:
        """The implementations its attentions run here, where they differ by device (``compute_path`` hooks)."""
        device = next((t.device for t in self.inputs if torch.is_tensor(t)), torch.device("cpu"))
        dtype = DTYPES[self.spec.get("amp") or self.spec["dtype"]]
        paths = []
        for m in self.model.modules():
            path = m.compute_path(device, dtype) if isinstance(m, AttentionBase) else ""
            if path and path not in paths:
                paths.append(path)
        return "; ".join(paths)


def _attention_loss(model: nn.Module) -> Callable[[Tensor], Tensor]:
    def loss(y: Tensor) -> Tensor:
        aux = collect_aux_losses(model)
        out = y.float().square().mean()
        return out if aux is None else out + aux

    return loss


def _decoder_loss(tokens: Tensor) -> Callable:
    def loss(out) -> Tensor:  # next-token cross-entropy + the attentions' auxiliary losses
        logits = out.logits[:, :-1].float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)) + out.aux_loss

    return loss


def build_workload(spec: dict, device: torch.device | str = "cpu") -> Workload:
    """Build the model (seeded) and its seeded inputs on ``device``.

    Raises:
        ValueError: a bad spec (see ``workload_spec``) or a bad attention name/option.
    """
    spec = workload_spec(**spec)
    device, dtype = torch.device(device), DTYPES[spec["dtype"]]
    with private_rng(device):  # the model's initialisation draws from the global RNG
        torch.manual_seed(spec["seed"])
        return _build(spec, device, dtype)


def private_rng(device: torch.device):
    """A fork of the global torch RNG (CPU, and ``device`` if a GPU), restored on exit: the caller's stream is left
    as it was by seeding and by the draws (initialisation, dropout, noisy gating) made inside."""
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" \
        else []
    return torch.random.fork_rng(devices=devices)


def _build(spec: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    B, T = spec["batch"], spec["seq_len"]
    gen = torch.Generator().manual_seed(spec["seed"] + 1)  # inputs: identical across variants
    if spec["kind"] == "attention":
        model = create_attention(spec["attention"], d_model=spec["d_model"], n_heads=spec["n_heads"],
                                 causal=spec["causal"], dropout=spec["dropout"], **spec["options"])
        x = torch.randn(B, T, spec["d_model"], generator=gen).to(device=device, dtype=dtype)
        model = model.to(device=device, dtype=dtype)
        return Workload(model, (x,), _attention_loss(model), spec)
    from ..models import Decoder

    model = Decoder(spec["vocab_size"], spec["d_model"], spec["n_layers"], spec["n_heads"], spec["attention"],
                    spec["options"], share_mlp=spec["share_mlp"], d_ff=spec["d_ff"], max_seq_len=T,
                    dropout=spec["dropout"], attn_dropout=spec["dropout"], norm=spec["norm"],
                    positions=spec["positions"]).to(device=device, dtype=dtype)
    tokens = torch.randint(0, spec["vocab_size"], (B, T), generator=gen).to(device)
    return Workload(model, (tokens,), _decoder_loss(tokens), spec)
