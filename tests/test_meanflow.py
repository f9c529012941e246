"""MeanFlow (issue 43): the JVP of the whole denoiser against finite differences and reverse mode, the target
and the sampler against the closed-form average velocity of Gaussian data, the time mapping, the objective."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vit5_sit.models import create_model
from vit5_sit.transport.meanflow import (
    MeanFlowConfig,
    draw_times,
    guided_velocity,
    meanflow_grid,
    meanflow_loss,
    meanflow_sample,
    meanflow_target,
)

# Every component switch of the model, one at a time and together (both families).
SWITCHES = [
    ("SiT-T/4", {}),
    ("ViT5G-T/4", {}),
    ("ViT5-T/4", {}),                                   # LayerScale
    ("SiTRoPE-T/4", {}),
    ("ViT5G-T/4", {"qk_norm": False}),                  # RoPE without QK-norm (apply_rope path)
    ("ViT5G-T/4", {"num_registers": 0}),
    ("ViT5G-T/4", {"register_rope_base": None}),
    ("ViT5G-T/4", {"rope": False}),
    ("ViT5G-T/4", {"mlp": "swiglu"}),
    ("ViT5G-T/4", {"pos_embed": "learned"}),
    ("SiT-T/4", {"norm": "rmsnorm", "qkv_bias": False}),
    ("ViT5G-T/4", {"dmf_depth": 1}),                    # DMF's split: t in the first block, t + d after
    ("SiT-T/4", {"dmf_depth": 1}),
]


def _model(name: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    m = create_model(name, input_size=8, in_channels=1, num_classes=4, depth=2, hidden_size=48, num_heads=2,
                     patch_size=2, mean_flow=True, **overrides)
    with torch.no_grad():  # leave adaLN-Zero's zeros: every path must carry signal
        for p in m.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return m.eval()


def _inputs(b: int = 3):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, 1, 8, 8, generator=g)
    t = torch.rand(b, generator=g) * 0.8
    d = torch.rand(b, generator=g) * (1 - t)
    y = torch.tensor([0, 3, 4][:b])  # 4 = the null label
    tangents = (torch.randn(b, 1, 8, 8, generator=g), torch.ones(b), -torch.ones(b))
    return (x, t, d), tangents, y


@pytest.mark.parametrize("name,overrides", SWITCHES, ids=[f"{n}{o}" for n, o in SWITCHES])
def test_jvp_of_the_denoiser_matches_finite_differences_and_reverse_mode(name, overrides):
    m = _model(name, **overrides)
    (x, t, d), (tx, tt, td), y = _inputs()
    out, dout = m.jvp((x, t, d), (tx, tt, td), y)
    assert torch.equal(out, m(x, t, y, interval=d)) or torch.allclose(out, m(x, t, y, interval=d), atol=1e-6)
    h = 1e-2  # float32 model (the norms run in float32): central differences, O(h^2) + rounding / h
    up = m(x + h * tx, t + h * tt, y, interval=d + h * td)
    down = m(x - h * tx, t - h * tt, y, interval=d - h * td)
    fd = (up - down) / (2 * h)
    assert dout.norm() > 1e-3
    assert (dout - fd).norm() / dout.norm() < 2e-3
    # Reverse mode: <w, J v> = <J^T w, v> (exact up to rounding).
    xr, tr, dr = (a.clone().requires_grad_() for a in (x, t, d))
    o = m(xr, tr, y, interval=dr)
    w = torch.randn_like(o)
    gx, gt, gd = torch.autograd.grad((o * w).sum(), (xr, tr, dr))
    lhs, rhs = (w * dout).sum(), (gx * tx).sum() + (gt * tt).sum() + (gd * td).sum()
    assert torch.allclose(lhs, rhs, rtol=1e-4, atol=1e-5)


def test_interval_input_only_for_meanflow_models_and_zero_is_the_flow_model():
    flow = create_model("SiT-T/4", input_size=8, in_channels=1, num_classes=4, depth=1)
    x, t, y = torch.randn(2, 1, 8, 8), torch.rand(2), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="interval= is for MeanFlow models"):
        flow(x, t, y, interval=torch.zeros(2))
    m = _model("ViT5G-T/4")
    assert torch.equal(m(x, t, y), m(x, t, y, interval=torch.zeros(2)))
    assert not torch.allclose(m(x, t, y), m(x, t, y, interval=torch.full((2,), 0.5)))
    assert "interval_embedder.mlp.0.weight" in m.state_dict()
    assert not any(k.startswith("interval_embedder") for k in flow.state_dict())


# ---------------------------------------------------------------------------------------------------------
# Gaussian data: x1 ~ N(m, s^2) per element, x0 ~ N(0, 1), x_t = t x1 + (1 - t) x0. The flow map is affine:
# x_t = mu_t + sigma_t z with mu_t = t m, sigma_t = sqrt(t^2 s^2 + (1 - t)^2), z = x0, so the average velocity
# over [t, t + d] is (x_{t+d} - x_t) / d with x_{t+d} = mu_{t+d} + sigma_{t+d} (x_t - mu_t) / sigma_t.
M, S = 0.7, 0.4


def _mu(t):
    return t * M


def _sigma(t):
    return torch.sqrt(t ** 2 * S ** 2 + (1 - t) ** 2)


def _exact_u(x, t, d):
    t, d = t.view(-1, 1, 1, 1), d.view(-1, 1, 1, 1)
    z = (x - _mu(t)) / _sigma(t)
    end = _mu(t + d) + _sigma(t + d) * z
    h = 1e-4  # d -> 0: the instantaneous velocity mu'_t + sigma'_t z
    v = (M + (_sigma(t + h) - _sigma(t - h)) / (2 * h) * z)
    return torch.where(d > 0, (end - x) / d.clamp_min(1e-12), v)


class ExactMeanFlow(nn.Module):
    """The true average velocity of the Gaussian, with the Denoiser's call signature and `jvp`."""

    null_label = 4

    def forward(self, x, t, y, interval=None):
        return _exact_u(x.double(), t.double(), torch.zeros_like(t).double() if interval is None
                        else interval.double()).to(x.dtype)

    def jvp(self, primals, tangents, y):
        return torch.func.jvp(lambda x, t, d: self(x, t, y, interval=d), primals, tangents)


