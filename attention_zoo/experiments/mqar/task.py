"""The MQAR task of one rung, as ``experiments.token_cells`` trains it: batches, the query-position loss, the
validation score that early stopping and tuning read (the query error rate), the final scores and the chance level.

One loss function serves the engine twice (``QueryLoss``): under autograd (a training step) it is the cross-entropy at
the query positions, in nats; inside the engine's evaluation (no autograd) it is the fraction of queries answered
wrongly. A recall model's validation cross-entropy keeps shrinking by tiny amounts long after every query is right,
so patience on it would rarely end a run; the error rate stops improving once the answers stop changing, which is
the plateau Zoology's own runs stop at (they stop at 99 % validation accuracy).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...data.mqar import IGNORE, MQARSampler, MQARSpec, batches, mqar_examples
from ..token_cells import TokenTask

VAL_SEED, TEST_SEED = 1, 2  # the fixed sets, the same for every arm and training seed


class QueryLoss:
    """Cross-entropy at the query positions under autograd; the query error rate without (module docstring)."""

    def __call__(self, batch, output) -> torch.Tensor:
        logits = output.logits if hasattr(output, "logits") else output
        y = batch[-1]
        if torch.is_grad_enabled():
            return F.cross_entropy(logits.float().flatten(0, -2), y.flatten(), ignore_index=IGNORE)
        keep = y != IGNORE
        return (logits.argmax(-1)[keep] != y[keep]).double().mean()


class MQARTask(TokenTask):
    """One rung (``MQARSpec``) with fixed validation and test sets of ``n_val`` / ``n_test`` sequences."""

    causal = True

    def __init__(self, spec: MQARSpec, n_val: int, n_test: int, eval_batch: int = 128):
        self.spec, self.vocab_size, self.seq_len, self.eval_batch = spec, spec.vocab_size, spec.seq_len, eval_batch
        self.sets = {"val": mqar_examples(spec, n_val, VAL_SEED), "test": mqar_examples(spec, n_test, TEST_SEED)}
        self.loss_fn = QueryLoss()

    def sampler(self, seed: int, batch_size: int) -> MQARSampler:
        return MQARSampler(self.spec, batch_size, seed)

    def val_sets(self) -> dict:
        return {"val": lambda limit: batches(self.sets["val"], self.eval_batch, limit)}

    @torch.no_grad()
    def score(self, model, split: str) -> list[dict]:
        """``<split>_acc`` (fraction of queries answered right) and ``<split>_loss`` (cross-entropy at the queries,
        nats) over the whole fixed set."""
        was = model.training
        model.eval()
        correct = scored = 0
        nll = 0.0
        for x, y in batches(self.sets[split], self.eval_batch):
            logits = model(x).logits.float()
            keep = y != IGNORE
            correct += int((logits.argmax(-1)[keep] == y[keep]).sum())
            scored += int(keep.sum())
            nll += float(F.cross_entropy(logits[keep], y[keep], reduction="sum"))
        model.train(was)
        where = {"eval_queries": scored}
        return [{"metric": f"{split}_acc", "value": correct / scored, "unit": "fraction of queries", **where},
                {"metric": f"{split}_loss", "value": nll / scored, "unit": "nats per query", **where}]

    def reference_rows(self) -> list[dict]:
        """Chance: a value from the context picked without its key (1/n), the learned-at-all reference."""
        return [{"metric": "chance_acc", "value": self.spec.chance_accuracy, "unit": "fraction of queries"}]


__all__ = ["MQARTask", "QueryLoss"]
