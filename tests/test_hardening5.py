"""Hardening, round 5 (issue 51): the newest surfaces — compare, decode, dry runs, the correctness gate, swaps that
fail half-way, diverged seeds, tuning records, the index, a dying worker, deprecated paths and MoA's bf16 gate. Each
test fails on the code before it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent


# ---- 1. bench compare never passes on a case it could not compare --------------------------------------------------
def _bench_csv(path: Path, scale: float = 1.0, spread: float | None = 0.02, drop: str | None = None,
               status: dict | None = None, median: dict | None = None) -> str:
    rows = []
    for v, m in (("mha", 10.0), ("damcha", 20.0)):
        if v == drop:
            continue
        row = {"variant": v, "flavor": "paper", "batch": 4, "seq_len": 512, "d_model": 256, "n_heads": 8,
               "causal": False, "mode": "fwd_bwd", "dtype": "fp32", "compiled": False, "status": "ok", "message": "",
               "cpu_model": "Test CPU", "latency_median_ms": m * scale}
        if spread is not None:
            row |= {"latency_q25_ms": m * scale * (1 - spread), "latency_q75_ms": m * scale * (1 + spread)}
        if v in (status or {}):
            row |= {"status": status[v], "message": "RuntimeError: boom", "latency_median_ms": None}
        if v in (median or {}):
            row["latency_median_ms"] = median[v]
        rows.append(row)
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 8, b"variant,latency_median_ms\nmha,fast\n"],
                         ids=["empty", "binary", "non-numeric"])
def test_compare_refuses_unreadable_input_naming_the_file(tmp_path, capsys, content):
    from attention_zoo.bench import main

    bad = tmp_path / "new.csv"
    bad.write_bytes(content)
    assert main(["compare", _bench_csv(tmp_path / "base.csv"), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: new: ") and str(bad) in err[0], err


@pytest.mark.parametrize("new", [{"drop": "damcha"}, {"status": {"damcha": "error"}},
                                 {"median": {"damcha": float("nan")}}, {"median": {"damcha": float("inf")}}],
                         ids=["missing", "error", "nan", "inf"])
def test_compare_fails_on_a_base_case_the_new_run_did_not_time(tmp_path, capsys, new):
    from attention_zoo.bench import main

    rc = main(["compare", _bench_csv(tmp_path / "base.csv"), _bench_csv(tmp_path / "new.csv", **new),
               "--csv", str(tmp_path / "cmp.csv")])
    out = capsys.readouterr()
    assert rc == 1
    assert "damcha paper" in out.err and ("missing in new" in out.err or "no time in new" in out.err)
    table = pd.read_csv(tmp_path / "cmp.csv").set_index("case")
    assert table["fails"].sum() == 1 and table.filter(like="damcha", axis=0)["fails"].all()


def test_compare_judges_a_case_without_a_spread_by_the_threshold(tmp_path, capsys):
    from attention_zoo.bench import main

    base, new = _bench_csv(tmp_path / "b.csv", spread=None), _bench_csv(tmp_path / "n.csv", 1.5, spread=None)
    assert main(["compare", base, new]) == 1
    assert "regression (no spread: threshold alone)" in capsys.readouterr().out
    assert main(["compare", base, _bench_csv(tmp_path / "same.csv", 1.01, spread=None)]) == 0


def test_compare_checks_its_csv_before_any_work(tmp_path, capsys):
    from attention_zoo.bench import main

    base = _bench_csv(tmp_path / "b.csv")
    assert main(["compare", base, base, "--csv", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip().startswith("error: csv: ") and len(out.err.strip().splitlines()) == 1


# ---- 2. bench decode refuses sizes that can never work, before any work --------------------------------------------
@pytest.mark.parametrize(("argv", "arg"), [(["--contexts", str(10**30)], "contexts"),
                                           (["--d-model", "30", "--heads", "4"], "d_model")],
                         ids=["huge-context", "width-not-divisible"])
def test_decode_refuses_impossible_sizes_with_one_error_line(capsys, monkeypatch, argv, arg):
    from attention_zoo.bench import main
    from attention_zoo.measure import decode

    monkeypatch.setattr(decode.subprocess, "run", lambda *a, **k: pytest.fail("a child was started"))
    assert main(["decode", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and out.err.startswith(f"error: {arg}: "), out.err
    with pytest.raises(ValueError, match=f"^{arg}: "):
        decode.decode_benchmark("mha", **({"contexts": [10**30]} if arg == "contexts" else {"d_model": 30,
                                                                                              "heads": 4}))


# ---- 3. a dry run checks what the run checks, and downloads and writes nothing ------------------------------------
@pytest.mark.parametrize(("module", "argv", "arg"), [
    ("efficiency.table2_efficiency", ["--settings", "bogus"], "settings"),
    ("efficiency.table2_efficiency", ["--counters", "bogus"], "counters"),
    ("efficiency.table2_efficiency", ["--variants", "bogus"], "variants"),
    ("efficiency.table7_complexity", ["--variants", "bogus"], "variants"),
    ("efficiency.rowsum_analysis", ["--sections", "bogus"], "sections"),
    ("generation.appendix_e_kde", ["--variants", "bogus"], "variants"),
    ("synthetic.sweep", ["--slurm-extra", "bogus=1"], "slurm-extra"),
    ("efficiency.table2_efficiency", ["--launcher", "submitit", "--submitit-cluster", "local", "--slurm-extra",
                                      "bogus=1"], "slurm-extra"),
    ("generation.table4_ablation", ["--launcher", "submitit", "--submitit-cluster", "local", "--slurm-extra",
                                    "slurm_time=-5"], "slurm-extra"),
], ids=lambda v: v if isinstance(v, str) else "-".join(v)[:40])
def test_a_dry_run_refuses_what_the_run_refuses(tmp_path, capsys, module, argv, arg):
    import importlib

    main = importlib.import_module(f"attention_zoo.experiments.{module}").main
    out = tmp_path / "out"
    assert main(["--dry-run", "--out", str(out), "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {arg}: "), err
    assert not out.exists()


def test_a_dry_run_with_missing_data_names_it_and_downloads_and_creates_nothing(tmp_path, capsys, monkeypatch):
    from attention_zoo.data import fetch
    from attention_zoo.experiments.vision import table6_vit

    def no_network(*a, **k):
        raise AssertionError("a dry run tried to download")

    monkeypatch.setattr(fetch.urllib.request, "urlopen", no_network)
    data, out = tmp_path / "data", tmp_path / "out"
    assert table6_vit.main(["--dry-run", "--preset", "cifar10", "--data-dir", str(data), "--out", str(out),
                            "--device", "cpu", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "cifar10" in text and "not on disk" in text and "download" in text
    assert not data.exists() and not out.exists()


# ---- 4. the correctness gate checks the timed dtype's gradients and names what it refuses -------------------------
@pytest.fixture
def nan_grad_fp32():
    """A plugin whose float32 parameter gradients are NaN (its outputs and input gradients are MHA's)."""
    import torch

    import attention_zoo as zoo
    from attention_zoo import registry
    from attention_zoo.variants.mha import MultiHeadAttention

    before = dict(registry._REGISTRY)

    class _PoisonGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return w.view_as(w)

        @staticmethod
        def backward(ctx, g):
            return g * float("nan") if g.dtype == torch.float32 else g

    @zoo.register_attention("h5_nan_grad")
    class NanGrad(MultiHeadAttention):
        def _attend(self, x, masks, stack_context):
            w = _PoisonGrad.apply(self.out_proj.weight)
            y = super()._attend(x, masks, stack_context)
            return y + 0 * (w.sum() * x[..., :1]).to(y.dtype)

    try:
        yield "h5_nan_grad"
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)


