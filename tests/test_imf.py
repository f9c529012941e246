"""Improved MeanFlow (issue 51 item 1, `meanflow.variant=imf`): the target against the closed form of guided Gaussian
data at two guidance scales, the loss against a port of the official code in the paper's time convention, the
guidance inputs of the network (neutral at the start, two scales two outputs, the JVP), the config switch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vit5_sit.config import ConfigError, load_config
from vit5_sit.models import PRESETS, create_model
from vit5_sit.models.layers import forward_ad_ops
from vit5_sit.train.objective import Batch, MeanFlowObjective, StepRng, Trainee
from vit5_sit.transport import Transport
from vit5_sit.transport.meanflow import (
    UNGUIDED,
    MeanFlowConfig,
    draw_guidance,
    guidance_inputs,
    imf_target,
    meanflow_loss,
)

NULL = 3
MEANS = torch.tensor([0.7, -0.5, 1.2], dtype=torch.float64)  # class means m_y; the null label's m_0 below
M0, S = 0.1, 0.4

# ---------------------------------------------------------------------------------------------------------
# Guided Gaussian data, closed form. Class y: x1 ~ N(m_y, s^2); unconditional: N(m_0, s^2). Along x_t = t x1 +
# (1 - t) x0 each is a Gaussian path whose velocity is affine in x with the same slope, so the guided field
# v_u + w (v_c - v_u) is the velocity of the Gaussian path of mean m_w = m_0 + w (m_y - m_0): its average
# velocity over [t, t + d] is exact, (x_{t+d} - x_t) / d with x_{t+d} = mu_{t+d} + sigma_{t+d} (x_t - mu_t) / sigma_t.


def _sigma(t):
    return torch.sqrt(t ** 2 * S ** 2 + (1 - t) ** 2)


def _exact_u(x, t, d, m):
    """The average velocity of the Gaussian path of mean m (per sample) over [t, t + d]; d = 0: the velocity."""
    t, d, m = (a.view(-1, 1, 1, 1) for a in (t, d, m))
    z = (x - t * m) / _sigma(t)
    h = 1e-4
    v = m + (_sigma(t + h) - _sigma(t - h)) / (2 * h) * z
    return torch.where(d > 0, ((t + d) * m + _sigma(t + d) * z - x) / d.clamp_min(1e-12), v)


def _guided_mean(y, w):
    m_y = MEANS[y.clamp_max(len(MEANS) - 1)]
    return torch.where(y == NULL, torch.full_like(m_y, M0), M0 + w * (m_y - M0))


class ExactIMF(nn.Module):
    """The exact guided average velocity, with the Denoiser's call signature and `jvp` (the interval of the
    guidance inputs is [0, 1] in these tests: w acts everywhere)."""

    def forward(self, x, t, y, interval=None, guidance=None):
        w = torch.ones_like(t) if guidance is None else guidance[:, 0].to(t)
        d = torch.zeros_like(t) if interval is None else interval
        return _exact_u(x.double(), t.double(), d.double(), _guided_mean(y, w.double())).to(x.dtype)

    def jvp(self, primals, tangents, y, guidance=None):
        return torch.func.jvp(lambda x, t, d: self(x, t, y, interval=d, guidance=guidance), primals, tangents)


def _gaussian_batch(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, len(MEANS), (n,), generator=g)
    t = torch.rand(n, generator=g, dtype=torch.float64) * 0.9 + 0.05
    d = torch.rand(n, generator=g, dtype=torch.float64) * (1 - t)
    d[::4] = 0  # some flow-matching samples
    x1 = MEANS[y].view(-1, 1, 1, 1) + S * torch.randn(n, 1, 2, 2, generator=g, dtype=torch.float64)
    x0 = torch.randn(n, 1, 2, 2, generator=g, dtype=torch.float64)
    return y, t, d, x1, x0


@pytest.mark.parametrize("w", [1.0, 3.0])
def test_target_is_the_closed_form_guided_average_velocity(w):
    """With the exact network and the class's velocity field as v, the iMF target v_g + d dU/dt (the JVP along
    the network's own guided velocity) is the exact average velocity of the guided field, at each scale."""
    y, t, d, x1, x0 = _gaussian_batch(64)
    x_t = t.view(-1, 1, 1, 1) * x1 + (1 - t.view(-1, 1, 1, 1)) * x0
    v_class = _exact_u(x_t, t, torch.zeros_like(t), MEANS[y])  # E[x1 - x0 | x_t, y]
    guidance = guidance_inputs(64, w).double()
    target = imf_target(ExactIMF(), x_t, t, d, y, v_class, guidance, NULL)
    exact = _exact_u(x_t, t, d, _guided_mean(y, torch.full_like(t, w)))
    assert torch.allclose(target, exact, atol=1e-6)
    if w != 1:  # two scales, two different targets (each the formula)
        plain = imf_target(ExactIMF(), x_t, t, d, y, v_class, guidance_inputs(64, 1.0).double(), NULL)
        assert (plain - target)[d > 0].abs().min() > 1e-3


