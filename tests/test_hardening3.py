"""Hardening, round 3 (issue 22): the benchmark API, plugins, reports over several runs, downloads and child
processes fail cleanly or work. Each test goes through the public API or a CLI and fails on the code before it."""

from __future__ import annotations

import hashlib
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

import attention_zoo as zoo
from attention_zoo import bench, plugins, registry
from attention_zoo.adapters import _tvhook
from attention_zoo.data.fetch import DatasetError, download
from attention_zoo.experiments import run_all
from attention_zoo.experiments.efficiency import table7_complexity
from attention_zoo.experiments.lm import table5_gpt2
from attention_zoo.experiments.synthetic import sweep as synthetic
from attention_zoo.experiments.vision import table6_vit
from attention_zoo.io import atomic_write_csv, atomic_write_text, read_jsonl
from attention_zoo.measure import guarded, measure_latency, memory_item, quick, workload_spec
from attention_zoo.metrics import images as mi
from attention_zoo.results import ResultStore

ROOT = Path(__file__).resolve().parent.parent
FAST = {"device": "cpu", "warmup": 0, "min_time_s": 0.0, "min_repeats": 2, "memory": False}
NAN_PLUGIN = textwrap.dedent('''
    import attention_zoo as zoo
    from attention_zoo.variants.mha import MultiHeadAttention


    @zoo.register_attention("{name}")
    class NotFinite(MultiHeadAttention):
        """MHA whose output is NaN: a broken variant the benchmarks must not report as ok."""

        def _attend(self, x, masks, stack_context):
            return super()._attend(x, masks, stack_context) * float("nan")
''')


@pytest.fixture(autouse=True)
def _threads():
    """The CLIs run in-process here pin torch's thread count process-wide; later tests get theirs back."""
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


@pytest.fixture
def clean_registry(monkeypatch):
    """Plugins registered by a test (in-process ``--include`` too) are gone afterwards, also from the environment
    that later subprocesses inherit."""
    before, loaded = dict(registry._REGISTRY), set(plugins._loaded)
    monkeypatch.setenv(plugins.ENV, "")
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)


def _plugin(tmp_path: Path, name: str, body: str = NAN_PLUGIN) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(body.format(name=name))
    return path


# ---- silently wrong -------------------------------------------------------------------------------------------------
def test_benchmark_reports_a_non_finite_variant_as_nan(tmp_path, clean_registry):
    plugins.load_plugins([str(_plugin(tmp_path, "nanattn"))])
    df = zoo.benchmark("nanattn", [(1, 8, 8, 2)], **FAST)
    bad, mha = df[df["variant"] == "nanattn"], df[df["variant"] == "mha"]
    assert len(bad) == 2 and (bad["status"] == "nan").all(), bad[["mode", "status", "message"]]
    assert bad["message"].str.contains("non-finite").all() and bad["latency_median_ms"].isna().all()
    assert (mha["status"] == "ok").all()


def test_sweep_measurements_turn_a_non_finite_step_into_a_nan_row():
    with pytest.raises(ArithmeticError, match="non-finite"):
        measure_latency(lambda: torch.tensor([1.0, float("inf")]), "cpu", warmup=0, repeats=2)
    res = guarded(lambda: {"lat": measure_latency(lambda: torch.tensor(float("nan")), "cpu", warmup=0, repeats=2)})
    assert res["status"] == "nan" and "non-finite" in res["message"]


@pytest.mark.parametrize("kwargs,arg", [
    ({"shapes": [(1.5, 8, 32, 4)]}, "shapes"), ({"shapes": [(1, 8.0, 32, 4)]}, "shapes"),
    ({"shapes": [("1", 8, 32, 4)]}, "shapes"), ({"shapes": [(True, 8, 32, 4)]}, "shapes"),
    ({"compile": "no"}, "compile"), ({"causal": "no"}, "causal"), ({"memory": 1}, "memory"),
    ({"progress": "yes"}, "progress"), ({"min_repeats": 0}, "min_repeats"), ({"repeats": 0}, "repeats"),
    ({"warmup": -1}, "warmup"), ({"min_time_s": -1.0}, "min_time_s"), ({"min_time_s": float("nan")}, "min_time_s")])
def test_benchmark_rejects_bad_arguments_before_any_work(kwargs, arg):
    call = {**FAST, "shapes": [(1, 8, 32, 4)], **kwargs}
    with pytest.raises(ValueError, match=f"^{arg}:"):
        zoo.benchmark("mha", call.pop("shapes"), **call)