def test_the_gate_refuses_nan_parameter_gradients_in_the_timed_dtype(nan_grad_fp32):
    from attention_zoo.measure.gate import check_variant, gate_status

    why = check_variant(nan_grad_fp32)
    assert why is not None and "non-finite parameter gradient in float32" in why and gate_status(why) == "nan"


def test_bench_names_a_refused_variant_on_stderr_under_quiet(nan_grad_fp32, tmp_path, capsys):
    from attention_zoo.bench import main

    csv = tmp_path / "b.csv"
    main(["--variants", nan_grad_fp32, "--batch", "1", "--seq-len", "8", "--d-model", "16", "--heads", "2",
          "--modes", "fwd", "--warmup", "0", "--min-time", "0.001", "--min-repeats", "2", "--no-memory", "--quiet",
          "--device", "cpu", "--results-file", str(csv)])
    err = capsys.readouterr().err
    assert f"{nan_grad_fp32}/paper fp32: refused by the correctness gate" in err
    df = pd.read_csv(csv)
    assert df.loc[df["variant"] == nan_grad_fp32, "latency_median_ms"].isna().all()


# ---- 5. a swap is all or nothing ------------------------------------------------------------------------------------
def _gpt2_inverse_layer_scale():
    from transformers import GPT2Config, GPT2LMHeadModel

    # layer 0 scales its logits as ours do, layer 1 by 1/(layer_idx + 1) more: its weights cannot be copied
    cfg = GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=64, bos_token_id=0, eos_token_id=0,
                     scale_attn_by_inverse_layer_idx=True)
    return GPT2LMHeadModel(cfg), "transformer.h.1.attn"


