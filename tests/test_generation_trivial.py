"""The generation tasks' trivial predictors (``trivial_val_loss``, the learned-at-all gate's reference): scored on
the validation batches with the task's own loss, fitted on the training split only."""

import math
from types import SimpleNamespace

import pytest
import torch

from attention_zoo.data.image_tasks import to_unit_range
from attention_zoo.experiments.generation.data import DataOptions, load_data
from attention_zoo.experiments.generation.scoring import validation_loss
from attention_zoo.experiments.generation.trivial import Constant, trivial_predictor

CTX = SimpleNamespace(device=torch.device("cpu"))


def test_patch_task_trivial_is_the_training_mean_and_no_constant_beats_it_by_much():
    data = load_data("digits", DataOptions(image_size=16))
    pred = trivial_predictor(data)
    assert float(pred.value[0]) == pytest.approx(float(to_unit_range(data.train_set.images).mean()))
    trivial = validation_loss(CTX, pred, data)
    for shift in (-0.2, 0.2):
        other = Constant(pred.value + shift)
        assert validation_loss(CTX, other, data) > trivial


def test_text_task_trivial_is_the_unigram_nll_of_the_validation_targets():
    data = load_data("concepts", DataOptions())
    pred = trivial_predictor(data)
    eos = data.tok.eos_id
    targets = torch.tensor([t for pair in data.val_set for t in (*pair.target, eos)])
    manual = float(-pred.value[targets].mean())
    assert validation_loss(CTX, pred, data) == pytest.approx(manual, rel=1e-6)
    assert manual < math.log(data.vocab_size)  # the unigram beats the uniform guess
