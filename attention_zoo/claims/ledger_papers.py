"""The baselines' own headline claims (docs/claims.md §7): Talking-Heads Attention (``THA.``), DCFormer (``DC.``),
collaborative
heads (``COL.``), Mixture of Attention Heads (``MOA.``) and MMA (``MMA.``), as data.

Each paper is one Holm family (``family``), which may span stores. A paper's number is given only where it was
verified (a paper table copied in the authors' repository: ColMHA's NMT and GLUE tables, MoA's README BLEU; the
abstracts' own figures); elsewhere the claim is stated without a number and says "number not verified". Formula
claims are decided from the modules' closed forms (``analytic_papers``); "cannot be tested at this scale" is a
verdict of its own where no CPU stand-in reaches the claim. docs/claims.md §7 lists every claim with its rule.
"""

from __future__ import annotations

from .spec import Arm, Claim, Comparison

NV = "number not verified"


def arm(label: str, **where) -> Arm:
    return Arm(label, {"arm": label, **where})


def sweep(name: str, variant: str) -> Arm:
    return Arm(f"{variant} ({name} sweep)", {"sweep": name, "variant": variant})


MLM_SCOPE = {"smoke": "stand-in: masked character LM on Shakespeare, 2 layers, D = 64 (smoke preset: a pipeline check)",
             "decide": "stand-in: masked character LM on Shakespeare (15 % of characters masked), 2 bidirectional "
                       "layers, D = 64; decide preset: every arm tuned on lr {2e-3, 4e-3, 8e-3} on validation, then "
                       "10 seeds at its best, 1,800 steps (no plateau at this budget), best validation checkpoint"}
MQAR_SCOPE = {"smoke": "stand-in: MQAR (Zoology), smoke preset: a pipeline check",
              "decide": "stand-in: MQAR (Zoology's multi-query associative recall), 2-layer decoder, D = 64, the "
                        "hardest rung T = 64, n = 16 pairs; decide preset: every arm tuned on lr {3e-4, 1e-3, 3e-3} at "
                        "T = 64, n = 8, 10 seeds at its best, early stopping on the query error rate"}
T5_SCOPE = {"smoke": "stand-in: Table 5's causal character LM (smoke preset)",
            "decide": "stand-in: Table 5's causal character LM on Shakespeare, 2 layers, D = 64 (its decide preset: "
                      "each arm tuned, 10 seeds, early stopping), DCMHA in its original form"}
T6_SCOPE = {"smoke": "stand-in: Table 6's digits ViT (smoke preset)",
            "decide": "stand-in: Table 6's digits ViT (its decide preset: each arm tuned, 10 seeds, early stopping), "
                      "DCMHA in its original form"}
T1_SCOPE = {"smoke": "stand-in: Table 1's concept-to-sentence task, decoder-only (smoke preset)",
            "decide": "stand-in: Table 1's concept-to-sentence task, held-out NLL, decoder-only: MMA's backward heads "
                      "see only themselves and its forward heads equal global ones there (a different model from the "
                      "paper's encoder)"}
FORMULA = {"*": "formula: the modules' closed forms at the paper's configuration, computed"}
UNTESTABLE = {"*": "cannot be tested at this scale"}

MHA_MLM = arm("mha")
PAPER_MHA = Arm("mha", {"variant": "mha"})
PAPER_DCMHA = Arm("dcmha", {"variant": "dcmha", "flavor": "paper"})
HARD = {"seq_len": 64, "n_pairs": 16}  # MQAR's hardest rung: where MHA needs longest to answer

