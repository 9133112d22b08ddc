"""Ready for a GPU without one: what the CUDA paths would do wrong, checked on the CPU and the meta device."""

import torch

from attention_zoo.engine.checkpoint import rng_state, set_rng_state
from attention_zoo.engine.config import TrainConfig
from attention_zoo.engine.loop import make_optimizer
from attention_zoo.envinfo import fingerprint


def test_one_adamw_implementation_on_every_device():
    opt = make_optimizer(torch.nn.Linear(4, 4, device="meta"), TrainConfig())
    assert opt.defaults["foreach"] is False  # no multi-tensor temporaries in CUDA training peaks
    # on the CPU the multi-tensor implementation: the same bits as the single-tensor one, in fewer calls
    import attention_zoo as zoo

    runs = []
    for foreach in (True, False):
        torch.manual_seed(0)
        model = zoo.models.Decoder(20, 16, 2, 4, attention="damcha", max_seq_len=8,
                                   attention_options={"hidden_dims": (8,), "compact_rank": 2})
        opt = make_optimizer(model, TrainConfig(lr=1e-2))
        assert opt.defaults["foreach"] is True
        opt.defaults["foreach"] = foreach
        for g in opt.param_groups:
            g["foreach"] = foreach
        for step in range(3):
            opt.zero_grad()
            model(torch.randint(20, (2, 8), generator=torch.Generator().manual_seed(step))).logits.square().mean() \
                .backward()
            opt.step()
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


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


def test_no_host_synchronisation_in_a_step_on_an_accelerator():
    """Every variant and control, as a layer and a 2-layer decoder, fwd+bwd on the meta device (the paths an
    accelerator takes; bfloat16): ``.item()``/``.tolist()``/``int(tensor)`` would call _local_scalar_dense."""
    import attention_zoo as zoo
    from attention_zoo.measure.opcount import count_ops
    from attention_zoo.measure.workload import workload_spec

    for name in zoo.list_attentions(include_controls=True):
        for kind in ("attention", "decoder"):
            got = count_ops(workload_spec(kind=kind, attention=name, causal=True, batch=2, seq_len=16, d_model=32,
                                          n_heads=4, n_layers=2))
            assert got["status"] == "ok", (name, kind, got["message"])
            assert got["syncs"] == 0 and got["ops"] > 0, (name, kind, got)


def test_moa_names_the_expert_path_each_device_and_dtype_takes():
    from attention_zoo.variants.moa import grouped_path

    assert grouped_path("cuda", torch.bfloat16) == "grouped GEMM"
    assert grouped_path("cpu", torch.float32) == grouped_path("cpu", torch.float64) == "per-expert stream (CPU)"
    assert grouped_path("cuda", torch.float32).startswith("per-expert loop")  # reads group sizes on the host


def test_every_variant_trains_in_the_prepared_gpu_scripts_dtype_loop_on_cpu():
    from attention_zoo.measure.gpu_check import _ok, _where, dtype_loop

    assert dtype_loop("cpu") == []  # every variant and control × layer/decoder × bf16/fp16 autocast, bf16 weights
    assert _ok(None) and _ok([]) and not _ok("exit 1") and not _ok(["tha: RuntimeError"]) and not _ok([{"error": 1}])
    failures = dtype_loop("no-such-device")  # every case fails, and each is listed with its file:line
    import attention_zoo as zoo

    n_cases = len(zoo.list_attentions(include_controls=True)) * 2 * 3
    assert len(failures) == n_cases and all(f.endswith(")") and ".py:" in f for f in failures)
    try:
        raise ValueError("x")
    except ValueError as exc:
        assert _where(exc).startswith("test_gpu_ready.py:")


def test_one_training_step_under_bf16_autocast(tmp_path):
    import numpy as np

    from attention_zoo.data.text import WindowEvaluator, WindowSampler
    from attention_zoo.engine import TrainConfig, train
    from attention_zoo.models import Decoder

    stream = np.random.default_rng(0).integers(0, 16, 2000).astype(np.uint8)
    torch.manual_seed(0)
    model = Decoder(16, 16, 2, 2, attention="tha", max_seq_len=16)
    cfg = TrainConfig(max_steps=2, batch_size=4, lr=1e-3, warmup_steps=1, log_every=1, eval_every=2,
                      eval_max_batches=1, ckpt_every=0, progress=False, amp="bf16")
    res = train(model, cfg, WindowSampler([stream], 16, 4, seed=1), tmp_path,
                {"val": WindowEvaluator(stream[:400], 16, 8)})
    assert res.status == "ok" and res.step == 2


def test_rows_say_which_implementation_ran_where_it_differs_by_device():
    from attention_zoo.measure.workload import build_workload, workload_spec

    def path(name, device, dtype="float32"):
        return build_workload(workload_spec(attention=name, batch=1, seq_len=8, d_model=8, n_heads=2, dtype=dtype),
                              device).compute_path()

    assert path("tha", "cpu") == "blocked head-mix core (CPU)" and path("tha", "meta") == "batched head-mix core"
    assert path("dcmha", "meta") == "batched head-mix core" and path("mha", "meta") == ""
    assert path("moa", "meta", "bfloat16") == "experts: grouped GEMM"
    assert path("moa", "meta").startswith("experts: per-expert loop")  # fp32 off the CPU: the host reads sizes