def _encoder_with_bias_kv_layer():
    import torch

    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
    enc.layers[1].self_attn = torch.nn.MultiheadAttention(16, 2, add_bias_kv=True, batch_first=True)
    return enc, "layers.1.self_attn"


@pytest.mark.parametrize("name", ["mha", "damcha"])  # damcha: stack-shared, takes the host's V and output projection
@pytest.mark.parametrize("build", [_gpt2_inverse_layer_scale, _encoder_with_bias_kv_layer],
                         ids=["gpt2-layer-scale", "encoder-bias-kv"])
def test_a_swap_refused_at_a_later_layer_leaves_the_model_as_it_was(build, name):
    import torch

    import attention_zoo as zoo

    torch.manual_seed(0)
    model, bad = build()
    model.eval()
    kinds = {n: type(m) for n, m in model.named_modules()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"^model\.{bad}: "):
        zoo.swap_attention(model, name)
    assert {n: type(m) for n, m in model.named_modules()} == kinds
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not hasattr(model, "attention_zoo_swap") and not hasattr(model, "attention_zoo_shared")


# ---- 6. diverged seeds are failures of their arm, not missing data ------------------------------------------------
def _diverged_frame(arm: str, how: str, k: int = 2, n: int = 10):
    """Synthetic rows at λ = 1: DAMCHA 10 % below MHA's test MSE on every seed, and ``k`` seeds of ``arm`` diverged
    (``how``: a status ``nan`` row with a NaN value, as the training loops store it, or an infinite value)."""
    rows = []
    for s in range(n):
        base = 0.2 + 0.02 * s
        for v, value in (("mha", base), ("damcha", base * 0.9 * (1 + 0.01 * ((s % 3) - 1)))):
            row = {"task": "regression", "lam": 1.0, "d_e": 8, "seed": s, "variant": v, "flavor": "paper",
                   "metric": "test_mse", "value": value, "status": "ok"}
            if v == arm and s < k:
                row |= {"value": float("nan"), "status": "nan", "message": "diverged"} if how == "status" else \
                    {"value": float("inf")}
            rows.append(row)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("how", ["status", "inf"])
@pytest.mark.parametrize("arm", ["damcha", "mha"])
def test_a_comparison_that_loses_seeds_to_divergence_is_not_decidable(arm, how):
    from attention_zoo.claims import decide, get_claim
    from attention_zoo.claims.data import StoreRows

    frame = _diverged_frame(arm, how)
    rows = StoreRows(frame, Path("x.jsonl"), "ctx", ["run"], ["abc"])
    v = [v for v in decide({("synthetic", "decide"): rows}, (get_claim("I.lambda1"),)) if v.preset == "decide"][0]
    assert v.verdict == f"not decidable: 2 of 10 seeds of {arm} diverged", (v.verdict, v.ours)
    assert f"2 of 10 seeds of {arm} diverged" in v.ours
    healthy = StoreRows(_diverged_frame(arm, how, k=0), Path("x.jsonl"), "ctx", ["run"], ["abc"])
    assert [v for v in decide({("synthetic", "decide"): healthy}, (get_claim("I.lambda1"),))
            if v.preset == "decide"][0].verdict == "supported"