def _exact_v(x, t):
    return _exact_u(x, t, torch.zeros_like(t))


def test_target_of_the_exact_average_velocity_is_itself():
    """The MeanFlow identity with our time mapping: with the marginal velocity as v and the true average
    velocity as the network, the target v + d dU/dt (tangent (v, 1, -1)) is U itself."""
    g = torch.Generator().manual_seed(0)
    n = 64
    x = torch.randn(n, 1, 4, 4, generator=g, dtype=torch.float64)
    t = torch.rand(n, generator=g, dtype=torch.float64) * 0.9 + 0.05
    d = torch.rand(n, generator=g, dtype=torch.float64) * (1 - t)
    d[::4] = 0
    y = torch.zeros(n, dtype=torch.long)
    net = ExactMeanFlow()
    target = meanflow_target(net, x, t, d, y, _exact_v(x, t), torch.zeros(n, dtype=torch.bool), 4,
                             MeanFlowConfig())
    assert torch.allclose(target, _exact_u(x, t, d), atol=1e-6)
    # The paper's sign (t from data to noise, tangent (v, 0, 1) in (z, r, t)) would give another target.
    wrong = _exact_v(x, t) - d.view(-1, 1, 1, 1) * (target - _exact_v(x, t)) / d.clamp_min(1e-9).view(-1, 1, 1, 1)
    assert not torch.allclose(wrong[d > 0], _exact_u(x, t, d)[d > 0], atol=1e-3)