def test_target_noise_is_the_sample_velocity_noise_alone():
    """With the sample's v = x1 - x0, iMF's target differs from the exact one by v - E[v | x_t] and nothing more:
    its JVP term does not see the sample (MeanFlow's, along v itself, does)."""
    from vit5_sit.transport.meanflow import meanflow_target

    y, t, d, x1, x0 = _gaussian_batch(64, seed=1)
    x_t = t.view(-1, 1, 1, 1) * x1 + (1 - t.view(-1, 1, 1, 1)) * x0
    v, v_class = x1 - x0, _exact_u(x_t, t, torch.zeros_like(t), MEANS[y])
    guidance = guidance_inputs(64, 2.0).double()
    exact = _exact_u(x_t, t, d, _guided_mean(y, torch.full_like(t, 2.0)))
    target = imf_target(ExactIMF(), x_t, t, d, y, v, guidance, NULL)
    assert torch.allclose(target - exact, v - v_class, atol=1e-6)
    meanflow = meanflow_target(ExactIMF(), x_t, t, d, y, v, torch.zeros(64, dtype=torch.bool), NULL,
                               MeanFlowConfig())
    exact_1 = _exact_u(x_t, t, d, MEANS[y])
    moving = d > 0
    assert not torch.allclose((meanflow - exact_1)[moving], (v - v_class)[moving], atol=1e-3)


# ---------------------------------------------------------------------------------------------------------
# The official code (Lyy-iiis/imeanflow, imf.py: iMeanFlow.forward), ported line for line in the paper's time:
# z = (1 - t) x + t e, t = 1 noise, v = e - x, u(z, t, h = t - r), guidance interval [t_min, t_max] in that t.

def _paper_u(model, z, t, h, w, t_min, t_max, y):
    """The paper's u-network from ours: our t = 1 - t, our velocity = - the paper's, interval [1 - t_max, 1 - t_min]."""
    return -model(z, 1 - t, y, interval=h, guidance=torch.stack([w, 1 - t_max, 1 - t_min], dim=1))


def _official_loss(model, x, e, labels, t, r, omega, t_min, t_max, null_label, cfg):
    """iMeanFlow.forward, without its draws (given) and with no label dropped: (V - v_g, the per-sample weighted
    loss)."""
    fm = t == r
    z = (1 - t.view(-1, 1, 1, 1)) * x + t.view(-1, 1, 1, 1) * e
    v_t = e - x
    ones, zeros = torch.ones_like(t), torch.zeros_like(t)

    def v_cond(z_, t_, w_, y_):  # h = 0, interval [0, 1]
        return _paper_u(model, z_, t_, zeros, w_, zeros, ones, y_)

    with torch.no_grad():
        v_c_full = v_cond(z, t, omega, labels)
        v_u = v_cond(z, t, ones, torch.full_like(labels, null_label))
        b = lambda s: s.view(-1, 1, 1, 1)  # noqa: E731
        v_g_fm = v_t + b(1 - 1 / omega) * (v_c_full - v_u)
        w = torch.where((t >= t_min) & (t <= t_max), omega, ones)
        v_c = v_cond(z, t, w, labels)
        v_g = v_t + b(1 - 1 / w) * (v_c - v_u)
        v_g = torch.where(b(fm), v_g_fm, v_g)
    with forward_ad_ops():
        u, du_dt = torch.func.jvp(lambda z_, t_, r_: _paper_u(model, z_, t_, t_ - r_, omega, t_min, t_max, labels),
                                  (z, t, r), (v_c, ones, zeros))
    V = u + b(t - r) * du_dt.detach()
    err = (V - v_g).square().flatten(1).sum(1)
    return V - v_g, err / (err.detach() + cfg.adaptive_c) ** cfg.adaptive_p


def _imf_model(perturb: bool = True) -> nn.Module:
    torch.manual_seed(0)
    m = create_model("ViT5G-T/4", input_size=8, in_channels=1, num_classes=3, depth=2, hidden_size=48, num_heads=2,
                     mean_flow=True, guidance_input=True)
    if perturb:
        with torch.no_grad():  # the guidance embedders' zeros too: every input must carry signal
            for p in m.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn_like(p))
    return m.eval()