def test_delta_tables_name_the_seeds_lost_to_divergence():
    from attention_zoo.claims.paired import delta_frame, delta_table

    d = delta_frame(_diverged_frame("damcha", "status"), ["metric"], {"variant": "mha", "flavor": "paper"})
    assert d["n"].tolist() == [8] and d["diverged"].tolist() == [2]
    assert "(n=8; 2 diverged)" in delta_table(d, ["metric"]).iloc[0, 1]


# ---- 7. guest manners: the gate and the FLOP counters leave the caller's process as they found it -----------------
def test_the_gate_leaves_the_callers_torch_rng_alone():
    import torch

    from attention_zoo.measure.gate import check_variant

    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    assert check_variant("mha") is None
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("counters", [("fvcore",), ("flop_counter",)])
def test_flop_counting_keeps_a_training_model_training_and_the_fvcore_logger_level(counters):
    import logging

    import torch

    import attention_zoo as zoo
    from attention_zoo.measure.flops import count_flops

    model = zoo.models.Decoder(32, 16, 2, 2, attention="mha")
    model.train()
    model.stack.eval()  # a mixed state is restored module by module
    modes = {n: m.training for n, m in model.named_modules()}
    log = logging.getLogger("fvcore")
    before = log.level
    log.setLevel(logging.INFO)
    try:
        count_flops(model, (torch.randint(0, 32, (1, 8)),), 1, 8, counters=counters)
        assert {n: m.training for n, m in model.named_modules()} == modes
        assert log.level == logging.INFO
    finally:
        log.setLevel(before)


# ---- 8. tuning records: seeds, not counts; a record without its setting is refused -------------------------------
def _tune_record(lr, wd, seed, val, drop=()):
    cell = {"variant": "mha", "phase": "tune", "lr": lr, "weight_decay": wd, "seed": seed}
    return {"cell": {k: v for k, v in cell.items() if k not in drop}, "rows": [{"metric": "val_loss", "value": val}]}


def test_a_missing_tuning_seed_is_not_replaced_by_a_foreign_one():
    from attention_zoo.experiments.tuning import Tuning, arm_id, choose, tune_scores, tuned_cells

    tuning = Tuning(lrs=(1e-3, 3e-3), weight_decays=(0.0,), tune_seeds=(7, 8), seeds=tuple(range(10)))
    recs = [_tune_record(lr, 0.0, 7, 1.0 + lr) for lr in tuning.lrs]
    recs += [_tune_record(lr, 0.0, 99, 5.0 - lr) for lr in tuning.lrs]  # seed 8 missing; seed 99 is not a tuning seed
    assert choose(tuning, tune_scores(recs, "val_loss")[arm_id({"variant": "mha"})]) is None
    cells, waiting, choices = tuned_cells(tuning, [{"variant": "mha"}], recs)
    assert not choices and len(waiting) == 10 and not [c for c in cells if c["phase"] == "tuned"]
    recs += [_tune_record(lr, 0.0, 8, 1.0 + lr) for lr in tuning.lrs]
    choice = choose(tuning, tune_scores(recs, "val_loss")[arm_id({"variant": "mha"})])
    assert choice.setting == {"lr": 1e-3, "weight_decay": 0.0} and choice.score == 1.0 + 1e-3  # seed 99 unused


@pytest.mark.parametrize("drop", ["lr", "weight_decay", "seed"])
def test_a_tuning_record_without_its_setting_is_refused_clearly(drop):
    from attention_zoo.experiments.tuning import Tuning, tuned_cells

    tuning = Tuning(lrs=(1e-3,), weight_decays=(0.0,), tune_seeds=(7,), seeds=(0,))
    with pytest.raises(ValueError, match=rf"^records: a tuning cell without its {drop}"):
        tuned_cells(tuning, [{"variant": "mha"}], [_tune_record(1e-3, 0.0, 7, 1.0, drop=(drop,))])


# ---- 9. the index survives an unreadable environment record --------------------------------------------------------
@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '"text"', '{"runs": "x", "git_commit": "abc1234"}'],
                         ids=["corrupt", "list", "string", "runs-not-a-list"])
