"""A tuning grid rides the ensemble axis: members of one grouped model, each at its own learning rate and weight
decay, follow the trajectories of separate runs at those settings (engine/member_adamw.py)."""

import copy

import pytest
import torch
from torch import nn

from attention_zoo.engine.ensemble import group_models, seed_state
from attention_zoo.engine.member_adamw import MemberAdamW

LRS, WDS = (1e-3, 3e-3, 1e-2, 3e-3), (0.0, 0.01, 0.1, 0.3)


def _net():
    return nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 3))


@pytest.mark.parametrize("schedule", [False, True])
def test_members_at_their_own_lr_and_weight_decay_equal_separate_runs(schedule):
    torch.manual_seed(0)
    base = _net()
    models = [copy.deepcopy(base) for _ in LRS]  # the same initialisation: only the settings differ
    grouped = group_models(models)
    opt = MemberAdamW(grouped.parameters(), lr=torch.tensor(LRS), betas=(0.9, 0.99), weight_decay=torch.tensor(WDS))
    sep = [torch.optim.AdamW(m.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=wd, foreach=False)
           for m, lr, wd in zip(models, LRS, WDS)]
    factor = (lambda s: 0.5 + 0.5 * (s % 3)) if schedule else (lambda s: 1.0)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in (opt, *sep)]
    gen = torch.Generator().manual_seed(1)
    for _ in range(8):
        x, y = torch.randn(5, 6, generator=gen), torch.randn(5, 3, generator=gen)
        opt.zero_grad(set_to_none=True)
        out = grouped(x.repeat(len(LRS), 1)).view(len(LRS), 5, 3)
        (out - y).square().mean(dim=(1, 2)).sum().backward()
        opt.step()
        for m, o in zip(models, sep):
            o.zero_grad(set_to_none=True)
            (m(x) - y).square().mean().backward()
            o.step()
        for s in scheds:
            s.step()
    for i, m in enumerate(models):
        got = seed_state(grouped, m, i)
        for k, v in m.state_dict().items():
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-7, msg=f"member {i} {k}")
    # the members really differ (the test would pass trivially if they did not)
    first, third = (seed_state(grouped, models[0], i)["0.weight"] for i in (0, 2))
    assert not torch.allclose(first, third)


def test_member_settings_are_validated():
    p = [nn.Parameter(torch.zeros(3, 2))]
    with pytest.raises(ValueError, match="^lr:"):
        MemberAdamW(p, lr=-1.0)
    with pytest.raises(ValueError, match="^weight_decay:"):
        MemberAdamW(p, lr=1e-3, weight_decay=torch.tensor([[0.1]]))
    opt = MemberAdamW(p, lr=torch.tensor([1e-3, 1e-3]))
    p[0].grad = torch.ones(3, 2)
    with pytest.raises(ValueError, match="2 member values for a parameter with 3 members"):
        opt.step()
