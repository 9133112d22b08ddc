"""The masked character LM of one run, as ``experiments.token_cells`` trains it (``data.masked``: random masking of
⌈0.15·T⌉ characters per window, one [MASK] id, the loss read at the masked positions only).

Scores: ``<split>_loss``, the masked-character cross-entropy in nats (``<split>_ppl`` = its exp, the perplexity the
papers quote) over the same evenly spread windows of the split for every arm, with masks drawn from a fixed seed;
on the test split, the unigram reference (``trivial_loss``) on exactly those targets and, for routing attentions,
the per-layer expert-load statistics (``measure.expert_load``), summed over the test pass.
"""

from __future__ import annotations

import functools
import math

from ...data.masked import MaskedEvaluator, MaskedSampler, unigram_loss
from ...data.text import load_char_corpus
from ...engine import evaluate, lm_loss
from ...measure.expert_load import ExpertLoadLog
from ..token_cells import TokenTask


@functools.lru_cache(maxsize=2)
def corpus(name: str = "shakespeare"):
    return load_char_corpus(name, None, False)


class MaskedLMTask(TokenTask):
    """Shakespeare's characters, windows of ``seq_len``, ``rate`` masked; ``final_batches`` evaluation batches of
    ``eval_batch`` windows per split for the final scores (evenly spread; None: the whole split)."""

    causal = False

    def __init__(self, seq_len: int, rate: float, eval_batch: int, eval_max_batches: int | None,
                 final_batches: int | None, dataset: str = "shakespeare"):
        c = corpus(dataset)
        self.corpus, self.seq_len, self.rate = c, seq_len, rate
        self.mask_id, self.vocab_size = c.vocab_size, c.vocab_size + 1
        self.eval_max_batches, self.final_batches = eval_max_batches, final_batches
        self.evaluators = {split: MaskedEvaluator(getattr(c, split)[dataset], seq_len, eval_batch, rate, self.mask_id)
                           for split in ("val", "test")}
        self.loss_fn = lm_loss

    def sampler(self, seed: int, batch_size: int) -> MaskedSampler:
        return MaskedSampler(self.corpus.train[0], self.seq_len, batch_size, self.rate, self.mask_id, seed)

    def val_sets(self) -> dict:
        return {"val": self.evaluators["val"]}

    def score(self, model, split: str) -> list[dict]:
        ev = self.evaluators[split]
        with ExpertLoadLog(model) as log:
            loss = evaluate(model, ev(self.final_batches))
        n = sum(int((y != -100).sum()) for _, y in ev(self.final_batches))
        where = {"eval_targets": n}
        rows = [{"metric": f"{split}_loss", "value": loss, "unit": "nats per masked character", **where},
                {"metric": f"{split}_ppl", "value": math.exp(loss), "unit": "perplexity (masked characters)",
                 **where}]
        return rows + (log.rows() if split == "test" else [])

    def reference_rows(self) -> list[dict]:
        ev = self.evaluators["test"]
        trivial = unigram_loss(self.corpus.train, self.corpus.vocab_size, ev(self.final_batches))
        return [{"metric": "trivial_loss", "value": trivial, "unit": "nats per masked character"}]



__all__ = ["MaskedLMTask", "corpus"]