def test_the_index_is_built_around_an_unreadable_environment_record(tmp_path, content):
    import json

    from attention_zoo.experiments.freshness import sittings
    from attention_zoo.experiments.results_index import build_index

    good = tmp_path / "table9"
    good.mkdir()
    (good / "table9.env.json").write_text(json.dumps({"device_name": "TestCPU", "device": "cpu"}))
    folder = tmp_path / "table5_gpt2"
    folder.mkdir()
    (folder / "table5_gpt2.env.json").write_text(content)
    assert all(isinstance(s, dict) for s in sittings(folder))
    md = build_index(tmp_path).read_text()
    assert "TestCPU" in md and "## Table 5" in md  # the rest of the index is there
    if not content.startswith('{"runs"'):
        assert "**Unreadable environment record:** `table5_gpt2/table5_gpt2.env.json`" in md
        assert "- `table5_gpt2/table5_gpt2.env.json`: unreadable" in md


# ---- 10. the local launcher survives a worker that dies -------------------------------------------------------------
def _dies_on_one(unit):
    """A unit of the planted run: unit 1's worker is killed (as the out-of-memory killer would) while unit 0 is still
    running beside it, so the pool's break cannot tell which of the two died; the others work."""
    import os
    import signal
    import time

    c = unit[0]["c"]
    if c == 1:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0 if c == 0 else 0.1)
    return [[{"metric": "m", "value": float(c), "unit": ""}]]


@pytest.mark.parametrize("workers", [2, 3])
def test_a_worker_that_dies_fails_its_unit_and_the_others_are_stored(tmp_path, capsys, workers):
    from argparse import Namespace

    from attention_zoo.experiments.protocol import Plan, execute
    from attention_zoo.results import ResultStore

    store = ResultStore(tmp_path, "dying", {"options": {}})
    units = [[{"c": i}] for i in range(6)]
    plan = Plan(store, units, _dies_on_one, lambda: 0, workers=workers)
    code = execute(plan, Namespace(dry_run=False, launcher="local", quiet=True), "dying")
    err = capsys.readouterr().err
    assert code == 1
    assert "failed 1 cell(s): worker process" in err and "SIGKILL" in err, err
    store.refresh()
    assert [c for c in range(6) if store.is_done({"c": c})] == [0, 2, 3, 4, 5]


# ---- 11. deprecated paths reach every name of the old module, and python -m of an old path works ------------------
OLD_NAMES = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as w:
    from attention_zoo.experiments.table1_generation import PAPER, paper_comparison, TEXT_METRICS
    from attention_zoo.experiments.table3_depth_blocks import temperature_rows, INFERENCE
    from attention_zoo.experiments.table4_ablation import relative_changes, STAND_INS
    from attention_zoo.experiments.table5_gpt2 import PAPER_DATASETS
    from attention_zoo.experiments.generation import TextData, AUTHOR_TOKENIZERS  # an old module, now a package
from attention_zoo.experiments.generation import data, table1_report as t1, table3_report as t3, ablations
from attention_zoo.experiments.generation import table4_report as t4
from attention_zoo.experiments.lm import table5_report as t5
assert PAPER is t1.PAPER and paper_comparison is t1.paper_comparison and TEXT_METRICS is t1.TEXT_METRICS
assert temperature_rows is t3.temperature_rows and INFERENCE is ablations.INFERENCE
assert relative_changes is t4.relative_changes and STAND_INS is t4.STAND_INS and PAPER_DATASETS is t5.PAPER_DATASETS
assert TextData is data.TextData and AUTHOR_TOKENIZERS is data.AUTHOR_TOKENIZERS
moved = [str(x.message) for x in w if issubclass(x.category, DeprecationWarning)]
assert any("table1_generation.PAPER moved to attention_zoo.experiments.generation.table1_report.PAPER" in m
           for m in moved), moved
assert any("generation.TextData moved to attention_zoo.experiments.generation.data.TextData" in m for m in moved)
import importlib
from attention_zoo.experiments import MOVED_NAMES
for old, names in MOVED_NAMES.items():
    mod = importlib.import_module(f"attention_zoo.experiments.{old}")
    for name in names:
        getattr(mod, name)
