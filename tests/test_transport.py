"""Transport tests against closed-form ground truth: Gaussian data x1 ~ N(mu, diag(s^2)).

For Gaussian data every field is analytic. With x_t = a x1 + b x0 (a = alpha_t, b = sigma_t), x_t is
N(a mu, V) per dim with V = a^2 s^2 + b^2, and with r = (x - a mu) / V:
  score    = -r
  noise    = E[x0 | x] = b r
  velocity = E[a' x1 + b' x0 | x] = a' mu + (a a' s^2 + b b') r
The probability-flow ODE moves a point as x_t = a mu + sqrt(V_t) z, so every ODE sample has an exact
end point to compare with.
"""

import math
import re

import pytest
import torch

from vit5_sit.transport import (
    ClassifierFreeGuidance,
    SamplerConfig,
    SeedError,
    StackedRandomGenerator,
    Transport,
    TransportConfig,
    check_seeds,
    nll_bits_per_dim,
    sample,
)

PATHS = ("linear", "gvp", "vp")
PREDICTIONS = ("velocity", "score", "noise")
MU = torch.tensor([0.5, -1.0], dtype=torch.float64)
S = torch.tensor([0.6, 1.3], dtype=torch.float64)
N = 4000


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are tiny: extra intra-op threads only add overhead (and spin on a shared CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Ground truth, written independently of the package.
def coefs(path, t):
    """(alpha, alpha', sigma, sigma') of SiT's paths."""
    if path == "linear":
        return t, torch.ones_like(t), 1 - t, -torch.ones_like(t)
    if path == "gvp":
        h = math.pi / 2
        return torch.sin(h * t), h * torch.cos(h * t), torch.cos(h * t), -h * torch.sin(h * t)
    # VP with beta(t) going linearly from 20 (t = 0) to 0.1 (t = 1): alpha = exp(-int beta / 2).
    log_a = -0.25 * (1 - t) ** 2 * 19.9 - 0.05 * (1 - t)
    a = torch.exp(log_a)
    da = a * (0.5 * (1 - t) * 19.9 + 0.05)
    b = torch.sqrt(1 - a**2)
    return a, da, b, -a * da / b


def exact_field(path, prediction, mu=MU, s=S):
    def model(x, t, y=None):
        a, da, b, db = (c[:, None] for c in coefs(path, t))
        r = (x - a * mu) / (a**2 * s**2 + b**2)
        return {"score": -r, "noise": b * r, "velocity": da * mu + (a * da * s**2 + b * db) * r}[prediction]

    return model


def flow_end(path, z, t0, t1, mu=MU, s=S):
    """Exact probability-flow ODE solution at t1 from z at t0."""
    a0, _, b0, _ = coefs(path, torch.tensor(t0, dtype=torch.float64))
    a1, _, b1, _ = coefs(path, torch.tensor(t1, dtype=torch.float64))
    v0, v1 = a0**2 * s**2 + b0**2, a1**2 * s**2 + b1**2
    return a1 * mu + torch.sqrt(v1 / v0) * (z - a0 * mu)


def noise(n=N, seed=0):
    return torch.randn(n, 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def assert_moments(x, mu=MU, s=S, mean_tol=0.08, var_rtol=0.1):
    assert torch.isfinite(x).all()
    assert torch.allclose(x.mean(0), mu, atol=mean_tol), (x.mean(0), mu)
    assert torch.allclose(x.var(0), s**2, rtol=var_rtol), (x.var(0), s**2)


# Paths and conversions.
@pytest.mark.parametrize("path", PATHS)
def test_path_coefficients_and_derivatives(path):
    tr = Transport(TransportConfig(path=path))
    t = torch.linspace(0.01, 0.99, 50, dtype=torch.float64)
    for got, want in zip(tr.coefficients(t), coefs(path, t)):
        torch.testing.assert_close(got, want)
    a, da, b, db = tr.coefficients(t)
    h = 1e-6
    a_p, _, b_p, _ = tr.coefficients(t + h)
    a_m, _, b_m, _ = tr.coefficients(t - h)
    torch.testing.assert_close(da, (a_p - a_m) / (2 * h), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(db, (b_p - b_m) / (2 * h), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tr.dlog_alpha(t), da / a)
    if path != "vp":  # linear and GVP run exactly from noise to data
        ends = tr.coefficients(torch.tensor([0.0, 1.0], dtype=torch.float64))
        torch.testing.assert_close(torch.stack([ends[0], ends[2]]), torch.tensor([[0.0, 1.0], [1.0, 0.0]],
                                                                                dtype=torch.float64))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_conversions_match_exact_fields_and_round_trip(path, prediction):
    tr = Transport(TransportConfig(path=path, prediction=prediction))
    x = noise(64) * 2
    t = torch.linspace(0.02, 0.98, 64, dtype=torch.float64)
    out = exact_field(path, prediction)(x, t)
    torch.testing.assert_close(tr.velocity(out, x, t), exact_field(path, "velocity")(x, t))
    torch.testing.assert_close(tr.score(out, x, t), exact_field(path, "score")(x, t))
    torch.testing.assert_close(tr.noise(out, x, t), exact_field(path, "noise")(x, t))
    # Round trip: this prediction -> each other field -> back through a transport predicting it.
    for other in PREDICTIONS:
        field = {"velocity": tr.velocity, "score": tr.score, "noise": tr.noise}[other](out, x, t)
        back = Transport(TransportConfig(path=path, prediction=other))
        converted = {"velocity": back.velocity, "score": back.score, "noise": back.noise}[prediction]
        torch.testing.assert_close(converted(field, x, t), out)


# Training loss.
def test_velocity_loss_irreducible_linear():
    """Linear path, velocity target u = x1 - x0: Var(u | x_t) = s^2 / V_t per dim (derivation:
    Var u - Cov(u, x_t)^2 / V_t = (s^2 + 1) - (t s^2 - (1 - t))^2 / V_t = s^2 / V_t), and
    int_0^1 s^2 / (t^2 s^2 + (1 - t)^2) dt = s (arctan s + arctan 1/s) = pi s / 2."""
    torch.manual_seed(0)
    tr = Transport(TransportConfig())
    x1 = MU + S * torch.randn(20000, 2, dtype=torch.float64)
    loss = tr.loss(exact_field("linear", "velocity"), x1, None)
    assert loss.shape == (20000,) and loss.dtype == torch.float64
    want = math.pi / 2 * S.mean().item()
    assert abs(loss.mean().item() - want) < 0.03 * want, (loss.mean().item(), want)


@pytest.mark.parametrize(
    "path,prediction,weight",
    [(p, "velocity", "none") for p in PATHS]
    + [(p, q, w) for p in PATHS for q in ("score", "noise") for w in ("none", "velocity", "likelihood")],
)
def test_loss_of_exact_field_is_irreducible(path, prediction, weight):
    """E[loss | t] for the exact field is the weighted conditional variance of the target."""
    torch.manual_seed(1)
    mu, s = torch.linspace(-1, 1, 8, dtype=torch.float64), torch.linspace(0.3, 1.5, 8, dtype=torch.float64)
    tr = Transport(TransportConfig(path=path, prediction=prediction, loss_weight=weight))
    seen = []

    def model(x, t, y):
        seen.append(t)
        return exact_field(path, prediction, mu, s)(x, t)

    loss = tr.loss(model, mu + s * torch.randn(N, 8, dtype=torch.float64), None)
    a, da, b, db = (c[:, None] for c in coefs(path, seen[0]))
    v = a**2 * s**2 + b**2
    if prediction == "velocity":
        c, w = da**2 * s**2 + db**2 - (a * da * s**2 + b * db) ** 2 / v, 1.0
    else:  # noise target x0, and sigma * score against -x0: both leave Var(x0 | x_t) = 1 - b^2 / V
        lam = da / a * b**2 - b * db
        c = 1 - b**2 / v
        w = {"none": 1.0, "velocity": (lam / b) ** 2, "likelihood": lam / b**2}[weight]
    expected = (w * c).mean(1)
    # Given t the residual is Gaussian per dim, so Var(loss_i) = w^2 sum_d 2 c_d^2 / D^2.
    std_err = torch.sqrt((w**2 * 2 * c**2).sum(1).sum() / 64) / N
    assert abs(loss.mean() - expected.mean()) < 5 * std_err, (loss.mean(), expected.mean(), std_err)


def test_loss_with_given_t_and_noise_and_seeded_t():
    tr = Transport(TransportConfig(path="gvp"))
    x1, x0, t = noise(8, seed=7), noise(8, seed=8), torch.linspace(0, 1, 8, dtype=torch.float64)
    h = math.pi / 2
    u = h * torch.cos(h * t)[:, None] * x1 - h * torch.sin(h * t)[:, None] * x0
    loss = tr.loss(lambda x, t_, y: torch.zeros_like(x), x1, None, t=t.float(), noise=x0)
    torch.testing.assert_close(loss, (u**2).mean(1), rtol=1e-6, atol=1e-6)
    draw = [tr.sample_t(5, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    torch.testing.assert_close(draw[0], draw[1])


def test_sample_t_end_points_and_logit_normal():
    torch.manual_seed(2)
    assert Transport(TransportConfig()).train_interval() == (0.0, 1.0)
    tr = Transport(TransportConfig(path="vp"))
    assert (tr.train_eps, tr.sample_eps) == (1e-5, 1e-3)
    assert tr.sample_t(10000).max() <= 1 - 1e-5
    tr = Transport(TransportConfig(prediction="noise"))
    t = tr.sample_t(10000)
    assert t.min() >= 1e-3 and t.max() <= 1 - 1e-3 and tr.interval() == (1e-3, 1 - 1e-3)
    # Setting one eps leaves the other at SiT's value (SiT's own code reset sample_eps to None here).
    assert Transport(TransportConfig(path="vp", train_eps=1e-4)).sample_eps == 1e-3
    tr = Transport(TransportConfig(time_dist="logit_normal", logit_normal_mean=0.5, logit_normal_std=0.8))
    t = tr.sample_t(20000, dtype=torch.float64)
    logit = torch.log(t / (1 - t))
    assert abs(logit.mean() - 0.5) < 0.03 and abs(logit.std() - 0.8) < 0.03


# ODE samplers.
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("prediction", PREDICTIONS)
@pytest.mark.parametrize("method,steps,tol", [("euler", 200, 0.06), ("heun", 50, 2e-3), ("dopri5", 0, 2e-3)])
def test_ode_samplers_reach_the_data_distribution(path, prediction, method, steps, tol):
    tr = Transport(TransportConfig(path=path, prediction=prediction))
    cfg = SamplerConfig(method=method, steps=steps or 50, atol=1e-7, rtol=1e-6)
    z = noise()
    res = sample(exact_field(path, prediction), z, None, tr, cfg)
    t0, t1 = tr.interval()
    err = (res.samples - flow_end(path, z, t0, t1)).abs().max()
    assert err < tol, err
    assert_moments(res.samples)
    if method != "dopri5":
        assert res.nfe == steps * (1 if method == "euler" else 2)
    else:
        assert res.nfe > 10


@pytest.mark.parametrize("path", ["linear", "gvp"])
def test_euler_first_order_heun_second_order(path):
    tr = Transport(TransportConfig(path=path))
    z = noise(500)
    want = flow_end(path, z, 0.0, 1.0)
    for method, order in (("euler", 1), ("heun", 2)):
        errs = []
        for steps in (16, 32, 64):
            cfg = SamplerConfig(method=method, steps=steps)
            res = sample(exact_field(path, "velocity"), z, None, tr, cfg)
            assert res.nfe == steps * order
            errs.append((res.samples - want).abs().max().item())
        rates = [math.log2(errs[i] / errs[i + 1]) for i in range(2)]
        assert all(abs(r - order) < 0.3 for r in rates), (method, errs, rates)


# SDE samplers.
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", ["euler", "heun"])
@pytest.mark.parametrize("form", ["constant", "sbdm", "sigma", "linear", "decreasing",
                                  "increasing-decreasing"])
def test_sde_samplers_reach_the_data_distribution(path, method, form):
    tr = Transport(TransportConfig(path=path))
    # The 'mean' last step adds no noise, which is right only where w(t) -> 0 at t = 1; 'constant' and
    # VP's 'sbdm' (beta(1) / 2) keep diffusing to the end, so they finish with a probability-flow step.
    last_step = "euler" if form == "constant" or (form, path) == ("sbdm", "vp") else "mean"
    cfg = SamplerConfig(mode="sde", method=method, steps=100, diffusion_form=form, last_step=last_step)
    torch.manual_seed(6)
    res = sample(exact_field(path, "velocity"), noise(), None, tr, cfg)
    assert_moments(res.samples)
    assert res.nfe == 100 * (1 if method == "euler" else 2) + 1


@pytest.mark.parametrize("last_step", ["mean", "tweedie", "euler", "none"])
@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_sde_last_steps(last_step, prediction):
    tr = Transport(TransportConfig(prediction=prediction))
    cfg = SamplerConfig(mode="sde", steps=100, last_step=last_step)
    torch.manual_seed(3)
    res = sample(exact_field("linear", prediction), noise(), None, tr, cfg)
    assert_moments(res.samples)
    assert res.nfe == 100 + (last_step != "none")


def test_sde_default_is_finite_for_a_velocity_model():
    tr = Transport(TransportConfig())
    for cfg in (SamplerConfig(mode="sde"), SamplerConfig(mode="sde", method="heun", last_step="none")):
        torch.manual_seed(4)
        assert torch.isfinite(sample(exact_field("linear", "velocity"), noise(), None, tr, cfg).samples).all()


# Likelihood.
@pytest.mark.parametrize("path,divergence,tol", [("linear", "exact", 1e-5), ("gvp", "hutchinson", 1e-5),
                                                 ("vp", "exact", 2e-2)])  # VP: alpha_0 = 0.007, not 0
def test_nll_matches_analytic_gaussian(path, divergence, tol):
    x = MU + S * noise(16, seed=5)
    tr = Transport(TransportConfig(path=path))
    bpd = nll_bits_per_dim(exact_field(path, "velocity"), x, None, tr, divergence=divergence,
                           atol=1e-8, rtol=1e-8)
    log_p = (-0.5 * torch.log(2 * math.pi * S**2) - (x - MU) ** 2 / (2 * S**2)).sum(1)
    want = -log_p / (2 * math.log(2))
    assert (bpd - want).abs().max() < tol, (bpd - want)
    # 8-bit data on [-1, 1]: one level is 2 / 256 wide, which adds log2(128) = 7 bits/dim.
    bpd8 = nll_bits_per_dim(exact_field(path, "velocity"), x, None, tr, divergence=divergence,
                            method="rk4", steps=200, bin_width=2 / 256)
    assert (bpd8 - 7 - want).abs().max() < max(tol, 1e-4)


# Classifier-free guidance.
def _toy_model(calls):
    def model(x, t, y):
        calls.append((x.shape[0], y.clone()))
        return x * (1 + y.to(x.dtype)[:, None, None, None]) + t[:, None, None, None]

    return model


def test_cfg_scale_one_and_empty_interval_are_conditional():
    x, y = torch.randn(4, 4, 2, 2), torch.tensor([1, 2, 3, 4])
    t = torch.tensor([0.1, 0.4, 0.6, 0.9])
    calls = []
    cond = _toy_model(calls)(x, t, y)
    for scale, interval in ((1.0, (0.0, 1.0)), (4.0, (0.95, 1.0))):
        calls.clear()
        out = ClassifierFreeGuidance(_toy_model(calls), scale, 0, interval=interval)(x, t, y)
        torch.testing.assert_close(out, cond)
        assert [c[0] for c in calls] == [4]  # no unconditional forward at all


def test_cfg_batched_forward_interval_and_channels():
    x, y = torch.randn(4, 4, 2, 2), torch.tensor([1, 2, 3, 4])
    t = torch.tensor([0.1, 0.4, 0.6, 0.9])
    calls = []
    model = _toy_model([])
    cond, uncond = model(x, t, y), model(x, t, torch.zeros_like(y))
    guided = uncond + 2.5 * (cond - uncond)
    out = ClassifierFreeGuidance(_toy_model(calls), 2.5, 0)(x, t, y)
    torch.testing.assert_close(out, guided)
    assert len(calls) == 1 and calls[0][0] == 8 and calls[0][1].tolist() == [1, 2, 3, 4, 0, 0, 0, 0]
    # Guidance interval [0.3, 0.7]: only samples 1 and 2 are guided, elementwise.
    out = ClassifierFreeGuidance(_toy_model([]), 2.5, 0, interval=(0.3, 0.7))(x, t, y)
    torch.testing.assert_close(out[[1, 2]], guided[[1, 2]])
    torch.testing.assert_close(out[[0, 3]], cond[[0, 3]])
    # Official 3-channel guidance: channel 3 stays conditional.
    out = ClassifierFreeGuidance(_toy_model([]), 2.5, 0, channels=3)(x, t, y)
    torch.testing.assert_close(out[:, :3], guided[:, :3])
    torch.testing.assert_close(out[:, 3:], cond[:, 3:])


@pytest.mark.parametrize("scale, interval, message", [
    (-0.5, (0.0, 1.0), "cfg_scale -0.5: must be >= 0"),
    (float("nan"), (0.0, 1.0), "cfg_scale nan: not a finite number"),
    (2.0, (0.7, 0.3), "guidance_interval 0.7 0.3: need 0 <= LOW <= HIGH <= 1"),
    (2.0, (-0.1, 0.5), "guidance_interval -0.1 0.5"),
    (2.0, (0.5,), "guidance_interval (0.5,): expected two numbers"),
])
def test_cfg_refuses_a_bad_scale_or_interval(scale, interval, message):
    from vit5_sit.transport import GuidanceError

    with pytest.raises(GuidanceError, match=re.escape(message)):
        ClassifierFreeGuidance(_toy_model([]), scale, 0, interval=interval)


# Seeds.
@pytest.mark.parametrize("mode,method", [("ode", "euler"), ("ode", "heun"), ("sde", "euler"),
                                         ("sde", "heun")])
def test_same_seed_same_sample_for_any_batch_size(mode, method):
    tr = Transport(TransportConfig(path="gvp"))
    cfg = SamplerConfig(mode=mode, method=method, steps=20)
    model = exact_field("gvp", "velocity", MU.float(), S.float())
    seeds = list(range(100, 108))

    def run(batch_seeds):
        rng = StackedRandomGenerator(batch_seeds)
        return sample(model, rng.randn((2,)), None, tr, cfg, rng=rng).samples

    whole = run(seeds)
    single = torch.cat([run([s]) for s in seeds])
    torch.testing.assert_close(whole, single, rtol=0, atol=1e-6)
    assert not torch.allclose(whole[0], whole[1])


# Validation.
@pytest.mark.parametrize(
    "kwargs,names",
    [
        ({"method": "rk45"}, ["'rk45'", "'dopri5'"]),
        ({"mode": "sde", "method": "dopri5"}, ["'dopri5'", "'heun'"]),
        ({"mode": "SDE"}, ["'SDE'", "'sde'"]),
        ({"mode": "sde", "diffusion_form": "SBDM"}, ["'SBDM'", "'sbdm'"]),
        ({"mode": "sde", "diffusion_form": "inccreasing-decreasing"}, ["'increasing-decreasing'"]),
        ({"last_step": "Mean"}, ["'Mean'", "'tweedie'"]),
        ({"steps": 0}, ["steps=0"]),
        ({"rtol": -1.0}, ["rtol=-1.0"]),
        ({"last_step_size": 1.5}, ["last_step_size=1.5"]),
    ],
)
def test_bad_sampler_options_name_the_value(kwargs, names):
    with pytest.raises(ValueError) as info:
        SamplerConfig(**kwargs)
    for name in names:
        assert name in str(info.value)


def test_bad_transport_options_name_the_value():
    with pytest.raises(ValueError, match="'Linear'.*'linear'"):
        TransportConfig(path="Linear")
    with pytest.raises(ValueError, match="loss_weight='likelihood'"):
        TransportConfig(loss_weight="likelihood")
    with pytest.raises(ValueError, match="'logitnormal'"):
        TransportConfig(time_dist="logitnormal")


def test_vp_sigma_is_accurate_near_the_data_end_in_float32():
    # sigma_t = sqrt(1 - alpha_t^2) cancels catastrophically where alpha_t ~ 1 (2.5e-2 relative error at
    # t = 1 - 1e-5 in float32); sqrt(-expm1(2 log alpha_t)) keeps float32 accuracy there.
    tr = Transport(TransportConfig(path="vp"))
    t = torch.tensor([1 - 1e-5, 1 - 1e-4, 1 - 1e-3, 0.5, 0.0], dtype=torch.float32)
    _, _, sigma32, d_sigma32 = tr.coefficients(t)
    _, _, sigma64, d_sigma64 = tr.coefficients(t.double())  # the same float32 times, in float64
    torch.testing.assert_close(sigma32.double(), sigma64, rtol=1e-6, atol=0)
    torch.testing.assert_close(d_sigma32.double(), d_sigma64, rtol=1e-5, atol=0)


def test_seed_rule():
    assert check_seeds(0) == 0 and check_seeds(2**32 - 1) == 2**32 - 1 and check_seeds(2**32 - 10, 10) == 2**32 - 10
    for bad, count, message in [(-1, 1, r"seed=-1: sample seeds must lie in \[0, 4294967295\]"),
                                (2**32, 1, "choose seed between 0 and 4294967295"),
                                (2**32 - 10, 11, "for 11 images.*choose seed between 0 and 4294967285"),
                                (True, 1, "seed=True: expected a whole number"),
                                (1.0, 1, "seed=1.0: expected a whole number"),
                                ("3", 1, "seed='3': expected a whole number"),
                                # more images than seeds: once "choose seed between 0 and -5705032704"
                                (0, 10**10, "10000000000 images: more than the 4294967296 distinct sample seeds")]:
        with pytest.raises(SeedError, match=message):
            check_seeds(bad, count)
    with pytest.raises(SeedError, match="--seed=-5"):
        check_seeds(-5, name="--seed")


def test_generator_seeds_do_not_wrap_around():
    """2**32 used to be taken modulo 2**32 (the noise of seed 0); now it is refused."""
    a = StackedRandomGenerator([0, 2**32 - 1]).randn((3,))
    assert not torch.equal(a[0], a[1])
    with pytest.raises(SeedError):
        StackedRandomGenerator([2**32])
    with pytest.raises(SeedError):
        StackedRandomGenerator([-1])
