"""Hardening, round 4 (issue 35), the library: every variant trains in low precision, library calls leave the
caller's process as they found it, a plugin's memory is measured, one failing case loses nothing, and swaps into
pretrained hosts copy what they can and say what they change. The command lines: test_hardening4_cli.py. Each test
fails on the code before it."""

from __future__ import annotations

import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

import attention_zoo as zoo
from attention_zoo import bench, plugins, registry
from attention_zoo.checks import MissingInputError
from attention_zoo.experiments.generation import appendix_e_kde
from attention_zoo.results import ResultStore
from attention_zoo.variants import moa

ROOT = Path(__file__).resolve().parent.parent
FAST = {"device": "cpu", "warmup": 0, "min_time_s": 0.0, "min_repeats": 2}

ATTENTIONS = zoo.list_attentions(include_controls=True)
# (name, options): every registered attention in each of its flavours, and DCMHA's static mix, which adds an fp32
# parameter to the mixed core
LOW_PRECISION_CASES = [(n, {"flavor": f}) for n in ATTENTIONS for f in zoo.get_attention_spec(n).flavors] + [
    ("dcmha", {"use_static": True})]
PRECISIONS = {"bf16 autocast": (torch.float32, torch.bfloat16), "fp16 autocast": (torch.float32, torch.float16),
              "bf16 weights": (torch.bfloat16, None)}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _train_step(model, inputs, autocast_dtype) -> tuple[torch.Tensor, list[str]]:
    """One forward and backward; (the output, the parameters whose gradient is missing or not finite)."""
    device = inputs.device.type
    with torch.autocast(device, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        out = model(inputs)
        out = out[0] if isinstance(out, tuple) else out
        loss = out.float().square().mean()
    loss.backward()
    bad = [n for n, p in model.named_parameters()
           if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all())]
    return out, bad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize(("name", "options"), LOW_PRECISION_CASES, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={o}" for k, o in v.items()))
def test_every_attention_trains_in_low_precision_as_a_layer_and_in_a_decoder(name, options, precision, device):
    weights, autocast_dtype = PRECISIONS[precision]
    torch.manual_seed(0)
    layer = zoo.create_attention(name, d_model=32, n_heads=4, causal=True, **options).to(device, weights)
    out, bad = _train_step(layer, torch.randn(2, 8, 32, dtype=weights, device=device), autocast_dtype)
    assert out.dtype == (autocast_dtype or weights) and torch.isfinite(out).all() and not bad, bad
    decoder = zoo.models.Decoder(50, 32, 2, 4, attention=name, attention_options=options).to(device, weights)
    out, bad = _train_step(decoder, torch.randint(0, 50, (2, 8), device=device), autocast_dtype)
    assert torch.isfinite(out).all() and not bad, bad


def test_moa_expert_matmul_follows_autocast():
    """Under bf16 autocast MoA's grouped expert GEMM computes in bf16, as the Linear layers around it do."""
    torch.manual_seed(0)
    inp, w = torch.randn(6, 8), torch.randn(2, 8, 4)
    pos, offs = torch.arange(6), torch.tensor([3, 6], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert moa._expert_linear(inp, w, pos, offs, 1, 1).dtype == torch.bfloat16
    assert moa._expert_linear(inp.double(), w.double(), pos, offs, 1, 1).dtype == torch.float64


# ---- library calls leave the caller's process as they found it ----------------------------------------------------
def _python(code: str, **env) -> str:
    """Run ``code`` in a fresh interpreter (this checkout first on the path; ``env`` values of None unset); its last
    stdout line."""
    full_env = {k: v for k, v in {**os.environ, "PYTHONPATH": str(ROOT), **env}.items() if v is not None}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_import_changes_nothing_in_the_callers_process():
    """No environment variable (THP_MEM_ALLOC_ENABLE was set), thread count, default dtype, RNG state or warnings
    filter differs after importing the package and its main modules."""
    changed = _python("""
        import json, os, random, warnings
        import numpy as np, torch
        def state():
            return {"env": dict(os.environ), "threads": torch.get_num_threads(),
                    "dtype": str(torch.get_default_dtype()),
                    "rng": torch.get_rng_state().tolist(), "py_rng": random.getstate()[1][:8],
                    "np_rng": np.random.get_state()[1][:8].tolist(), "warnings": [repr(f) for f in warnings.filters],
                    "grad": torch.is_grad_enabled(), "matmul": torch.get_float32_matmul_precision()}
        before = state()
        import attention_zoo, attention_zoo.bench, attention_zoo.models, attention_zoo.measure
        after = state()
        print(json.dumps(sorted(k for k in before if before[k] != after[k])
                         + sorted(k for k in after["env"] if after["env"].get(k) != before["env"].get(k))))
    """, THP_MEM_ALLOC_ENABLE=None)
    assert json.loads(changed) == []


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
def test_benchmark_leaves_the_rng_and_the_heap_as_it_found_them():
    """The caller's torch RNG stream is not reseeded or advanced; after the call glibc returns freed memory again
    (the timing's kept-memory setting is restored) and the timing's padded heap is gone."""
    rng_same, grown_mib, freed_mib = json.loads(_python("""
        import json, os, torch
        import attention_zoo as zoo
        def rss():
            return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) / 1024
        def run():
            zoo.benchmark("mha", [(1, 16, 32, 4)], device="cpu", warmup=1, min_time_s=0.0, min_repeats=2,
                          memory=False)
        os.environ["ATTENTION_ZOO_MALLOC_RETAIN"] = "0"  # a first call without the pad: imports and caches
        run()
        del os.environ["ATTENTION_ZOO_MALLOC_RETAIN"]
        torch.manual_seed(123)
        state = torch.get_rng_state()
        before = rss()
        run()
        rng_same = torch.equal(torch.get_rng_state(), state)
        grown = rss() - before
        t = torch.ones(1 << 24); held = rss(); del t
        print(json.dumps([rng_same, grown, held - rss()]))
    """))
    assert rng_same
    assert grown_mib < 128  # the timing pads at least 256 MiB, trimmed on return
    assert freed_mib > 48  # a freed 64 MiB tensor goes back to the kernel, as glibc's default does


def test_benchmark_plot_keeps_the_callers_backend_and_rcparams(tmp_path):
    same = json.loads(_python(f"""
        import json, matplotlib
        matplotlib.use("pdf")
        matplotlib.rcParams["font.size"] = 13.0
        import matplotlib.pyplot as plt
        import pandas as pd
        from attention_zoo import bench
        before = dict(matplotlib.rcParams)
        df = pd.DataFrame({{"status": ["ok"] * 2, "mode": ["fwd_bwd"] * 2, "compiled": [False] * 2,
                           "variant": ["mha"] * 2, "flavor": ["paper"] * 2, "seq_len": [8, 16],
                           "latency_median_ms": [1.0, 2.0], "peak_mib": [3.0, 5.0]}})
        bench.plot(df, {str(tmp_path / "p.png")!r})
        after = dict(matplotlib.rcParams)
        print(json.dumps([matplotlib.get_backend().lower(), sorted(k for k in before if before[k] != after[k]),
                          plt.get_fignums()]))
    """, MPLBACKEND=None))
    assert same == ["pdf", [], []]
    assert (tmp_path / "p.png").stat().st_size > 0


def test_appendix_e_writes_nothing_next_to_its_input(tmp_path):
    """Table 1's folder is an input of App. E: no lock file (nor anything else) appears in it."""
    made = ResultStore(tmp_path / "made", "table1_generation")
    made.add({"preset": "smoke", "dataset": "digits", "variant": "mha", "flavor": "paper", "seed": 0},
             [{"metric": "mse", "value": 1.0}])
    inp = tmp_path / "table1"
    inp.mkdir()
    shutil.copy(made.path, inp / made.path.name)
    before = sorted(p.name for p in inp.iterdir())
    with pytest.raises(MissingInputError, match="no finished"):
        appendix_e_kde.load_samples(inp, "smoke", "*", "paper", None, None)
    assert sorted(p.name for p in inp.iterdir()) == before


# ---- plugins in the memory subprocess; one failure loses nothing ---------------------------------------------------
PLUGIN = '''
import attention_zoo as zoo
from attention_zoo.variants.mha import MultiHeadAttention


@zoo.register_attention("{name}")
class Plugin(MultiHeadAttention):
    """MHA under another name{doc}."""
{body}
'''
RAISING = '''
    def _attend(self, x, masks, stack_context):
        raise RuntimeError("plugin bug: boom")
'''


@pytest.fixture
def clean_registry(monkeypatch):
    """Plugins registered by a test are gone afterwards, from the registry and from sys.modules."""
    before, modules = dict(registry._REGISTRY), set(sys.modules)
    monkeypatch.setenv(plugins.ENV, "")
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)
    for name in set(sys.modules) - modules:
        if "h4_plugin" in name:
            del sys.modules[name]
    plugins._loaded.difference_update({k for k in plugins._loaded if "h4_" in k})


def _import_plugin(tmp_path, monkeypatch, name: str, body: str = "") -> None:
    (tmp_path / f"{name}.py").write_text(PLUGIN.format(name=name, doc="", body=body))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)