print("ok")
"""


def test_old_paths_reach_the_names_that_moved_on_into_other_modules():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", OLD_NAMES], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


@pytest.mark.parametrize(("old", "expect"), [("table5_gpt2", "python reproduce/table5_gpt2.py"),
                                             ("synthetic", "python reproduce/synthetic.py"),
                                             ("train_speed", "usage: python -m attention_zoo.bench train")])
def test_python_dash_m_of_an_old_path_points_to_or_runs_the_new_module(old, expect):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", f"attention_zoo.experiments.{old}", "--help"], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert f"attention_zoo.experiments.{old} moved to attention_zoo.experiments." in res.stderr
    assert expect in res.stdout + res.stderr


# ---- 12. the gate compares a routed variant under the float64 pass's routing ----------------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_moa_damcha_repo_passes_the_low_precision_gate_under_the_float64_routing(dtype):
    import torch

    from attention_zoo.measure.gate import check_variant

    notes = []
    assert check_variant("moa", {"flavor": "damcha_repo"}, getattr(torch, dtype), autocast=True, notes=notes) is None
    assert notes and all("compared under the float64 pass's routing" in n for n in notes), notes


def test_the_issues_bf16_benchmark_of_moa_reports_a_time_and_says_how_it_was_checked():
    import attention_zoo as zoo

    df = zoo.benchmark(["moa"], [(1, 8, 32, 4)], device="cpu", dtype="bf16", flavors=("paper", "damcha_repo"),
                       memory=False, warmup=0, min_time_s=0.0, min_repeats=2)
    repo = df[(df["variant"] == "moa") & (df["flavor"] == "damcha_repo")]
    assert len(repo) == 2 and (repo["status"] == "ok").all() and repo["latency_median_ms"].notna().all()
    assert repo["message"].str.contains("float64 pass's routing").all()


@pytest.fixture
def wrong_bf16_moa():
    """MoA (damcha_repo) whose path is wrong in bfloat16 only: the routing replay must not hide it."""
    import torch

    import attention_zoo as zoo
    from attention_zoo import registry
    from attention_zoo.variants.moa import MixtureOfAttentionHeads

    before = dict(registry._REGISTRY)

    @zoo.register_attention("h5_moa_wrong_bf16")
    class Wrong(MixtureOfAttentionHeads):
        def _attend(self, x, masks, stack_context, rotary=None):
            y = super()._attend(x, masks, stack_context, rotary)
            return y + 0.1 * y.abs().amax() if y.dtype == torch.bfloat16 else y

    try:
        yield "h5_moa_wrong_bf16"
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)


def test_the_routing_replay_does_not_hide_a_wrong_low_precision_path(wrong_bf16_moa):
    import torch

    from attention_zoo.measure.gate import check_variant

    why = check_variant(wrong_bf16_moa, {"flavor": "damcha_repo"}, torch.bfloat16, autocast=True)
    assert why is not None and "differs from float64" in why


@pytest.mark.parametrize("flavor", ["paper", "damcha_repo"])
def test_moa_numerics_are_unchanged_by_recording_and_replaying_its_own_routing(flavor):
    import copy

    import torch

    import attention_zoo as zoo
    from attention_zoo.variants import moa

    torch.manual_seed(0)
    m = zoo.create_attention("moa", d_model=32, n_heads=4, causal=True, flavor=flavor)
    torch.nn.init.normal_(m.router.weight)  # a router that has learned something: routes differ across tokens
    x = torch.randn(2, 8, 32)
    runs = []
    for ctx in (None, "record", "replay"):
        model, xi = copy.deepcopy(m), x.clone().requires_grad_()
        if ctx is None:
            y = model(xi)
        elif ctx == "record":
            with moa.routing() as routes:
                y = model(xi)
        else:
            with moa.routing(routes):
                y = model(xi)
        (y.square().mean() + model.aux_loss).backward()
        runs.append((y.detach(), xi.grad, [p.grad for p in model.parameters()]))
    (y0, g0, p0), *others = runs
    for y, g, p in others:
        assert torch.equal(y, y0) and torch.equal(g, g0)
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(p, p0))
    assert len(routes) == 1 and routes[0].shape[-1] == 4 and routes[0].numel() == 2 * 8 * 4
    assert len({tuple(r) for r in routes[0].reshape(-1, 4).tolist()}) > 1
