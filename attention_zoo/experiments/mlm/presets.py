"""The masked LM's presets: the backbone, the recipe, the arms (each paper's comparison and sweep) and the decide
preset's tuning.

Backbone: a 2-layer bidirectional decoder stack (``Decoder(causal=False)``), D = 64, H = 4 unless an arm says
otherwise, learned positions, pre-LN, FFN 4D (256) unless matched, no dropout, tied output layer; windows of T = 64
characters of the embedded Shakespeare corpus (``data.text``), 15 % masked (``data.masked``). Training: batches of 16
windows, AdamW (0.9, 0.95), weight decay 0.1, 100 warm-up steps then cosine to 0.1 × lr over 4,000 steps, clipping
at 1; validation every 100 steps on 8 batches of 64 fixed windows; early stopping once 500 steps pass without a
validation loss 1 % below the best so far (``TrainConfig.min_delta``): the masked LM still improves slowly at the
end of its schedule, so a plateau needs a threshold (calibration: MHA improved 1.4 % in its last 500 of 6,000 steps).
Final scores on 16 batches of 64 windows of each split (≈ 10,000 masked characters), the same for every arm.

Arms, by the paper whose claims read them:
- THA: MHA and THA at H = 4, THA's pre-only (``post_mix=False``) and post-only (``pre_mix=False``) ablations, and the
  head sweep H ∈ {4, 8, 16} at D = 64 (d_k 16 → 4) for both, plus an MHA at H = 16 whose FFN is widened to THA's
  forward FLOPs there (THA's extra core cost is H/d_k of MHA's: +2·T²·2H² per layer);
- MoA: MoA at the harness default (E = 2H = 8 experts, k = H = 4, d_h = 16), the sweep over E ∈ {4, 8, 16} at k = 4
  (E = 4 is dense: every expert active), and an MHA whose FFN is widened to MoA(E = 16)'s parameters (SwitchHead's
  parameter-matched baseline);
- ColMHA: collaborative heads with a shared key width D̃ ∈ {32, 16, 8} and MHA with the same total query/key width
  (``qk_dim``, per head D_k/4), against MHA at D_k = 64;
- MMA: MMA (the encoder setting its backward heads need) vs MHA.
THA's mixes keep the paper flavour's random init (Mesh-TF); a third-party tiny run that failed with it is why every
arm's learning rate is tuned.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arms import ArmSpec
from ..tuning import Tuning

ARMS = (
    ArmSpec("mha", "mha", papers=("tha", "moa", "colmha", "mma")),
    ArmSpec("tha", "tha", papers=("tha",)),
    ArmSpec("tha_pre_only", "tha", {"post_mix": False}, papers=("tha",)),
    ArmSpec("tha_post_only", "tha", {"pre_mix": False}, papers=("tha",)),
    ArmSpec("mha_h8", "mha", model={"n_heads": 8}, papers=("tha",)),
    ArmSpec("tha_h8", "tha", model={"n_heads": 8}, papers=("tha",)),
    ArmSpec("mha_h16", "mha", model={"n_heads": 16}, papers=("tha",)),
    ArmSpec("tha_h16", "tha", model={"n_heads": 16}, papers=("tha",)),
    ArmSpec("mha_h16_flops", "mha", model={"n_heads": 16}, papers=("tha",), match=("flops", "tha_h16")),
    ArmSpec("moa", "moa", papers=("moa",)),
    ArmSpec("moa_e4", "moa", {"n_experts": 4}, papers=("moa",)),
    ArmSpec("moa_e16", "moa", {"n_experts": 16}, papers=("moa",)),
    ArmSpec("mha_params_moa16", "mha", papers=("moa",), match=("params", "moa_e16")),
    ArmSpec("colmha_32", "colmha", {"shared_dim": 32}, papers=("colmha",)),
    ArmSpec("colmha_16", "colmha", {"shared_dim": 16}, papers=("colmha",)),
    ArmSpec("colmha_8", "colmha", {"shared_dim": 8}, papers=("colmha",)),
    ArmSpec("mha_qk32", "mha", {"qk_dim": 32}, papers=("colmha",)),
    ArmSpec("mha_qk16", "mha", {"qk_dim": 16}, papers=("colmha",)),
    ArmSpec("mha_qk8", "mha", {"qk_dim": 8}, papers=("colmha",)),
    ArmSpec("mma", "mma", papers=("mma",)),
)


@dataclass(frozen=True)
class Preset:
    seq_len: int
    d_model: int
    n_layers: int
    n_heads: int
    mask_rate: float
    eval_batch: int
    final_batches: int | None
    train: dict
    seeds: tuple[int, ...] = (0,)
    arms: tuple[ArmSpec, ...] = ARMS
    dataset: str = "shakespeare"


_TRAIN = dict(batch_size=16, warmup_steps=100, weight_decay=0.1, grad_clip=1.0, min_lr_ratio=0.1, log_every=100,
              eval_every=100, eval_max_batches=8, patience=500, min_delta=0.01, ckpt_every=500)
PRESETS = {
    "smoke": Preset(64, 64, 2, 4, 0.15, 64, 4, train={**_TRAIN, "max_steps": 300, "lr": 4e-3, "patience": 0,
                                                       "min_delta": 0.0, "eval_max_batches": 2}),
    "decide": Preset(64, 64, 2, 4, 0.15, 64, 16, train={**_TRAIN, "max_steps": 4000, "lr": 4e-3},
                     seeds=tuple(range(10))),
}
# Table 5's decide grid for the causal character LM at D = 64 (there, every arm chose 4e-3 / 0.1 of the first grid)
TUNING = {"decide": Tuning(lrs=(2e-3, 4e-3, 8e-3), weight_decays=(0.1,), tune_seeds=(1000, 1001),
                           seeds=tuple(range(10)))}

# Seconds per optimizer step, one CPU thread, batch 16 (calibration runs of this issue), × MARGIN for the shared host
STEP_SECONDS: dict[str, float] = {}
MARGIN = 1.25
EXPECTED_STEP_FRACTION = 0.85  # of max_steps: where the 1 % plateau criterion ended the calibration runs

__all__ = ["ARMS", "EXPECTED_STEP_FRACTION", "MARGIN", "PRESETS", "Preset", "STEP_SECONDS", "TUNING"]