@pytest.mark.parametrize("how", ["import", "include"])
def test_memory_of_a_plugin_is_measured(tmp_path, monkeypatch, clean_registry, how):
    """After ``import h4_plugin`` registered it (no --include), the memory child imports it too; an --include'd
    file still works."""
    if how == "import":
        _import_plugin(tmp_path, monkeypatch, "h4_plugin")
    else:
        (tmp_path / "h4_plugin.py").write_text(PLUGIN.format(name="h4_plugin", doc="", body=""))
        plugins.load_plugins([str(tmp_path / "h4_plugin.py")])
    df = zoo.benchmark(["h4_plugin"], [(1, 16, 32, 4)], modes=("fwd",), **FAST, memory=True)
    row = df[df["variant"] == "h4_plugin"].iloc[0]
    assert row["status"] == "ok" and row["peak_mib"] >= 0, row[["status", "message"]]  # a number, never NaN


def test_memory_of_a_plugin_no_child_can_import_is_not_an_ok_nan(clean_registry):
    """A variant registered in ``__main__`` (a script, a notebook) cannot be imported by the child: the row says
    so, never NaN marked ok."""
    namespace = {}
    exec(PLUGIN.format(name="h4_main", doc="", body=""), {"__name__": "__main__"}, namespace)
    df = zoo.benchmark(["h4_main"], [(1, 16, 32, 4)], modes=("fwd",), **FAST, memory=True)
    row = df[df["variant"] == "h4_main"].iloc[0]
    assert row["status"] == "error" and "__main__" in row["message"]


