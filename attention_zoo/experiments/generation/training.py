"""Training a generation cell (DAMCHA paper Tables 1, 3, 4, App. E; docs/experiments.md §2–§4): the models, their
training and scoring; the presets are in ``config``, the data sets in ``data``.

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

import math
import time

from torch import Tensor, nn

from ...engine import discard_run, load_checkpoint, train
from ...engine.checkpoint import strip_prefixes
from ...engine.distributed import DistInfo
from ...engine.ensemble import EnsembleUnsupported
from ...engine.grouped import Member, check_samplers, group_for_training, train_grouped
from ...envinfo import set_seed
from ...measure.flops import analytic_flops
from ...measure.params import count_params
from ...models import AttentionStack, Decoder, ModelOutput, StackConfig, sinusoidal_positions
from ...registry import split_options
from ..ensemble_units import unit_tag
from .config import PRESETS, Context, Preset, cell_name  # noqa: F401 - PRESETS re-exported
from .data import IMAGE_SETS, TEXT_SETS, DataOptions, load_data  # noqa: F401 - re-exported
from .scoring import HELDOUT, VAL_UNIT, _row, heldout_member_means, heldout_scores, score_cell, validation_loss
from .trivial import trivial_predictor


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


def build_model(data, variant: str, flavor: str, p: Preset, options: dict | None = None,
                share_mlp: bool = True) -> nn.Module:
    """The task's model around ``variant``; options reach it only where it accepts them (by option name)."""
    opts, _ = split_options(variant, {"hidden_dims": p.hidden_dims, **(options or {}), "flavor": flavor})
    common = dict(attention=variant, attention_options=opts, share_mlp=share_mlp, d_ff=p.d_ff, dropout=p.dropout)
    if data.task == "patch":
        return PatchModel(data.patch_dim, data.n_tokens, p.d_model, p.n_layers, p.n_heads, **common)
    return Decoder(data.vocab_size, p.d_model, p.n_layers, p.n_heads, max_seq_len=data.seq_len,
                   attn_dropout=p.dropout, norm="post", positions=p.decoder_positions, **common)


def train_cell(ctx: Context, cell: dict, options: dict | None = None, share_mlp: bool = True):
    """Build (seeded), train (resuming) and load the lowest-validation-loss weights; (model, data, TrainResult)."""
    data = load_data(cell["dataset"], ctx.data)
    set_seed(cell["seed"])
    model = build_model(data, cell["variant"], cell["flavor"], ctx.preset, options, share_mlp)
    cfg = ctx.train_config(data).replace(seed=cell["seed"], progress=not ctx.quiet)
    if "phase" in cell:  # a tuned preset: the cell names its setting
        cfg = cfg.replace(lr=cell["lr"], weight_decay=cell["weight_decay"])
    run_dir = ctx.run_dir(cell)
    if ctx.fresh:
        discard_run(run_dir)
    fracs = budget_fracs(ctx, cell)
    metric = HELDOUT[data.task]
    res = train(model, cfg, data.sampler(cfg.batch_size, cell["seed"]), run_dir,
                eval_sets={"val": data.batches("val", cfg.batch_size)}, loss_fn=data.loss_fn,
                resume=None if ctx.fresh else "auto",
                info=DistInfo(device=ctx.device), meta={"cell": cell}, desc=cell_name(cell), budget_fracs=fracs,
                budget_score=(lambda m: {metric: float(heldout_scores(m, data, ctx.device).mean())}) if fracs else None)
    best = run_dir / "checkpoints" / "best.pt"
    if res.status == "ok" and best.is_file():
        model.load_state_dict(strip_prefixes(load_checkpoint(best)["model"]))
    return model, data, res


def budget_fracs(ctx: Context, cell: dict) -> tuple[float, ...]:
    """The budget fractions a cell's held-out metric is read at: the preset's, for final cells only (a tuning cell
    reads validation only)."""
    return ctx.preset.budget_fracs if cell.get("phase") not in (None, "tune") else ()