def test_conditional_velocity_target_is_unbiased():
    """Training sees v = x1 - x0, not the marginal field: the target is linear in v, so its mean over the pairs
    (x0, x1) behind one x_t is the exact average velocity (the MeanFlow regression's fixed point)."""
    g = torch.Generator().manual_seed(0)
    n = 200_000
    t = torch.full((n,), 0.3, dtype=torch.float64)
    d = torch.full((n,), 0.5, dtype=torch.float64)
    x1 = M + S * torch.randn(n, 1, 1, 1, generator=g, dtype=torch.float64)
    x0 = torch.randn(n, 1, 1, 1, generator=g, dtype=torch.float64)
    x_t = 0.3 * x1 + 0.7 * x0
    target = meanflow_target(ExactMeanFlow(), x_t, t, d, torch.zeros(n, dtype=torch.long), x1 - x0,
                             torch.zeros(n, dtype=torch.bool), 4, MeanFlowConfig())
    resid = (target - _exact_u(x_t, t, d)).flatten()
    # E[resid | x_t] = 0 for every x_t: uncorrelated with any function of x_t, and mean 0.
    assert abs(resid.mean()) < 4 * resid.std() / n ** 0.5
    assert abs((resid * x_t.flatten()).mean()) < 4 * (resid * x_t.flatten()).std() / n ** 0.5


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_sampler_with_the_exact_average_velocity_gives_the_data_distribution(steps):
    noise = torch.randn(50_000, 1, 1, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    calls = []

    def fn(x, t, y, interval):
        calls.append(float(t[0]))
        return ExactMeanFlow()(x, t, y, interval=interval)

    x1 = meanflow_sample(fn, noise, torch.zeros(50_000, dtype=torch.long), steps)
    assert len(calls) == steps and calls == meanflow_grid(steps)[:-1]
    # Each step of the exact average velocity is exact: the affine map x1 = m + s x0, sample for sample.
    assert torch.allclose(x1, M + S * noise, atol=1e-9)


def test_time_draws_follow_the_config():
    cfg = MeanFlowConfig(ratio=0.25, time_mean=0.4, time_std=1.0)
    t, d = draw_times(100_000, cfg, torch.Generator().manual_seed(0))
    assert (t >= 0).all() and (t + d <= 1).all() and (d >= 0).all()
    assert abs((d > 0).float().mean() - 0.25) < 0.01
    # Both times logit-normal(0.4, 1): the smaller one's logit has mean 0.4 - 1/sqrt(pi) (order statistic).
    logit = torch.logit(t[d == 0].double())
    assert abs(logit.mean() - (0.4 - 1 / torch.pi ** 0.5)) < 0.02
    end = t[d > 0] + d[d > 0]
    assert abs(torch.logit(end.double()).mean() - (0.4 + 1 / torch.pi ** 0.5)) < 0.03


def test_guided_velocity_is_the_papers_mixture():
    v, c, u = torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([-1.0])
    cfg = MeanFlowConfig(guidance_scale=3.0)  # kappa 0: w v + (1 - w) u_null
    assert torch.allclose(guided_velocity(v, None, u, cfg), 3 * v - 2 * u)
    cfg = MeanFlowConfig(guidance_scale=2.5, guidance_mix=0.92)  # the paper's XL/2: w = 0.2
    w = 2.5 * 0.08
    assert torch.allclose(guided_velocity(v, c, u, cfg), w * v + 0.92 * c + (1 - w - 0.92) * u)


def test_guided_target_uses_the_networks_unconditional_field_and_spares_dropped_labels():
    class Const(ExactMeanFlow):
        def forward(self, x, t, y, interval=None):  # conditional 1, unconditional -1, any interval
            return torch.where((y == 4).view(-1, 1, 1, 1), -1.0, 1.0).to(x.dtype).expand_as(x)

    n = 4
    x = torch.zeros(n, 1, 2, 2)
    t = torch.tensor([0.5, 0.5, 0.1, 0.9])
    d = torch.zeros(n)
    v = torch.full_like(x, 2.0)
    dropped = torch.tensor([False, True, False, False])
    y = torch.tensor([1, 4, 1, 1])
    cfg = MeanFlowConfig(guidance_scale=3.0, guidance_interval=[0.2, 1.0])
    target = meanflow_target(Const(), x, t, d, y, v, dropped, 4, cfg)
    assert torch.allclose(target[0], torch.full_like(target[0], 3 * 2.0 - 2 * -1.0))  # guided
    assert torch.allclose(target[1], v[1])  # dropped label: the unconditional field, unguided
    assert torch.allclose(target[2], v[2])  # t outside the guidance interval
    assert torch.allclose(target[3], target[0])


def test_loss_adaptive_weight():
    pred, target = torch.zeros(2, 1, 2, 2), torch.ones(2, 1, 2, 2)
    weighted, mse = meanflow_loss(pred, target, MeanFlowConfig(adaptive_p=1.0, adaptive_c=1e-3))
    assert torch.allclose(weighted, torch.full((2,), 4 / (4 + 1e-3)))
    assert torch.allclose(mse, torch.ones(2))
    plain, _ = meanflow_loss(pred, target, MeanFlowConfig(adaptive_p=0.0))
    assert torch.allclose(plain, torch.full((2,), 4.0))


@pytest.mark.parametrize("kw,match", [({"ratio": 1.5}, "ratio"), ({"time_std": 0}, "time_std"),
                                      ({"guidance_mix": 1.0}, "guidance_mix"),
                                      ({"guidance_interval": [0.5, 0.2]}, "guidance_interval"),
                                      ({"adaptive_c": float("nan")}, "adaptive_c")])
def test_config_refuses_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        MeanFlowConfig(**kw)
