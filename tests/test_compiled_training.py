"""TrainConfig.compile (engine.compiled): the compiled training forward gives the eager run's values to float
rounding; without a C++ compiler, for a variant that says compiling is slower, or when compiling fails, the run
stays eager and says why."""

import pytest
import torch

import attention_zoo as zoo
from attention_zoo.engine import TrainConfig, train
from attention_zoo.engine import compiled as cmod


def _sampler(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(20, (4, 9), generator=g)
    return x[:, :-1], x[:, 1:]


def _run(tmp_path, tag, **cfg):
    torch.manual_seed(0)
    model = zoo.models.Decoder(20, 16, 1, 4, max_seq_len=8)
    res = train(model, TrainConfig(max_steps=3, batch_size=4, warmup_steps=1, progress=False, handle_signals=False,
                                   **cfg), _sampler, tmp_path / tag)
    return res, model


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    import torch._dynamo as dynamo

    dynamo.reset()
    yield
    dynamo.reset()


def test_compiled_training_equals_eager(tmp_path):
    if cmod.cxx_compiler() is None:
        pytest.skip("no C++ compiler: the fallback is tested below")
    eager, m_e = _run(tmp_path, "e")
    comp, m_c = _run(tmp_path, "c", compile=True)
    assert comp.compiled == "compiled" and eager.compiled == ""
    for a, b in zip(m_e.parameters(), m_c.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1.5e-4)  # under half an AdamW step (lr 3e-4)


def test_compile_falls_back_cleanly(tmp_path, monkeypatch):
    monkeypatch.setattr(cmod, "cxx_compiler", lambda: None)
    res, _ = _run(tmp_path, "none", compile=True)
    assert res.status == "ok" and res.compiled.startswith("eager: no C++ compiler")
    monkeypatch.undo()

    def broken(model, **kw):
        def fn(*a, **k):
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")
        return fn

    monkeypatch.setattr(cmod, "cxx_compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(torch, "compile", broken)
    with pytest.warns(RuntimeWarning, match="falling back to eager"):
        res, model = _run(tmp_path, "broken", compile=True)
    assert res.status == "ok" and res.compiled.startswith("eager: the compile failed (InvalidCxxCompiler")
    ref, ref_model = _run(tmp_path, "ref")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))  # eager, exactly
    moa = zoo.models.Decoder(20, 16, 1, 4, attention="moa", max_seq_len=8)
    assert "MoA paper" in cmod.compile_reason(moa)
    with pytest.raises(ValueError, match="^compile:"):
        TrainConfig(compile="yes")
