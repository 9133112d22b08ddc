"""Shared machinery of the generation experiments (DAMCHA paper Tables 1, 3, 4, App. E; docs/experiments.md §2–§4).

Models (any registered attention in the authors' post-LN block with sinusoidal positions, docs/variants.md §0.2):
- **patch** (the authors' CV code): 4×4 patches -> ``Linear(48, D)`` + positions -> causal ``AttentionStack`` ->
  ``Linear(D, 2D) -> GELU -> Linear(2D, 48)``; MSE on the masked patches (1–3 zeroed patch rows per image, which
  are zeros in the input as in the authors' code: the mask only selects the loss).
- **pixel** (the paper's autoregressive generation): a ``Decoder`` over 8-bit RGB332 pixel tokens (1,024 per 32×32
  image). Its reconstruction of an image is the teacher-forced argmax of every next pixel, compared with the image as
  the tokeniser represents it (the 256-colour palette is lossy).
- **text**: a ``Decoder`` over ``[BOS] source [SEP] target [EOS]``, loss on the target tokens and EOS only
  (``data.seq2seq`` sets the other targets to IGNORE_INDEX); greedy decoding to EOS for BERTScore/BARTScore.

Scoring uses the first ``eval_samples`` validation items (the authors' protocol; CIFAR: a 70/30 split of train, fixed
by seed 0 for every training seed, so all cells score the same originals, whose features are cached). Images: MSE,
FID over all scored pairs, FID@Top-50 (the 50 lowest-MSE pairs, the authors' rule; not comparable with standard
FID), feature distance, Top-50 by feature distance -> MSE. Text: per-example NLL, BERTScore F1 (offline MiniLM),
BARTScore (local facebook/bart-base, else NaN rows with status ``unsupported``), each with @Top-50 under both rules
(``nll_top50``: the 50 lowest NLLs; ``score_top50``: the 50 highest scores). Per-sample scores go to
``<out>/per_sample/`` (JSONL) for Top-50 and the App. E KDEs without retraining. Model selection: the lowest
validation loss (``best.pt``); the smoke preset evaluates once, at the end (final weights).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ...data import image_tasks as dt
from ...data import images as di
from ...data import seq2seq as s2s
from ...engine import TrainConfig, discard_run, lm_loss, load_checkpoint, train
from ...engine.checkpoint import strip_prefixes
from ...engine.distributed import DistInfo
from ...envinfo import set_seed
from ...io import atomic_write_bytes
from ...measure.flops import analytic_flops
from ...measure.params import count_params
from ...metrics import images as mi
from ...models import AttentionStack, Decoder, ModelOutput, StackConfig, sinusoidal_positions
from ...registry import resolved_options_json, split_options
from ...results import cell_id  # noqa: F401 - re-exported for the tables
from .scoring import VAL_UNIT, _row, cell_name, score_cell, validation_loss

IMAGE_SETS, TEXT_SETS = ("digits", "cifar10", "cifar100"), ("concepts", "wmt14", "commongen")
TEXT_LENGTHS = {"concepts": (64, 96), "wmt14": (128, 128), "commongen": (64, 64)}  # (source, target) max tokens
AUTHOR_TOKENIZERS = {"wmt14": "bert-base-multilingual-cased", "commongen": "facebook/bart-base"}
BYTES_PER_TOKEN = 4  # real text through the byte tokenizer: the authors' subword lengths × 4


@dataclass(frozen=True)
class Preset:
    image_datasets: tuple[str, ...]  # the defaults of Table 1 (Tables 3, 4: the first image / last text set)
    text_datasets: tuple[str, ...]
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    dropout: float  # residual, FFN and attention weights
    hidden_dims: tuple[int, ...]  # DAMCHA generator widths (Tables 1 and 4)
    depth_width: int  # Table 3: generator depth k = k − 1 hidden layers of this width + the output layer
    depths: tuple[int, ...]  # Table 3
    image_train: dict  # TrainConfig fields
    text_train: dict
    epochs: int | None  # None: the train dicts' max_steps; else epochs over the training split
    image_eval: int | None  # images scored (None: the whole validation split)
    text_eval: int | None  # text examples scored
    max_train_pairs: int | None = None
    # Pixel/text Decoder positions. Smoke: learned — unit-amplitude sinusoids swamp the Decoder's N(0, 0.02) token
    # embeddings and a 150-step byte model stays at the unigram plateau (3.12 vs 2.62 nats/token, concept task).
    decoder_positions: str = "sinusoidal"


_COMMON = dict(weight_decay=0.0, beta2=0.999, grad_clip=1.0, warmup_steps=0)  # the authors: Adam(W), wd 0, clip 1
PRESETS = {
    "smoke": Preset(("digits",), ("concepts",), d_model=64, n_layers=2, n_heads=8, d_ff=128, dropout=0.0,
                    hidden_dims=(128, 256), depth_width=128, depths=(1, 2, 3),
                    image_train=dict(_COMMON, max_steps=150, batch_size=32, lr=2e-3, min_lr_ratio=0.01,
                                     warmup_steps=10, log_every=10, eval_max_batches=2, ckpt_every=50),
                    text_train=dict(_COMMON, max_steps=150, batch_size=16, lr=2e-3, min_lr_ratio=0.1,
                                    warmup_steps=10, log_every=10, eval_max_batches=2, ckpt_every=50),
                    epochs=None, image_eval=64, text_eval=64, decoder_positions="learned"),
    # The compact repo config (docs/experiments.md §1), 50 epochs; CV: AdamW 3e-4 cosine to 0.01·lr, batch 64, the first
    # 51 validation batches; text: Adam(W, wd 0) at 3e-4, batch 32, whole validation split, WMT's first 100k pairs.
    "paper": Preset(("cifar10", "cifar100"), ("wmt14", "commongen"), d_model=128, n_layers=4, n_heads=8, d_ff=256,
                    dropout=0.1, hidden_dims=(256, 512), depth_width=256, depths=tuple(range(1, 10)),
                    image_train=dict(_COMMON, batch_size=64, lr=3e-4, min_lr_ratio=0.01, log_every=50),
                    text_train=dict(_COMMON, batch_size=32, lr=3e-4, min_lr_ratio=1.0, log_every=50),
                    epochs=50, image_eval=51 * 64, text_eval=None, max_train_pairs=100_000),
}


class PatchModel(nn.Module):
    """The authors' masked-patch reconstruction model; ``forward(inputs [B,N,P], mask=None) -> ModelOutput``.

    Raises:
        ValueError: inputs not [B, N, patch_dim] with N <= n_tokens (and the stack's own checks).
    """

    def __init__(self, patch_dim: int, n_tokens: int, d_model: int, n_layers: int, n_heads: int, attention: str,
                 attention_options: dict, share_mlp: bool, d_ff: int, dropout: float):
        super().__init__()
        self.patch_dim, self.n_tokens, self.embed = patch_dim, n_tokens, nn.Linear(patch_dim, d_model)
        self.register_buffer("pos", sinusoidal_positions(n_tokens, d_model), persistent=False)
        self.drop = nn.Dropout(dropout)
        self.stack = AttentionStack(StackConfig(d_model, n_layers, n_heads, attention, attention_options, share_mlp,
                                                causal=True, d_ff=d_ff, dropout=dropout, attn_dropout=dropout,
                                                norm="post", max_seq_len=n_tokens))
        self.head = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, patch_dim))

    def forward(self, inputs: Tensor, mask: Tensor | None = None) -> ModelOutput:
        if inputs.dim() != 3 or inputs.shape[-1] != self.patch_dim or inputs.shape[1] > self.n_tokens:
            raise ValueError(f"inputs: expected [B, <= {self.n_tokens}, {self.patch_dim}], got {tuple(inputs.shape)}")
        h, aux = self.stack(self.drop(self.embed(inputs) + self.pos[: inputs.shape[1]]))  # (B, N, D)
        return ModelOutput(self.head(h), aux)


@dataclass(frozen=True)
class DataOptions:
    image_task: str = "patch"  # or "pixel"
    pixel_mode: str = "rgb332"
    image_size: int = 32  # digits only
    tokenizer: str = "auto"  # bytes | a local HF tokenizer | auto: the authors' where available offline, else bytes
    data_dir: str | None = None
    download: bool = True
    max_train_pairs: int | None = None
    image_eval: int | None = 100
    text_eval: int | None = 64


class ImageData:
    """A seeded 70/30 split of an image set's train split, prepared for the patch or the pixel task."""

    kind = "image"

    def __init__(self, name: str, o: DataOptions):
        full = di.load_images(name, "train", o.data_dir, o.download, o.image_size)
        tr, va = (torch.from_numpy(i) for i in di.train_val_split(len(full), 0.3, seed=0))
        train_imgs, val = full.images[tr], full.images[va]
        self.name, self.task, self.n_train = name, o.image_task, len(train_imgs)
        self.eval_images = val[: o.image_eval]
        if self.task == "patch":
            self.train_set, self.val_set, self.eval_set = (dt.PatchTask(x, 4, 1, min(3, x.shape[2] // 4))
                                                           for x in (train_imgs, val, self.eval_images))
            self.patch_dim, self.n_tokens, self.loss_fn = self.train_set.patch_dim, self.train_set.n_tokens, \
                dt.masked_patch_mse
        else:
            self.tok = dt.PixelTokenizer(o.pixel_mode)
            self.train_set, self.val_set, self.eval_set = (self.tok.encode(x) for x in
                                                           (train_imgs, val, self.eval_images))
            self.vocab_size, self.seq_len, self.loss_fn = self.tok.model_vocab_size, self.train_set.shape[1], lm_loss
            self.eval_images = self.tok.decode(self.eval_set, *val.shape[2:])  # what the tokens can represent

    def sampler(self, batch: int, seed: int):
        return (dt.PatchSampler if self.task == "patch" else dt.PixelSampler)(self.train_set, batch, seed)

    def batches(self, split: str, batch: int):
        data = self.val_set if split == "val" else self.eval_set
        return dt.PatchEvaluator(data, batch) if self.task == "patch" else dt.PixelEvaluator(data, batch)


class TextData:
    """Source/target pairs packed for a decoder; the loss is ``lm_loss``, which skips IGNORE_INDEX targets."""

    kind, task, loss_fn = "text", "text", staticmethod(lm_loss)

    def __init__(self, name: str, o: DataOptions):
        data = s2s.load_seq2seq(name, o.data_dir, 0, o.max_train_pairs)
        want = AUTHOR_TOKENIZERS.get(name, "bytes") if o.tokenizer == "auto" else o.tokenizer
        try:
            self.tok = s2s.load_tokenizer(want)
        except FileNotFoundError:
            if o.tokenizer != "auto":
                raise
            self.tok = s2s.ByteTokenizer()
        scale = BYTES_PER_TOKEN if isinstance(self.tok, s2s.ByteTokenizer) and name != "concepts" else 1
        src_len, self.max_new_tokens = (n * scale for n in TEXT_LENGTHS[name])
        self.name, self.vocab_size, self.seq_len = name, self.tok.vocab_size, src_len + self.max_new_tokens + 3
        self.train_set, self.val_set = (s2s.encode_pairs(data.splits[s], self.tok, src_len, self.max_new_tokens)
                                        for s in ("train", "val"))
        self.eval_set, self.eval_pairs, self.n_train = (self.val_set[: o.text_eval], data.splits["val"][: o.text_eval],
                                                        len(self.train_set))

    def sampler(self, batch: int, seed: int):
        return s2s.Seq2SeqSampler(self.train_set, self.tok, batch, seed)

    def batches(self, split: str, batch: int):
        return s2s.Seq2SeqEvaluator(self.val_set if split == "val" else self.eval_set, self.tok, batch)


@functools.lru_cache(maxsize=8)
def load_data(name: str, opts: DataOptions) -> ImageData | TextData:
    """Raises ValueError for a dataset that is neither an image nor a text set (loaders raise their own errors)."""
    if name in IMAGE_SETS + TEXT_SETS:
        return (ImageData if name in IMAGE_SETS else TextData)(name, opts)
    raise ValueError(f"datasets: {name!r} is not one of {', '.join(IMAGE_SETS + TEXT_SETS)}")


def build_model(data, variant: str, flavor: str, p: Preset, options: dict | None = None,
                share_mlp: bool = True) -> nn.Module:
    """The task's model around ``variant``; options reach it only where it accepts them (by option name)."""
    opts, _ = split_options(variant, {"hidden_dims": p.hidden_dims, **(options or {}), "flavor": flavor})
    common = dict(attention=variant, attention_options=opts, share_mlp=share_mlp, d_ff=p.d_ff, dropout=p.dropout)
    if data.task == "patch":
        return PatchModel(data.patch_dim, data.n_tokens, p.d_model, p.n_layers, p.n_heads, **common)
    return Decoder(data.vocab_size, p.d_model, p.n_layers, p.n_heads, max_seq_len=data.seq_len,
                   attn_dropout=p.dropout, norm="post", positions=p.decoder_positions, **common)


@dataclass
class Context:
    """Everything a cell needs besides its own key: preset, device, data options, scorers, output paths."""

    name: str
    preset_name: str
    out: Path
    device: torch.device
    data: DataOptions
    extractor: str
    train_overrides: dict  # TrainConfig fields over the preset's (``--train``, ``--steps``)
    quiet: bool
    keep_checkpoints: bool
    bart_path: str | None
    fresh: bool = False  # --fresh: every cell trains from scratch, never from a kept checkpoint

    @property
    def preset(self) -> Preset:
        return PRESETS[self.preset_name]

    def train_config(self, data) -> TrainConfig:
        base = dict(self.preset.image_train if data.kind == "image" else self.preset.text_train)
        if self.preset.epochs:
            per_epoch = math.ceil(data.n_train / base["batch_size"])
            base.update(max_steps=self.preset.epochs * per_epoch, eval_every=per_epoch, ckpt_every=per_epoch)
        base.update(self.train_overrides)
        return TrainConfig.from_dict(base)

    def cell(self, dataset: str, variant: str, flavor: str, setting: str, seed: int) -> dict:
        """The ResultStore key: what was run and with which configuration (hashed), so reruns skip it."""
        data = load_data(dataset, self.data)
        model = {k: v for k, v in asdict(self.preset).items() if not k.endswith(("_train", "_datasets", "depths"))}
        train = {k: v for k, v in self.train_config(data).to_dict().items() if k not in ("stop_at", "handle_signals")}
        conf = {"model": model, "train": train, "data": asdict(self.data)}  # run control is not part of a cell
        return {"experiment": self.name, "preset": self.preset_name, "dataset": dataset, "task": data.task,
                "variant": variant, "flavor": flavor, "setting": setting, "seed": seed,
                "attention_options": resolved_options_json(variant, {"flavor": flavor}),
                "steps": conf["train"]["max_steps"], "eval_samples": len(data.eval_set),
                "extractor": self.extractor if data.kind == "image" else None,
                "config": hashlib.sha1(json.dumps(conf, sort_keys=True, default=str).encode()).hexdigest()[:10]}

    def run_dir(self, cell: dict) -> Path:
        return self.out / "_cache" / "runs" / cell_name(cell)

    def original_features(self, data: ImageData) -> Tensor:
        """Features of the scored originals, computed once and cached under ``_cache/features``."""
        key = hashlib.sha1(json.dumps([data.name, asdict(self.data), self.extractor]).encode()).hexdigest()[:12]
        path = self.out / "_cache" / "features" / f"{key}.pt"
        if not path.is_file():
            buf = io.BytesIO()
            torch.save(mi.extract_features(data.eval_images, self.extractor, device=str(self.device)), buf)
            atomic_write_bytes(path, buf.getvalue())
        return torch.load(path, weights_only=True)


def train_cell(ctx: Context, cell: dict, options: dict | None = None, share_mlp: bool = True):
    """Build (seeded), train (resuming) and load the lowest-validation-loss weights; (model, data, TrainResult)."""
    data = load_data(cell["dataset"], ctx.data)
    set_seed(cell["seed"])
    model = build_model(data, cell["variant"], cell["flavor"], ctx.preset, options, share_mlp)
    cfg = ctx.train_config(data).replace(seed=cell["seed"], progress=not ctx.quiet)
    run_dir = ctx.run_dir(cell)
    if ctx.fresh:
        discard_run(run_dir)
    res = train(model, cfg, data.sampler(cfg.batch_size, cell["seed"]), run_dir,
                eval_sets={"val": data.batches("val", cfg.batch_size)}, loss_fn=data.loss_fn,
                resume=None if ctx.fresh else "auto",
                info=DistInfo(device=ctx.device), meta={"cell": cell}, desc=cell_name(cell))
    best = run_dir / "checkpoints" / "best.pt"
    if res.status == "ok" and best.is_file():
        model.load_state_dict(strip_prefixes(load_checkpoint(best)["model"]))
    return model, data, res


def train_and_score(ctx: Context, cell: dict, options: dict | None = None, share_mlp: bool = True,
                    inference: dict | None = None) -> list[dict] | None:
    """Train a cell and score it (once, or once per ``inference`` entry ``label -> fn(model)`` that sets an
    inference-time modification such as block scales); None when training was interrupted (resumable)."""
    model, data, res = train_cell(ctx, cell, options, share_mlp)
    if res.status == "interrupted":
        return None
    if res.status != "ok":
        return [_row("train_loss", math.nan, "nats", res.status, f"non-finite loss or grad norm at step "
                     f"{res.step + 1}; see {res.log_path}")]
    counts, cfg = count_params(model), ctx.train_config(data)
    seq_len = data.n_tokens if data.task == "patch" else data.seq_len
    extra = {"train_steps": res.step, "train_time_s": res.train_time_s, "best_val_loss": res.best_eval,
             "params": counts["total_params"], "attention_params": counts["attention_params"],
             # analytic: 3 × the forward count (backward ≈ 2 × forward) × sequences processed
             "train_gflops": 3 * analytic_flops(model, cfg.batch_size, seq_len) * res.step / 1e9}
    rows = []
    for label, apply in (inference or {"": lambda m: None}).items():
        apply(model)
        val = [{**_row("val_loss", validation_loss(ctx, model, data), VAL_UNIT[data.task]), "inference": label}]
        rows += [{**r, **extra} for r in score_cell(ctx, cell, model, data, label) + val]
    return rows