def train_cells_grouped(ctx: Context, unit: list[dict], options: dict | None = None, share_mlp: bool = True):
    """``train_cell`` for the cells of ``unit`` (one arm, one phase) as one grouped model (``engine.grouped``: each
    gets what ``train`` gives it alone, to float rounding): ([(model, data, TrainResult)] per cell, "") with each
    model at its lowest-validation-loss weights, or (None, why the arm cannot be grouped: the caller trains its
    cells one by one)."""
    data = load_data(unit[0]["dataset"], ctx.data)
    cfg = ctx.train_config(data).replace(progress=not ctx.quiet)
    models = []
    for c in unit:
        set_seed(c["seed"])
        models.append(build_model(data, c["variant"], c["flavor"], ctx.preset, options, share_mlp))
    members = [Member(c["seed"], c["lr"] if "phase" in c else cfg.lr,
                      c["weight_decay"] if "phase" in c else cfg.weight_decay, data.sampler(cfg.batch_size, c["seed"]),
                      ctx.run_dir(c), {"cell": c}) for c in unit]
    try:
        check_samplers([m.sampler for m in members])  # text batches differ in length: one at a time
        grouped = group_for_training(models, tuple(t[:2] for t in members[0].sampler(0)[:-1]))
    except EnsembleUnsupported as exc:
        return None, str(exc)
    if ctx.fresh:
        for m in members:
            discard_run(m.run_dir)
    group_dir = ctx.out / "_cache" / "runs" / f"group-{unit[0]['variant']}-{unit[0].get('phase', 'seeds')}-" \
                                              f"{unit_tag(unit)}"
    fracs, metric = budget_fracs(ctx, unit[0]), HELDOUT[data.task]

    def scores(net) -> list[dict]:  # every member's held-out metric at its best checkpoint so far
        return [{metric: v} for v in heldout_member_means(net, data, ctx.device)]

    results = train_grouped(models, members, cfg, group_dir, eval_sets={"val": data.batches("val", cfg.batch_size)},
                            loss_fn=data.loss_fn, device=ctx.device, resume=not ctx.fresh,
                            desc=f"{cell_name(unit[0])} x{len(unit)}", grouped=grouped, budget_fracs=fracs,
                            budget_score=scores if fracs else None)
    for m, res in zip(models, results):
        if res.status == "ok" and res.checkpoint is not None:
            m.load_state_dict(strip_prefixes(load_checkpoint(res.checkpoint)["model"]))
    return [(m, data, res) for m, res in zip(models, results)], ""


def train_and_score(ctx: Context, cell: dict, options: dict | None = None, share_mlp: bool = True,
                    inference: dict | None = None, trained: tuple | None = None) -> list[dict] | None:
    """Train a cell and score it (once, or once per ``inference`` entry ``label -> fn(model)`` that sets an
    inference-time modification such as block scales); None when training was interrupted (resumable).
    ``trained``: the cell's (model, data, TrainResult) from ``train_cells_grouped``: scored as it stands."""
    model, data, res = trained if trained is not None else train_cell(ctx, cell, options, share_mlp)
    if res.status == "interrupted":
        return None
    if res.status != "ok":
        return [_row("train_loss", math.nan, "nats", res.status, f"non-finite loss or grad norm at step "
                     f"{res.step + 1}; see {res.log_path}")]
    t_score = time.perf_counter()
    counts, cfg = count_params(model), ctx.train_config(data)
    seq_len = data.n_tokens if data.task == "patch" else data.seq_len
    extra = {"train_steps": res.step, "train_time_s": res.train_time_s, "best_val_loss": res.best_eval,
             "params": counts["total_params"], "attention_params": counts["attention_params"],
             # analytic: 3 × the forward count (backward ≈ 2 × forward) × sequences processed
             "train_gflops": 3 * analytic_flops(model, cfg.batch_size, seq_len) * res.step / 1e9,
             "eval_time_s": res.eval_time_s}  # validation while training (outside train_time_s)
    if cell.get("phase") == "tune":  # tuning reads the selection half of the validation split only
        row = {**_row("val_loss", validation_loss(ctx, model, data), VAL_UNIT[data.task]), **extra,
               "best_step": res.best_step}
        return [{**row, "score_time_s": time.perf_counter() - t_score}]
    rows = []
    # the gate's reference: the task's trivial predictor on the same validation batches, with the same loss
    trivial = validation_loss(ctx, trivial_predictor(data).to(ctx.device), data)
    for label, apply in (inference or {"": lambda m: None}).items():
        apply(model)
        val = [{**_row("val_loss", validation_loss(ctx, model, data), VAL_UNIT[data.task]), "inference": label},
               {**_row("trivial_val_loss", trivial, VAL_UNIT[data.task]), "inference": label}]
        rows += [{**r, **extra} for r in score_cell(ctx, cell, model, data, label) + val]
    score_time = time.perf_counter() - t_score  # the cell's scoring after training (every inference label)
    metric = HELDOUT[data.task]
    final = next((r["value"] for r in rows if r["metric"] == metric), None)  # the first inference label's
    rows += [{**r, **extra} for r in progress_rows(ctx, cell, res, metric, VAL_UNIT[data.task], final)]
    return [{**r, "score_time_s": score_time} for r in rows]


def progress_rows(ctx: Context, cell: dict, res, metric: str, unit: str, final: float | None) -> list[dict]:
    """How far a final cell trained — steps run, its best validation step, the step limit — and its held-out metric
    at each budget fraction (the best checkpoint so far; a fraction it did not reach: ``final``, its final best's)."""
    limit = ctx.train_config(load_data(cell["dataset"], ctx.data)).max_steps
    rows = [{**_row("steps_run", res.step, "steps"), "inference": ""},
            {**_row("best_step", res.best_step if res.best_step is not None else res.step, "steps"), "inference": ""},
            {**_row("max_steps", limit, "steps"), "inference": ""}]
    for f in budget_fracs(ctx, cell):
        best_step, scores = (res.budget or {}).get(f, (res.best_step, {metric: final}))  # not reached: final best
        if scores.get(metric) is not None:
            rows.append({**_row(f"{metric}@budget", scores[metric], unit), "budget": f,
                         "best_step_so_far": best_step, "inference": ""})
    return rows