PAPER_CLAIMS: tuple[Claim, ...] = (
    # ---- Talking-Heads Attention (Shazeer, Lan, Cheng, Ding, Hou 2020, arXiv 2003.02436) ------------------------
    Claim("THA.mlm", "Talking heads give a lower masked-LM loss (perplexity) than multi-head attention at the same "
          "heads and width", "Abstract; Table 1 (T5 span-corruption pretraining)", NV, "masked_lm", "test_loss",
          "lower", "relative", (Comparison("tha vs mha (H = 4)", arm("tha"), MHA_MLM),), "THA", MLM_SCOPE,
          paper_metric="C4 span-corruption perplexity", equivalence=1.0,
          paper_scale="T5-base span corruption on C4, ≈ 524 k steps per arm (TPU-scale); not CPU-feasible"),
    Claim("THA.heads", "With more heads at a fixed width THA keeps improving while MHA stops improving: THA's gain "
          "grows with the number of heads", "Introduction, footnote 1; first sections of Tables 1 and 5", NV,
          "masked_lm", "test_loss", "lower", "relative",
          (Comparison("slope of THA's gain over H", sweep("heads", "tha"), sweep("heads", "mha")),
           Comparison("MHA's loss over H (not improving)", sweep("heads", "mha"), None, {}, 1)),
          "THA", MLM_SCOPE, rule="slope", over="sweep_value",
          paper_scale="the T5 sweep over h at d_model 768; TPU-scale"),
    Claim("THA.heads_flops", "THA's advantage at many heads is not bought by its extra computation: THA at H = 16 "
          "beats an MHA given the same forward FLOPs (a wider feed-forward)", "Abstract ('moderate amount of "
          "additional computation'); the head sweep; the control is ours", NV, "masked_lm", "test_loss", "lower",
          "relative", (Comparison("tha vs FLOP-matched mha (H = 16)", arm("tha_h16"), arm("mha_h16_flops")),),
          "THA", MLM_SCOPE, equivalence=1.0,
          paper_scale="a compute-matched Transformer at the paper's scale (not in the paper)"),
    Claim("THA.ablate", "Both projections contribute: full talking heads beat the pre-softmax-only and the "
          "post-softmax-only variants", "ablation tables (logit / weight projections)", NV, "masked_lm",
          "test_loss", "lower", "relative",
          (Comparison("tha vs pre-only", arm("tha"), arm("tha_pre_only")),
           Comparison("tha vs post-only", arm("tha"), arm("tha_post_only"))), "THA", MLM_SCOPE, equivalence=1.0,
          paper_scale="the paper's ablation runs (T5 scale)"),
    Claim("THA.cost", "Talking heads insert only a small number of additional parameters and a moderate amount of "
          "additional computation", "Abstract", "2H² parameters per layer; core +H/d_k (formula)", "masked_lm",
          "params", "lower", "relative", (), "THA", FORMULA, rule="analytic", analytic="tha_cost",
          needs_rows=False, paper_scale="a formula: no run needed"),
    Claim("THA.transfer", "THA improves transfer after pretraining (GLUE, SuperGLUE, SQuAD)", "Abstract; later "
          "tables", NV, "masked_lm", "test_loss", "lower", "relative", (), "THA", UNTESTABLE, rule="analytic",
          analytic="untestable_transfer", needs_rows=False,
          paper_scale="T5-base pretraining plus fine-tuning on GLUE/SuperGLUE/SQuAD per arm"),
    # ---- DCFormer / DCMHA (Xiao, Meng, Li, Yuan, ICML 2024, arXiv 2405.08553) -----------------------------------
    Claim("DC.icl", "DCFormer does much better than the Transformer on synthetic in-context tasks",
          "synthetic in-context table; data/synthetic_dataset.jsonl of the authors' repository", NV, "mqar",
          "test_acc", "higher", "points", (Comparison("dcmha vs mha, T = 64, n = 16", arm("dcmha"), arm("mha")),),
          "DCMHA", MQAR_SCOPE, where=HARD, controls=(arm("mha_qknorm"),), equivalence=2.0,
          paper_metric="the authors' synthetic ICL accuracy",
          paper_scale="DCFormer models at 405 M+ on the authors' synthetic set"),
    Claim("DC.ablate", "Dynamic composition beats static (talking-heads-like) composition", "ablation tables on the "
          "405 M model", NV, "mqar", "test_acc", "higher", "points",
          (Comparison("dcmha vs static composition", arm("dcmha"), arm("dcmha_static")),
           Comparison("dcmha vs tha", arm("dcmha"), arm("tha"))), "DCMHA", MQAR_SCOPE, where=HARD,
          equivalence=2.0, paper_scale="405 M ablations on the Pile"),
    Claim("DC.lm", "DCFormer significantly outperforms the Transformer in language modelling", "Abstract",
          "1.7–2.0× compute (the multiplier is DC.compute, another issue); loss values " + NV, "table5_gpt2",
          "test_loss", "lower", "relative", (Comparison("dcmha vs mha", PAPER_DCMHA, PAPER_MHA),), "DCMHA",
          T5_SCOPE, where={"dataset": "shakespeare"}, equivalence=1.0, paper_metric="Pile validation loss",
          paper_scale="405 M – 6.9 B models on the Pile"),
    Claim("DC.vit", "DCMHA improves a ViT on ImageNet-1K (DCViT)", "Abstract-level summaries", NV, "table6_vit",
          "top1", "higher", "difference", (Comparison("dcmha vs mha", PAPER_DCMHA, PAPER_MHA),), "DCMHA", T6_SCOPE,
          equivalence=1.0, unit="top-1 percentage points", paper_metric="ImageNet-1K top-1",
          paper_scale="ImageNet-1K ViT training per arm"),
    Claim("DC.cost", "DCMHA is parameter and computation efficient", "Abstract; complexity section",
          "405 M: +2.0 % parameters (formula)", "mqar", "params", "lower", "relative", (), "DCMHA", FORMULA,
          rule="analytic", analytic="dc_cost", needs_rows=False, paper_scale="a formula: no run needed"),
    Claim("DC.pythia", "DCPythia-6.9B beats Pythia-12B on pretraining perplexity and downstream tasks", "Abstract",
          "6.9 B vs 12 B (≈ 1.74× the parameters)", "table5_gpt2", "test_loss", "lower", "relative", (), "DCMHA",
          UNTESTABLE, rule="analytic", analytic="untestable_pythia", needs_rows=False,
          paper_scale="two multi-billion-parameter pretraining runs on 300 B tokens"),
    # ---- collaborative heads (Cordonnier, Loukas, Jaggi 2020, arXiv 2006.16362) ---------------------------------
    Claim("COL.quarter", "Collaborating heads reduce the key dimension 4× without loss: collaborative heads at a "
          "shared key width D/4 are no worse than concatenated heads at full width", "Abstract; NMT table "
          "(epfml/collaborative-attention nmt/README.md)", "BLEU 27.8 (collab., D_k = 256) vs 27.8 (concat., "
          "D_k = 1024)", "masked_lm", "test_loss", "lower", "relative",
          (Comparison("colmha D̃ = 16 vs mha D_k = 64", arm("colmha_16"), MHA_MLM),), "ColMHA", MLM_SCOPE,
          rule="noninferior", margin=1.0, paper_metric="WMT En-De BLEU",
          paper_scale="WMT17 En→De, 6+6 layers, D 1024, ≈ 6–12 V100-hours per run"),
    Claim("COL.gap", "As the key width shrinks, concatenated heads degrade and collaborative heads hold: the gap "
          "grows", "NMT table", "collab. − concat. BLEU: +0.1, +0.4, +0.7, +1.6 at D_k = 256, 128, 64, 32",
          "masked_lm", "test_loss", "lower", "relative",
          (Comparison("slope of the collab. gain over D_k", sweep("key_width", "colmha"),
                      sweep("key_width", "mha"), {}, -1),), "ColMHA", MLM_SCOPE, rule="slope", over="sweep_value",
          paper_scale="the NMT sweep over D_k (4 trainings per arm)"),
    Claim("COL.params", "Collaborative heads need fewer query/key parameters", "Abstract", "shared W̃_Q, W̃_K: "
          "2·D·D̃ + H·D̃ vs 2·D² (formula)", "masked_lm", "params", "lower", "relative", (), "ColMHA", FORMULA,
          rule="analytic", analytic="col_params", needs_rows=False, paper_scale="a formula: no run needed"),
    Claim("COL.flops", "Reducing the shared key dimension 4× makes the attention's score computation cheaper "
          "(the framing of 'reduce the key dimension by 4×'; our reading)", "Abstract (framing); the cost is ours",
          "a 4× smaller key dimension (abstract); its score cost computed (formula)", "masked_lm", "fwd_flops",
          "lower", "relative", (), "ColMHA", FORMULA, rule="analytic", analytic="col_flops", needs_rows=False,
          paper_scale="a formula: no run needed"),
    Claim("COL.reparam", "A trained MHA layer re-parametrizes exactly as collaborative heads at D̃ = D", "Abstract; "
          "README (example swap at D̃ = 768)", "max L1 output error 1.9e-6", "masked_lm", "params", "lower",
          "relative", (), "ColMHA", FORMULA, rule="analytic", analytic="col_reparam", needs_rows=False,
          paper_scale="computed exactly: no run needed"),
    # ---- Mixture of Attention Heads (Zhang, Shen, Huang, Zhou, Rong, Xiong, EMNLP 2022, arXiv 2210.05144) --------
    Claim("MOA.mlm", "MoA lowers masked-LM perplexity compared with the Transformer", "§5 (WikiText-103 masked LM)",
          NV, "masked_lm", "test_loss", "lower", "relative", (Comparison("moa vs mha", arm("moa"), MHA_MLM),),
          "MoA", MLM_SCOPE, equivalence=1.0, paper_metric="WikiText-103 masked-LM perplexity",
          paper_scale="WikiText-103 masked LM at BERT scale"),
    Claim("MOA.experts", "More experts at a fixed k (about constant compute) improve quality", "Abstract; E/k "
          "ablation", NV, "masked_lm", "test_loss", "lower", "relative",
          (Comparison("MoA's loss over E (k = 4)", sweep("experts", "moa"), None, {}, -1),), "MoA", MLM_SCOPE,
          rule="slope", over="sweep_value", paper_scale="the paper's E/k ablation (WMT14)"),
    Claim("MOA.params", "MoA's added parameters buy quality: MoA with 16 experts beats an MHA given the same "
          "parameters (SwitchHead's parameter-matched test of the abstract's scaling claim)", "Abstract; SwitchHead "
          "(Csordás et al., NeurIPS 2024) abstract", NV, "masked_lm", "test_loss", "lower", "relative",
          (Comparison("moa (E = 16) vs parameter-matched mha", arm("moa_e16"), arm("mha_params_moa16")),), "MoA",
          MLM_SCOPE, equivalence=1.0, paper_scale="matched-parameter baselines at WMT14 / WikiText-103 scale"),
    Claim("MOA.balance", "Experts are used in a balanced way", "analysis section (expert loads)", NV, "masked_lm",
          "expert_load_entropy", "higher", "difference", (), "MoA", MLM_SCOPE, rule="analytic",
          analytic="moa_balance", paper_scale="the loads of the paper's runs"),
    Claim("MOA.cost", "MoA scales the number of heads and parameters while keeping its computation about constant",
          "Abstract", "parameters 2·E·D·d_h + 2·D·d_h + D·E; per-token MACs grow by D per expert (formula)",
          "masked_lm", "params", "lower", "relative", (), "MoA", FORMULA, rule="analytic", analytic="moa_cost",
          needs_rows=False, paper_scale="a formula: no run needed"),
    Claim("MOA.default", "The authors' default run (≈ 28.4 BLEU, WMT14 En-De) is an instance of the sparse, "
          "compute-preserving MoA", "yikangshen/MoA README and run.sh", "28.4 BLEU (README); E = 8, k = 8, d_h = 128, "
          "D = 512 (run.sh)", "masked_lm", "params", "lower", "relative", (), "MoA", FORMULA, rule="analytic",
          analytic="moa_default", needs_rows=False, paper_scale="a formula: no run needed"),
    # ---- MMA (Cui, Iida, Hung, Utsuro, Nagata, WNGT 2019, D19-5622) ----------------------------------------------
    Claim("MMA.mlm", "Mixing global, local, forward and backward heads improves over the Transformer (+0.9 BLEU on "
          "average), in the encoder setting its backward heads need", "Abstract", "+0.9 BLEU on average (WAT17 "
          "En-Ja, IWSLT14 De-En)", "masked_lm", "test_loss", "lower", "relative",
          (Comparison("mma vs mha", arm("mma"), MHA_MLM),), "MMA", MLM_SCOPE, equivalence=1.0,
          paper_metric="BLEU", paper_scale="NMT on WAT17 En-Ja and IWSLT14 De-En per arm"),
    Claim("MMA.params", "MMA adds no parameters", "Abstract", "'without increasing the number of parameters' (formula)",
          "masked_lm", "params",
          "lower", "relative", (), "MMA", FORMULA, rule="analytic", analytic="mma_params", needs_rows=False,
          paper_scale="a formula: no run needed"),
    Claim("MMA.decoder", "MMA's improvement is consistent across tasks: also on a decoder-only generation task",
          "Abstract ('consistent and significant improvements')", "+0.9 BLEU on average", "table1_generation", "nll",
          "lower", "relative", (Comparison("mma vs mha", Arm("mma", {"variant": "mma", "flavor": "paper"}),
                                           PAPER_MHA),), "MMA", T1_SCOPE, where={"dataset": "concepts"},
          equivalence=1.0, paper_metric="BLEU", paper_scale="NMT per arm"),
)

PAPERS = {"tha": "THA.", "dcmha": "DC.", "colmha": "COL.", "moa": "MOA.", "mma": "MMA."}


def paper_of(claim_id: str) -> str:
    """The paper whose claim this is: tha, dcmha, colmha, moa, mma, or damcha (the DAMCHA paper's own claims)."""
    return next((p for p, prefix in PAPERS.items() if claim_id.startswith(prefix)), "damcha")


__all__ = ["PAPERS", "PAPER_CLAIMS", "paper_of"]
