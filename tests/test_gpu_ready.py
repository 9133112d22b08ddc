"""Ready for a GPU without one: what the CUDA paths would do wrong, checked on the CPU and the meta device."""

import torch

from attention_zoo.engine.checkpoint import rng_state, set_rng_state
from attention_zoo.engine.config import TrainConfig
from attention_zoo.engine.loop import make_optimizer
from attention_zoo.envinfo import fingerprint


def test_one_adamw_implementation_on_every_device():
    opt = make_optimizer(torch.nn.Linear(4, 4), TrainConfig())
    assert opt.defaults["foreach"] is False  # no multi-tensor temporaries in CUDA training peaks


def test_cpu_cell_identity_is_unchanged_and_cuda_numerics_join_it(monkeypatch):
    import attention_zoo.envinfo as envinfo

    assert set(fingerprint("cpu")) == {"device", "device_name", "torch", "threads", "dtype"}
    monkeypatch.setattr(envinfo, "device_name", lambda device: "Fake GPU")  # no CUDA here: only the name is asked
    cuda = fingerprint("cuda")
    assert cuda["tf32_matmul"] == torch.backends.cuda.matmul.allow_tf32 and "math" in cuda["sdpa_backends"]
    monkeypatch.setattr(torch.backends.cuda, "math_sdp_enabled", lambda: False)
    assert fingerprint("cuda") != cuda  # another set of SDPA backends is another cell


def test_rng_state_keeps_the_runs_own_device_only_and_reads_the_old_layout():
    state = rng_state("cpu")
    assert "cuda" not in state and "cuda_own" not in state
    a = torch.rand(3)
    set_rng_state(state, "cpu")
    assert torch.equal(torch.rand(3), a)
    set_rng_state({**state, "cuda": []}, "cpu")  # a checkpoint from before: one state per GPU (none here)
