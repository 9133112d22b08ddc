"""Hardening, round 4 (issue 35), the command lines: the claims command refuses bad input, cluster failures report
like local ones, every script refuses a device it cannot use, and data set-up failures are one clear error line.
Each test fails on the code before it."""

from __future__ import annotations

import dataclasses
import re
import socket
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from attention_zoo import bench, plugins, registry
from attention_zoo.claims import __main__ as claims_cli
from attention_zoo.claims.__main__ import main as claims_main
from attention_zoo.data import images, seq2seq, text
from attention_zoo.data.fetch import DatasetError, DatasetNotFoundError
from attention_zoo.envinfo import resolve_device
from attention_zoo.experiments import run_all
from attention_zoo.experiments.efficiency import table7_complexity
from attention_zoo.experiments.generation import appendix_e_kde
from attention_zoo.experiments.lm import table5_gpt2
from attention_zoo.experiments.synthetic import sweep as synthetic
from attention_zoo.experiments.vision import table6_vit
from attention_zoo.measure import quick
from attention_zoo.results import ResultStore

ROOT = Path(__file__).resolve().parent.parent
BOOM = '''
import attention_zoo as zoo
from attention_zoo.variants.mha import MultiHeadAttention


@zoo.register_attention("h4_boom")
class Boom(MultiHeadAttention):
    """MHA that raises: a broken plugin."""

    def _attend(self, x, masks, stack_context):
        raise RuntimeError("plugin bug: boom")
'''


@pytest.fixture
def clean_registry(monkeypatch):
    """Plugins registered by a test are gone afterwards, from the registry, the loaded set and the environment."""
    before, loaded = dict(registry._REGISTRY), set(plugins._loaded)
    monkeypatch.setenv(plugins.ENV, "")
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)


# ---- the claims command refuses bad input -------------------------------------------------------------------------
def _synthetic_store(root: Path, value=lambda v, seed: v) -> ResultStore:
    """A synthetic store at λ = 1 whose DAMCHA arm is 8-10 % below MHA on every seed (``value`` maps each stored
    value, e.g. to text)."""
    store = ResultStore(root / "synthetic", "synthetic", {"options": {"preset": "decide"}})
    for seed in range(6):
        for variant, v in (("mha", 0.2 + 0.02 * seed), ("damcha", (0.2 + 0.02 * seed) * (0.9 + 0.01 * (seed % 3)))):
            store.add({"task": "regression", "lam": 1.0, "d_e": 8, "seed": seed, "variant": variant,
                       "flavor": "paper"}, [{"metric": "test_mse", "value": value(v, seed), "unit": "mse"}])
    return store


def test_claims_reads_a_metric_stored_as_text_as_a_number(tmp_path, capsys):
    _synthetic_store(tmp_path, lambda v, seed: str(v) if seed else "n/a")  # one seed's value is not a number
    assert claims_main(["--results", str(tmp_path)]) == 0
    assert re.search(r"I\.lambda1\s+\[decide\] supported", capsys.readouterr().out)