def test_loss_equals_the_official_code_in_the_papers_time():
    model = _imf_model()
    cfg = MeanFlowConfig(variant="imf", ratio=0.5, adaptive_c=0.01, guidance_range=[1.0, 8.0])
    objective = MeanFlowObjective(Transport(), model.null_label, 0.0, cfg)  # no label dropped: the official order
    n = 16
    g = torch.Generator().manual_seed(4)
    x1, y = torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
    rng = StepRng(2, 3, n, slice(0, n))
    t, d, noise, _, guidance = objective.draw(rng, (1, 8, 8))
    assert (d > 0).any() and (d == 0).any() and (guidance[:, 0] > 1.5).any()
    ours = objective(Trainee(model), Batch(x1, y), rng)["loss"]
    x_t, v = Transport().interpolate(noise, x1, t)
    target = imf_target(model, x_t, t, d, y, v, guidance, model.null_label)
    pred = model(x_t, t, y, interval=d, guidance=guidance)
    per_sample, _ = meanflow_loss(pred, target, cfg)
    tp = 1 - t  # the paper's time
    error, official = _official_loss(model, x1, noise, y, tp, tp - d, guidance[:, 0], 1 - guidance[:, 2],
                                     1 - guidance[:, 1], model.null_label, cfg)
    # U - sg(v_g + d dU/dt) in our time is -(V - v_g) in the paper's, element for element (the JVP term is
    # ~1% of it here: the weighted loss, ~1 by design, would hide a wrong tangent; the error does not).
    torch.testing.assert_close(pred - target, -error, rtol=0, atol=2e-5)
    torch.testing.assert_close(per_sample, official, rtol=2e-4, atol=1e-6)
    torch.testing.assert_close(ours, official.mean(), rtol=2e-4, atol=1e-6)


def test_dropped_labels_learn_the_unguided_unconditional_field():
    model = _imf_model()
    cfg = MeanFlowConfig(variant="imf", ratio=0.0)  # d = 0 everywhere: the target is v_g itself
    objective = MeanFlowObjective(Transport(), model.null_label, 0.5, cfg)
    n = 32
    rng = StepRng(0, 1, n, slice(0, n))
    t, d, noise, drop, guidance = objective.draw(rng, (1, 8, 8))
    assert drop.any() and (~drop).any()
    assert torch.equal(guidance[drop], torch.tensor(UNGUIDED).expand(int(drop.sum()), 3))
    y = torch.where(drop, model.null_label, torch.randint(0, 3, (n,)))
    x1 = torch.randn(n, 1, 8, 8)
    x_t, v = Transport().interpolate(noise, x1, t)
    target = imf_target(model, x_t, t, d, y, v, guidance, model.null_label)
    assert torch.equal(target[drop], v[drop])
    guided = ~drop & (guidance[:, 0] > 1.01)
    assert (target[guided] - v[guided]).flatten(1).norm(dim=1).min() > 1e-4


def test_guidance_draws():
    d = torch.tensor([0.0, 0.3] * 50_000)
    g = draw_guidance(d, MeanFlowConfig(variant="imf", guidance_range=[1.0, 8.0]), torch.Generator().manual_seed(0))
    w, low, high = g.unbind(1)
    assert w.min() >= 1 and w.max() <= 8
    assert abs(torch.log(w).mean() - torch.log(torch.tensor(8.0)) / 2) < 0.01  # log-uniform
    flow = d == 0
    assert (low[flow] == 0).all() and (high[flow] == 1).all()
    assert low[~flow].max() <= 0.5 <= high[~flow].min() and abs(low[~flow].mean() - 0.25) < 0.01


# ---------------------------------------------------------------------------------------------------------
# The network's guidance inputs.

def test_guidance_inputs_start_neutral_then_one_model_gives_two_outputs():
    x, t, d = torch.randn(2, 1, 8, 8), torch.rand(2), torch.rand(2) * 0.3
    y = torch.tensor([0, 2])
    fresh = _imf_model(perturb=False)
    plain = create_model("ViT5G-T/4", input_size=8, in_channels=1, num_classes=3, depth=2, hidden_size=48,
                         num_heads=2, mean_flow=True)
    missing = plain.load_state_dict(fresh.state_dict(), strict=False)
    assert not missing.missing_keys and all(k.startswith("guidance_embedder.") for k in missing.unexpected_keys)
    strong = guidance_inputs(2, 5.0, (0.2, 0.8))
    assert torch.equal(fresh(x, t, y, interval=d), plain(x, t, y, interval=d))  # neutral: the MeanFlow model
    assert torch.equal(fresh(x, t, y, interval=d, guidance=strong), plain(x, t, y, interval=d))
    model = _imf_model()  # as after training: the embedders no longer zero
    one, five = (model(x, t, y, interval=d, guidance=guidance_inputs(2, w)) for w in (1.0, 5.0))
    assert (one - five).abs().max() > 1e-3
    assert torch.equal(one, model(x, t, y, interval=d))  # None = no guidance
    assert not torch.allclose(five, model(x, t, y, interval=d, guidance=strong))  # the interval is an input too


