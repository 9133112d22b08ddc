"""Table 6 (ViT): ImageFolder loading and augmentation, mixup, top-k accuracy, a short digits run, the CLI."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from attention_zoo.data.fetch import DatasetNotFoundError
from attention_zoo.data.imagefolder import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    FolderEvaluator,
    FolderSampler,
    Mixup,
    check_same_classes,
    eval_transform,
    find_imagefolder,
    load_imagefolder,
    soft_targets,
    train_transform,
)
from attention_zoo.engine.distributed import DistInfo
from attention_zoo.experiments.vision import table6_vit as t6
from attention_zoo.io import read_jsonl
from attention_zoo.models import ModelOutput

ROOT = Path(__file__).resolve().parent.parent
COLORS = {"cat": (255, 0, 128), "dog": (10, 200, 60)}  # one constant colour per class


@pytest.fixture
def one_thread():
    """The training tests run single-threaded (tiny matrices); the CLI sets the thread count process-wide."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _folder(root: Path, n: int = 3) -> Path:
    """``root/{train,val}/{cat,dog}/*.png``: constant-colour images of assorted sizes."""
    for split in ("train", "val"):
        for cls, rgb in COLORS.items():
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (40 + 7 * i, 30 + 5 * i), rgb).save(root / split / cls / f"{i}.png")
    return root


def _expected(rgb) -> torch.Tensor:
    return (torch.tensor(rgb) / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)


def test_imagefolder_eval_batches(tmp_path):
    root = find_imagefolder(_folder(tmp_path / "data" / "imagenet").parent)  # the imagenet/ subfolder is found
    assert root == tmp_path / "data" / "imagenet"
    val = load_imagefolder(root, "val")
    check_same_classes(load_imagefolder(root, "train"), val)
    ev = FolderEvaluator(val, eval_transform(32, 36), batch_size=4, order_seed=None)
    batches = list(ev())
    assert [tuple(x.shape) for x, _ in batches] == [(4, 3, 32, 32), (2, 3, 32, 32)]
    labels = torch.cat([y for _, y in batches])
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]  # folder order: cat, dog
    images = torch.cat([x for x, _ in batches])
    for x, y in zip(images, labels):
        want = _expected(COLORS[val.classes[y]])[:, None, None].expand_as(x)
        torch.testing.assert_close(x, want, atol=0.02, rtol=0)
    shuffled = list(FolderEvaluator(val, eval_transform(32, 36), batch_size=4)(limit=1))  # fixed shuffled order
    assert len(shuffled) == 1 and len(shuffled[0][1]) == 4
    ranked = list(FolderEvaluator(val, eval_transform(32, 36), 4, rank=1, world_size=2, order_seed=None)())
    assert ranked[0] is None and torch.equal(ranked[1][1], labels[4:])  # batch i belongs to rank i mod 2