def test_one_failing_variant_loses_no_other_row(tmp_path, monkeypatch, clean_registry, capsys):
    _import_plugin(tmp_path, monkeypatch, "h4_plugin_raises", RAISING)
    df = zoo.benchmark(["h4_plugin_raises", "tha"], [(1, 16, 32, 4)], **FAST)
    bad = df[df["variant"] == "h4_plugin_raises"]
    assert len(bad) == 2 and (bad["status"] == "error").all() and bad["message"].str.contains("boom").all()
    assert (df[df["variant"] != "h4_plugin_raises"]["status"] == "ok").sum() == 4
    csv = tmp_path / "rows.csv"
    code = bench.main(["--variants", "h4_plugin_raises", "--seq-len", "16", "--d-model", "32", "--heads", "4",
                       "--batch", "1", "--device", "cpu", "--warmup", "0", "--min-time", "0.001",
                       "--min-repeats", "2", "--no-memory", "--quiet", "--results-file", str(csv)])
    assert code == 1 and "boom" in capsys.readouterr().err
    rows = pd.read_csv(csv)
    assert set(rows["status"]) == {"ok", "error"} and len(rows) == 4


# ---- swaps that would silently change a pretrained model -----------------------------------------------------------
def _llama(**kw):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64, "pad_token_id": 0,
           "bos_token_id": 1, "eos_token_id": 2, "attn_implementation": "sdpa", **kw}
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))


def test_a_damcha_swap_copies_what_damcha_has_and_reports_the_growth():
    model = _llama(attention_bias=True)
    host = model.model.layers[1].self_attn
    v, o, v_bias = host.v_proj.weight.clone(), host.o_proj.weight.clone(), host.v_proj.bias.clone()
    before = sum(p.numel() for p in model.parameters())
    with pytest.warns(UserWarning) as caught:
        zoo.swap_attention(model, "damcha")  # the default generator: far larger than the host
    texts = [str(w.message) for w in caught]
    assert any("grew the model" in t and f"{before:,}" in t for t in texts)
    assert any("no place for the host's q, k projection(s)" in t for t in texts)
    attn = model.model.layers[1].self_attn.attn
    assert torch.equal(attn.v_proj.weight, v) and torch.equal(attn.out_proj.weight, o)
    assert torch.equal(attn.v_proj.bias, v_bias)
    info = model.attention_zoo_swap
    assert info["params_before"] == before and info["params_after"] == sum(p.numel() for p in model.parameters())
    assert info["params_after"] > 2 * before and info["copied"] == ["v", "out"]


def test_a_damcha_swap_refuses_hosts_it_cannot_copy_faithfully():
    timm = pytest.importorskip("timm")
    vit = timm.models.vision_transformer.VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=1,
                                                           num_heads=4, qk_norm=True)
    with pytest.raises(ValueError, match=r"^model\.blocks\.0\.attn: cannot copy .*'damcha'.*qk_norm"):
        zoo.swap_attention(vit, "damcha", hidden_dims=(16,))
    with pytest.raises(ValueError, match=r"cannot copy .*'damcha'.*num_key_value_heads=2"):
        zoo.swap_attention(_llama(num_key_value_heads=2), "damcha", hidden_dims=(16,))
    assert zoo.swap_attention(vit, "damcha", hidden_dims=(16,), copy_weights=False)(torch.randn(1, 3, 16, 16)) \
        .shape == (1, 1000)


def test_generate_with_hf_defaults_works_after_a_stack_shared_swap():
    model = zoo.swap_attention(_llama(), "damcha", hidden_dims=(16,), copy_weights=False).eval()
    ids = torch.randint(3, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kw), model.generate(ids, use_cache=False, **kw))
    assert model.generation_config.use_cache is False and model.attention_zoo_swap["use_cache"] is False