@pytest.mark.parametrize("steps", [1, 2])
def test_one_model_samples_at_the_guidance_chosen_at_sampling_time(steps):
    from vit5_sit.transport.meanflow import meanflow_sample, with_guidance

    model = _imf_model()
    noise, y = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 0])
    calls = []

    def counted(fn):
        def inner(*args, **kwargs):
            calls.append(args[0].shape[0])
            return fn(*args, **kwargs)
        return inner

    with torch.no_grad():
        samples = {w: meanflow_sample(counted(with_guidance(model, w, (0.0, 0.7))), noise, y, steps)
                   for w in (1.0, 4.0)}
        plain = meanflow_sample(model, noise, y, steps)
        unguided = meanflow_sample(with_guidance(model, 1.0), noise, y, steps)
    assert calls == [4] * 2 * steps  # one pass of the batch per step, whatever the scale
    assert torch.equal(unguided, plain)  # scale 1 on [0, 1]: the model without guidance inputs
    assert (samples[4.0] - samples[1.0]).abs().max() > 1e-3


def test_jvp_with_guidance_inputs_matches_finite_differences():
    model = _imf_model()
    g = torch.Generator().manual_seed(1)
    x, t = torch.randn(3, 1, 8, 8, generator=g), torch.rand(3, generator=g) * 0.8
    d = torch.rand(3, generator=g) * (1 - t)
    y, guidance = torch.tensor([0, 1, 3]), guidance_inputs(3, torch.tensor([1.0, 2.5, 6.0]), (0.1, 0.9))
    tx = torch.randn(3, 1, 8, 8, generator=g)
    out, dout = model.jvp((x, t, d), (tx, torch.ones(3), -torch.ones(3)), y, guidance=guidance)
    assert torch.allclose(out, model(x, t, y, interval=d, guidance=guidance), atol=1e-6)
    h = 1e-2
    up = model(x + h * tx, t + h, y, interval=d - h, guidance=guidance)
    down = model(x - h * tx, t - h, y, interval=d + h, guidance=guidance)
    fd = (up - down) / (2 * h)
    assert (dout - fd).norm() / dout.norm() < 2e-3


def test_guidance_input_errors():
    flow_mf = create_model("SiT-T/4", input_size=8, in_channels=1, num_classes=3, depth=1, mean_flow=True)
    x, t, y = torch.randn(2, 1, 8, 8), torch.rand(2), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="guidance= is for iMF models"):
        flow_mf(x, t, y, guidance=guidance_inputs(2, 2.0))
    with pytest.raises(ValueError, match=r"guidance of shape \(2,\): expected \(2, 3\)"):
        _imf_model()(x, t, y, guidance=torch.ones(2))
    with pytest.raises(ValueError, match="needs mean_flow=True"):
        create_model("SiT-T/4", guidance_input=True)


# ---------------------------------------------------------------------------------------------------------
# The switch: meanflow.variant=imf, for every preset.

IMF = ["train.objective=meanflow", "meanflow.variant=imf", "meanflow.ratio=0.5"]


@pytest.mark.parametrize("preset", sorted({p.split("-")[0] + "-T/4" for p in PRESETS if "-T/" in p}))
def test_variant_switch_gives_every_preset_the_guidance_inputs(preset):
    cfg = load_config(None, [f"model.preset={preset}", *IMF])
    mcfg = cfg.model_config()
    assert mcfg.mean_flow and mcfg.guidance_input
    assert not load_config(None, [f"model.preset={preset}", "train.objective=meanflow"]).model_config().guidance_input


@pytest.mark.parametrize("bad, match", [
    (["meanflow.guidance_scale=3"], "meanflow.guidance_scale=3.0 with meanflow.variant=imf"),
    (["meanflow.guidance_interval=[0.2,1]"], "meanflow.guidance_interval"),
    (["meanflow.variant=imff"], "meanflow.variant='imff': must be one of meanflow, imf"),
    (["meanflow.guidance_range=[0.5,4]"], "meanflow.guidance_range"),
    (["meanflow.guidance_range=[4,2]"], "meanflow.guidance_range"),
    (["model.class_dropout_prob=0"], "meanflow.variant=imf builds its guided target"),
])
def test_config_refuses_what_imf_cannot_train(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*IMF, *bad])


def test_config_refuses_imf_settings_without_the_variant():
    with pytest.raises(ConfigError, match="guidance_range.*no effect with meanflow.variant=meanflow"):
        load_config(None, ["train.objective=meanflow", "meanflow.guidance_range=[1,4]"])
    with pytest.raises(ConfigError, match="model.guidance_input=True with meanflow.variant=meanflow"):
        load_config(None, ["train.objective=meanflow", "model.guidance_input=true"])