@pytest.mark.parametrize("kwargs,arg", [({"optimizer_in_region": "no"}, "optimizer_in_region"),
                                        ({"warmup": 1.5}, "warmup"), ({"threads": 0}, "threads")])
def test_memory_requests_reject_what_would_be_coerced(kwargs, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        memory_item(workload_spec(batch=1, seq_len=4, d_model=8, n_heads=2), "train", **kwargs)


# ---- clear errors instead of tracebacks -----------------------------------------------------------------------------
TINY_BENCH = ["--variants", "mha", "--batch", "1", "--seq-len", "8", "--d-model", "8", "--heads", "2", "--warmup",
              "0", "--min-time", "0.01", "--min-repeats", "2", "--no-memory", "--quiet", "--device", "cpu"]
TINY_QUICK = ["--batch", "1", "--seq-len", "8", "--d-model", "8", "--heads", "2", "--layers", "1", "--warmup", "0",
              "--repeats", "1", "--device", "cpu"]


@pytest.mark.parametrize("cli,option,bad", [
    ("bench", "--results-file", "blocked/sub/rows.csv"), ("bench", "--plot", "blocked/sub/b.png"),
    ("bench", "--plot", "b.notanimage"), ("bench", "--results-file", "."),
    ("quick", "--csv", "blocked/q.csv"), ("quick", "--md", "blocked/q.md"), ("quick", "--plot", "blocked/q.png"),
    ("all", "--out", "blocked/results")])
def test_unwritable_output_paths_are_refused_before_any_work(tmp_path, capsys, cli, option, bad):
    (tmp_path / "blocked").write_text("a file, so nothing can be created under it")
    main, base = {"bench": (bench.main, TINY_BENCH), "quick": (quick.main, TINY_QUICK),
                  "all": (run_all.main, ["--preset", "tiny", "--only", "synthetic"])}[cli]
    t0 = time.perf_counter()
    assert main([*base, option, str(tmp_path / bad)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: {option.lstrip('-')}:") and err.count("\n") == 1, err
    assert "GEMM" not in out and "==" not in out and time.perf_counter() - t0 < 5  # nothing was measured or run


def test_quick_benchmark_with_a_flavour_the_baseline_lacks(tmp_path, capsys):
    csv = tmp_path / "quick.csv"
    assert quick.main([*TINY_QUICK, "--flavor", "damcha_repo", "--variants", "mha", "--csv", str(csv)]) == 0
    rows = pd.read_csv(csv)
    cases = {c for c in rows["case"] if not c.startswith("mha breakdown: ")}  # + where MHA's time goes
    assert cases == {"mha layer non-causal", "mha layer causal", "mha decoder 1L causal"}
    assert (rows["status"] == "ok").all()  # MHA has one method: it runs as paper, as in every other CLI


@pytest.mark.parametrize("body,kind", [("raise RuntimeError('plugin bug')", "RuntimeError"),
                                       ("import sys\nsys.exit(3)", "SystemExit"),
                                       ("import attention_zoo\nattention_zoo.register_attention('mha')(object)",
                                        "ValueError")])
def test_a_plugin_that_raises_at_import_is_a_clear_error(tmp_path, capsys, clean_registry, monkeypatch, body, kind):
    (tmp_path / "badplug.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in (str(tmp_path / "badplug.py"), "badplug"):  # a file and a module path
        with pytest.raises(SystemExit) as exc:
            bench.main(["--include", spec, *TINY_BENCH])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("python -m attention_zoo.bench: error: include:") and kind in err, err
        assert "badplug" not in sys.modules


def test_missing_dataset_under_no_download_is_one_error_line(tmp_path, capsys):
    args = ["--datasets", "enwik8", "--no-download", "--data-dir", str(tmp_path / "data"), "--out",
            str(tmp_path / "out"), "--variants", "mha", "--flavour", "paper", "--quiet", "--device", "cpu",
            "--threads", "1"]
    assert table5_gpt2.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: enwik8:") and "enwik8.zip" in err and err.count("\n") == 1


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float64, torch.int64])
def test_vision_transformer_names_images_for_a_wrong_dtype(dtype):
    vit = zoo.models.VisionTransformer(8, 4, 3, d_model=8, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="^images:.*dtype"):
        vit(torch.zeros(2, 3, 8, 8, dtype=dtype))
    assert vit(torch.zeros(2, 3, 8, 8)).logits.shape == (2, 3)


@pytest.mark.parametrize("cls", [nn.Linear, object, "mha", zoo.models.Decoder])
def test_register_attention_refuses_what_is_not_an_attention(cls, clean_registry):
    with pytest.raises(ValueError, match="^cls: 'notattn' must be a subclass of attention_zoo.AttentionBase"):
        zoo.register_attention("notattn")(cls)
    assert "notattn" not in zoo.list_attentions()


# ---- nothing lost, nothing recomputed for nothing -------------------------------------------------------------------
def test_a_report_sees_cells_other_processes_stored_after_it_opened_the_store(tmp_path):
    first = ResultStore(tmp_path, "t", {"c": 1})
    first.add({"seed": 0}, [{"metric": "m", "value": 0.0, "unit": "x"}])
    second = ResultStore(tmp_path, "t", {"c": 1})  # a concurrent run on the same --out
    second.add({"seed": 1}, [{"metric": "m", "value": 1.0, "unit": "x"}])
    assert sorted(first.frame()["seed"]) == [0, 1]


def _table7(out: Path, *seq_lens: str) -> int:
    return table7_complexity.main(["--device", "cpu", "--variants", "mha", "--causal", "false", "--seq-lens",
                                   *seq_lens, "--d-models", "64", "--repeats", "1", "--warmup", "0", "--extra",
                                   "--threads", "1", "--memory-workers", "1", "--quiet", "--out", str(out)])


def _cells(path: Path) -> list[dict]:
    return [r for r in read_jsonl(path) if r["kind"] == "cell"]


def test_the_last_of_two_overlapping_runs_reports_every_cell(tmp_path):
    assert _table7(tmp_path, "8", "256") == 0  # T = 8 and 256 at D = 64 (the smoke preset's D sweep point)
    cells = _cells(tmp_path / "table7_complexity.jsonl")
    assert len(cells) == 2
    assert _table7(tmp_path, "256") == 0  # a grid inside the first: nothing to measure
    assert _cells(tmp_path / "table7_complexity.jsonl") == cells
    long = pd.read_csv(tmp_path / "table7_complexity_long.csv")
    assert sorted(long["seq_len"].unique()) == [8, 256]  # the report holds every cell of the context


def _synthetic(out: Path, *extra: str) -> int:
    return synthetic.main(["--device", "cpu", "--lambda", "0.5", "--seeds", "0", "--variants", "mha", "--steps", "2",
                           "--threads", "1", "--quiet", "--out", str(out), *extra])


def test_unrelated_plugins_and_worker_counts_rerun_nothing(tmp_path, clean_registry):
    assert _synthetic(tmp_path, "--workers", "1") == 0
    before = _cells(tmp_path / "synthetic.jsonl")
    assert len(before) == 1
    plugin = _plugin(tmp_path, "unrelated")
    assert _synthetic(tmp_path, "--workers", "2", "--include", str(plugin)) == 0
    assert _cells(tmp_path / "synthetic.jsonl") == before  # the cell's numbers cannot have changed: reused


def test_fresh_with_kept_checkpoints_retrains(tmp_path):
    args = ["--preset", "smoke", "--variants", "mha", "--flavour", "paper", "--steps", "2", "--eval-batches", "1",
            "--keep-checkpoints", "--device", "cpu", "--quiet", "--threads", "1", "--out", str(tmp_path)]
    assert table6_vit.main(args) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    assert (run_dir / "checkpoints").is_dir()  # kept: the final checkpoint a resume would start from
    assert table6_vit.main([*args, "--fresh"]) == 0
    events = read_jsonl(run_dir / "metrics.jsonl")
    assert not any(e.get("event") == "resume" for e in events)  # not resumed from the kept final checkpoint
    assert any(e.get("event") == "train" for e in events) and events[-1]["status"] == "ok"  # trained again
    assert len(_cells(tmp_path / "table6_vit.jsonl")) == 2


# ---- security and processes -----------------------------------------------------------------------------------------
def test_download_never_follows_a_planted_link_nor_touches_the_target(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload" * 100)
    dest_dir = tmp_path / "data"
    dest_dir.mkdir()
    victim, dest = tmp_path / "victim", dest_dir / "file.bin"
    victim.write_bytes(b"precious")
    dest.write_bytes(b"old copy")
    for name in (".file.bin.part", "file.bin.part", ".file.bin.tmp"):  # where a fixed temp name would be
        (dest_dir / name).symlink_to(victim)
    with pytest.raises(DatasetError, match="MD5 mismatch"):
        download(src.as_uri(), dest, md5="0" * 32)
    assert victim.read_bytes() == b"precious" and dest.read_bytes() == b"old copy"
    download(src.as_uri(), dest, md5=hashlib.md5(src.read_bytes()).hexdigest())
    assert dest.read_bytes() == src.read_bytes() and victim.read_bytes() == b"precious"
    assert sorted(p.name for p in dest_dir.iterdir()) == [".file.bin.part", ".file.bin.tmp", "file.bin",
                                                          "file.bin.part"]  # no temp file left behind


def test_startup_hook_never_runs_a_tvhook_from_the_current_directory(tmp_path):
    site_dir, cwd = tmp_path / "site", tmp_path / "cwd"
    site_dir.mkdir()
    (cwd / "attention_zoo" / "adapters").mkdir(parents=True)
    marker = tmp_path / "executed"
    (cwd / "attention_zoo" / "__init__.py").write_text("")
    (cwd / "attention_zoo" / "adapters" / "__init__.py").write_text("")
    (cwd / "attention_zoo" / "adapters" / "_tvhook.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                                                    "install = print\n")
    assert _tvhook.main(["--install", "--site-dir", str(site_dir)]) == 0
    probe = ("import site, sys\n"
             "n = lambda: sum(getattr(f, '__name__', '') == 'TorchvisionShimFinder' for f in sys.meta_path)\n"
             f"before = n(); site.addsitedir({str(site_dir)!r}); print(sys.path[0] == '', n() - before)")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=cwd, timeout=60,
                         env={**os.environ, "ATTENTION_ZOO_TVSHIM": "1"})
    assert run.returncode == 0, run.stderr[-500:]
    assert not marker.exists(), "the hook executed ./attention_zoo/adapters/_tvhook.py"
    assert run.stdout.split() == ["True", "1"]  # '' was on sys.path, and the installed package's hook ran


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_extractor_weights_are_used_from_the_bytes_that_were_checked(tmp_path, monkeypatch):
    from torch_fidelity import FeatureExtractorBase

    class Tiny(FeatureExtractorBase):  # loads its weights file the way torch-fidelity's Inception does
        def __init__(self, name, features_list, feature_extractor_weights_path=None, **kwargs):
            super().__init__(name, features_list)
            self.lin = nn.Linear(3, 4)
            if feature_extractor_weights_path:
                self.load_state_dict(torch.load(feature_extractor_weights_path, weights_only=False))

        get_provided_features_list = staticmethod(lambda: ("feat",))
        get_default_feature_layer_for_metric = staticmethod(lambda metric: "feat")

        def forward(self, x):
            return (self.lin(x.float().mean((2, 3))),)

    mi.register_extractor("hardening3-tiny", Tiny)
    good = {"lin.weight": torch.full((4, 3), 0.5), "lin.bias": torch.ones(4)}
    weights, marker = tmp_path / "w.pth", tmp_path / "executed"
    torch.save(good, weights)
    real_load, seen = torch.load, []

    def load(f, *args, **kwargs):  # an attacker who swaps the file right after any check that reads it by name
        seen.append(f)
        out = real_load(f, *args, **kwargs)
        if str(f) == str(weights):
            weights.write_bytes(pickle.dumps(_Payload(marker)))
        return out

    monkeypatch.setattr(torch, "load", load)
    fe = mi.get_extractor("hardening3-tiny", str(weights))
    assert not marker.exists(), "the swapped file was unpickled"
    assert str(weights) not in map(str, seen)
    torch.testing.assert_close(fe.lin.weight, good["lin.weight"])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_kill_9_of_reproduce_all_takes_the_running_script_with_it(tmp_path):
    parent = subprocess.Popen([sys.executable, str(ROOT / "reproduce" / "all.py"), "--preset", "tiny", "--only",
                               "synthetic", "--device", "cpu", "--out", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    script = []
    try:
        deadline = time.monotonic() + 60
        while not script and time.monotonic() < deadline and parent.poll() is None:
            script = _children(parent.pid)
            time.sleep(0.05)
        assert script, "reproduce/all.py started no script"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in script) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in script), "the script outlived reproduce/all.py"
    finally:
        for pid in script:  # an orphan left by a failing run of this test
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_result_files_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "a.md", "x")
        atomic_write_csv(pd.DataFrame({"a": [1]}), tmp_path / "a.csv")
        os.umask(0o002)
        atomic_write_text(tmp_path / "a.md", "y")  # a rewrite gets the mode a new file would
    finally:
        os.umask(old)
    assert (tmp_path / "a.csv").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "a.md").stat().st_mode & 0o777 == 0o664