def test_missing_imagenet_says_how_to_prepare(tmp_path, capsys):
    with pytest.raises(DatasetNotFoundError, match="ILSVRC2012_img_val.tar") as err:
        find_imagefolder(tmp_path)
    assert "--data-dir" in str(err.value) and str(tmp_path / "train") in str(err.value)
    assert t6.main(["--preset", "paper", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: imagenet") and "image-net.org" in err and err.count("\n") == 1  # no traceback
    for split, cls in (("train", "a"), ("val", "b")):
        (tmp_path / "other" / split / cls).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "other" / split / cls / "0.png")
    with pytest.raises(ValueError, match="class folders differ"):
        check_same_classes(*(load_imagefolder(tmp_path / "other", s) for s in ("train", "val")))


def test_folder_sampler_is_position_addressable(tmp_path):
    folder = load_imagefolder(_folder(tmp_path), "train")
    tt = train_transform(16, randaugment=(2, 9), random_erasing=0.25)
    s = FolderSampler(folder, tt, batch_size=4, num_classes=2, seed=3, label_smoothing=0.1)
    x0, y0 = s(0)
    s(1)
    x0b, y0b = s(0)  # out of order: restarts at step 0
    assert x0.shape == (4, 3, 16, 16) and torch.equal(x0, x0b) and torch.equal(y0, y0b)
    torch.testing.assert_close(y0.sum(1), torch.ones(4))
    torch.testing.assert_close(y0.max(1).values, torch.full((4,), 0.95))
    half = FolderSampler(folder, tt, batch_size=4, num_classes=2, seed=3, label_smoothing=0.1, rank=1, world_size=2)
    xh, yh = half(0)  # rank 1 fills rows 2:4, identical to the single-process batch (per-position seeds)
    assert xh.shape == x0.shape and torch.equal(xh[2:], x0[2:]) and torch.equal(yh[2:], y0[2:])
    pooled = FolderSampler(folder, tt, batch_size=4, num_classes=2, seed=3, label_smoothing=0.1, workers=2)
    try:
        assert torch.equal(pooled(0)[0], x0) and torch.equal(pooled(1)[0], s(1)[0])  # decoded in worker processes
    finally:
        pooled.close()


@pytest.mark.parametrize("alphas", [(0.8, 0.0), (0.0, 1.0)])
def test_mixup_targets_match_pixels(alphas):
    B, C = 6, 10
    labels = torch.arange(B)
    x = labels.float().view(B, 1, 1, 1).expand(B, 3, 8, 8).clone()  # image i is the constant i
    y = soft_targets(labels, C)
    xm, ym = Mixup(*alphas)(x, y, np.random.default_rng(0))
    torch.testing.assert_close(ym.sum(1), torch.ones(B))
    # each image's mean is its own weight × i + its partner's weight × (B−1−i): λ agrees with the pasted area
    want = (ym[:, :B] * labels.float()).sum(1)
    torch.testing.assert_close(xm.mean((1, 2, 3)), want)


def test_topk_correct_and_evaluate():
    logits = torch.tensor([[0.1, 0.9, 0.0, 0.2, 0.3, 0.4],   # target 1: top-1
                           [0.9, 0.1, 0.8, 0.7, 0.6, 0.5],   # target 5: rank 5 -> top-5 only
                           [0.9, 0.1, 0.8, 0.7, 0.6, 0.5]])  # target 1: rank 6 -> neither
    targets = torch.tensor([1, 5, 1])
    assert t6.topk_correct(logits, targets).tolist() == [1, 2]
    assert t6.topk_correct(logits[:, :2], torch.tensor([1, 0, 1])).tolist() == [2, 3]  # k capped at 2 classes

    class Identity(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return ModelOutput(x, None)

    res = t6.evaluate_topk(Identity(), [(logits[:2], targets[:2]), (logits[2:], targets[2:])])
    assert res["top1"] == pytest.approx(100 / 3) and res["top5"] == pytest.approx(200 / 3) and res["n"] == 3
    assert res["loss"] == pytest.approx(float(F.cross_entropy(logits, targets)))


def test_vit_learns_digits(tmp_path, one_thread):
    preset = dataclasses.replace(t6.PRESETS["smoke"], image_size=8, patch_size=2, d_model=32, n_layers=1, n_heads=2,
                                 d_ff=64, batch_size=32, lr=5e-3, lr_ref_batch=32, augment={}, eval_every_epochs=100)
    data = t6.load_data(preset)
    cfg, spe = t6.train_config(preset, data.n_train, 3, preset.batch_size, 60, {"progress": False})
    cell = {"variant": "mha", "flavor": "paper", "seed": 0, "epochs": 3, "steps_per_epoch": spe}
    rows, res = t6.run_cell(cell, preset, data, cfg, DistInfo(), tmp_path, {}, None)
    acc = {r["metric"]: r["value"] for r in rows}
    assert res.status == "ok" and res.step == 60
    assert acc["top1"] > 30, acc  # chance is 10 %
    assert acc["top5"] > acc["top1"]


def test_cli_writes_outputs_skips_and_resumes(tmp_path, one_thread):
    out = tmp_path / "out"
    args = ["--preset", "smoke", "--variants", "mha", "--steps", "4", "--out", str(out), "--device", "cpu", "--quiet",
            "--threads", "1"]
    proc = subprocess.run([sys.executable, str(ROOT / "reproduce" / "table6_vit.py"), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("table6_vit_long.csv", "table6_vit.env.json", "table6_vit_wide.csv", "table6_vit.md"):
        assert (out / name).is_file(), name
    md = (out / "table6_vit.md").read_text()
    assert "top-1" in md and "Wilson 95 % interval" in md and "n = 1 seeds" in md
    records = [r for r in read_jsonl(out / "table6_vit.jsonl") if r["kind"] == "cell"]
    assert len(records) == 1 and {r["metric"] for r in records[0]["rows"]} >= {"top1", "top5"}
    log = next((out / "runs").iterdir()) / "metrics.jsonl"
    before = log.read_text()
    assert t6.main(args) == 0  # rerun: the finished cell is skipped
    assert log.read_text() == before and len(read_jsonl(out / "table6_vit.jsonl")) == 2  # a run record and one cell

    out2 = tmp_path / "resume"
    args2 = [*args[:7], str(out2), *args[8:]]
    assert t6.main([*args2, "--train", "stop_at=2"]) == 1  # interrupted: checkpoint kept, no result
    assert not (out2 / "table6_vit.jsonl").exists()
    assert t6.main(args2) == 0
    events = read_jsonl(next((out2 / "runs").iterdir()) / "metrics.jsonl")
    assert any(e.get("event") == "resume" and e["step"] == 2 for e in events)
    assert events[-1]["event"] == "status" and events[-1]["status"] == "ok" and events[-1]["step"] == 4
    assert json.loads((out2 / "table6_vit.env.json").read_text())["preset"] == "smoke"