@pytest.mark.parametrize("option", ["--md", "--csv"])
def test_claims_refuses_a_directory_as_output_before_any_work(tmp_path, capsys, monkeypatch, option):
    _synthetic_store(tmp_path)
    monkeypatch.setattr(claims_cli, "verdicts_for", lambda *a: pytest.fail("computed before checking the output"))
    assert claims_main(["--results", str(tmp_path), option, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {option[2:]}:") and "is a directory" in err and "Traceback" not in err


def test_claims_names_unknown_experiments(tmp_path, capsys):
    _synthetic_store(tmp_path)
    assert claims_main(["--results", str(tmp_path), "--experiments", "synthetic,synthetc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: experiments: unknown 'synthetc'") and "known:" in err and "synthetic" in err
    assert not (tmp_path / "claims.md").exists()


# ---- cluster failures report like local ones ---------------------------------------------------------------------
SWEEP = ["--seeds", "0", "--lambda", "1", "--task", "regression", "--workers", "1", "--threads", "1", "--quiet",
         "--steps", "2"]
LOCAL_EXECUTOR = ["--launcher", "submitit", "--submitit-cluster", "local", "--slurm-retries", "0"]


def _exit_code(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return exc.code


@pytest.mark.parametrize("flags,arg", [
    (["--slurm-extra", "bogus_param=1", "--submitit-cluster", "local"], "slurm-extra"),
    (["--slurm-extra", "slurm_time=-5", "--submitit-cluster", "local"], "slurm-extra"),
    (["--slurm-extra", "slurm_nodes=two", "--submitit-cluster", "local"], "slurm-extra"),
    (["--slurm-time", "-5", "--submitit-cluster", "local"], "--slurm-time"),
    (["--slurm-array-parallelism", "0", "--submitit-cluster", "local"], "--slurm-array-parallelism"),
    (["--slurm-retries", "-1", "--submitit-cluster", "local"], "--slurm-retries"),
    (["--slurm-partition", "gpu"], "launcher")])  # no sbatch on PATH: submitit would run the grid right here
def test_slurm_settings_are_refused_before_anything_is_submitted(tmp_path, capsys, monkeypatch, flags, arg):
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch
    code = _exit_code(synthetic.main, ["--variants", "mha", *SWEEP, "--out", str(tmp_path / "o"),
                                       "--launcher", "submitit", *flags])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert [ln for ln in err.splitlines() if "error:" in ln][0].split("error: ")[1].startswith(arg.lstrip("-")) or \
        f"argument {arg}" in err
    assert not (tmp_path / "o" / "_cache" / "submitit" / "jobs").exists()
    store = tmp_path / "o" / "synthetic.jsonl"
    assert not store.exists() or '"cell"' not in store.read_text()  # nothing ran


@pytest.mark.parametrize("variants", ["h4_boom", "h4_boom,mha"], ids=["all cells fail", "one arm fails"])
def test_failed_cells_give_the_same_exit_code_on_both_launchers_and_the_report_renders(tmp_path, capsys, variants,
                                                                                       clean_registry):
    plugin = tmp_path / "h4_boom.py"
    plugin.write_text(BOOM)
    common = ["--variants", variants, *SWEEP, "--include", str(plugin)]
    local = synthetic.main([*common, "--out", str(tmp_path / "local")])
    cluster = synthetic.main([*common, "--out", str(tmp_path / "cluster"), *LOCAL_EXECUTOR])
    err = capsys.readouterr().err
    assert local == cluster == 1 and "Traceback" not in err and err.count("plugin bug: boom") >= 2
    stored = ResultStore(tmp_path / "cluster", "synthetic").frame(every_context=True)
    assert set(stored.loc[stored["variant"] == "h4_boom", "status"]) == {"error"}
    assert "h4_boom" in (tmp_path / "cluster" / "synthetic.md").read_text()  # the report names the failed cells


def test_a_table_report_renders_from_a_store_of_error_rows_only(tmp_path, capsys, clean_registry):
    """Table 6's report (pivots of the metrics, which error rows lack) from a sweep whose every cell failed."""
    plugin = tmp_path / "h4_boom.py"
    plugin.write_text(BOOM)
    out = tmp_path / "t6"
    code = table6_vit.main(["--variants", "h4_boom", "--flavour", "paper", "--steps", "2", "--eval-batches", "1",
                            "--seeds", "0", "--include", str(plugin), "--out", str(out), "--device", "cpu",
                            "--quiet", *LOCAL_EXECUTOR])
    assert code == 1 and "Traceback" not in capsys.readouterr().err
    assert (out / "table6_vit.md").is_file()


# ---- scripts refuse a device they cannot use ----------------------------------------------------------------------
DEVICE_SCRIPTS = {"appendix_e_kde": appendix_e_kde.main, "synthetic": synthetic.main,
                  "table7_complexity": table7_complexity.main, "bench": bench.main, "quick": quick.main,
                  "all": run_all.main}
BAD_DEVICES = ["tpu", "cuda:x", "mps"] + ([] if torch.cuda.is_available() else ["cuda", "cuda:0"])


@pytest.mark.parametrize("device", BAD_DEVICES)
@pytest.mark.parametrize("script", list(DEVICE_SCRIPTS))
def test_every_script_refuses_a_device_it_cannot_use_before_any_work(tmp_path, capsys, script, device):
    code = _exit_code(DEVICE_SCRIPTS[script], ["--device", device, "--out", str(tmp_path / "o")]
                      if script not in ("bench", "quick") else ["--device", device])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: device:") and repr(device) in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_resolve_device_names_what_is_missing():
    with pytest.raises(ValueError, match="^device: expected auto, cpu, cuda or cuda:N, got 'tpu'"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match=r"^device: 'cuda:99' requested"):
        resolve_device("cuda:99")


# ---- data set-up failures ----------------------------------------------------------------------------------------
def _closed_url(name: str) -> str:
    """A URL on a loopback port nothing listens on: a download fails as it does without a network."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


def test_enwik8_download_failure_is_one_error_line_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(text.REMOTE, "enwik8", dataclasses.replace(text.REMOTE["enwik8"],
                                                                   url=_closed_url("enwik8.zip")))
    args = ["--datasets", "enwik8", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
            "--variants", "mha", "--flavour", "paper", "--quiet", "--device", "cpu", "--threads", "1"]
    assert table5_gpt2.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: enwik8: download of") and "to get it by hand" in err and err.count("\n") == 1


def test_cifar_download_failure_is_one_error_line_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(images.CIFAR, "cifar10", dataclasses.replace(images.CIFAR["cifar10"],
                                                                     url=_closed_url("cifar-10-python.tar.gz")))
    with pytest.raises(DatasetError, match=r"^cifar10: download of .*; to get it by hand: download http"):
        images.load_images("cifar10", "train", tmp_path / "data")
    assert table6_vit.main(["--preset", "cifar10", "--variants", "mha", "--flavour", "paper", "--data-dir",
                            str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cifar10: download of") and err.count("\n") == 1


def test_paper_text_sets_name_the_extra_that_installs_datasets(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    for name in ("wmt14", "commongen"):
        with pytest.raises(DatasetNotFoundError, match=rf"^{name}: needs the `datasets` package \(pip install "
                                                       r"attention_zoo\[paper\]\)"):
            seq2seq.load_seq2seq(name, data_dir=tmp_path)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("datasets") for dep in extras["paper"])
