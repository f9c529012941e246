"""Few-step solvers (DPM-Solver++ multistep) and time grids, against the closed-form Gaussian case of
test_transport.py: orders of accuracy, grids on every path, per-sample seeding and the guidance interval."""

import math

import pytest
import torch
from test_transport import MU, S, coefs, exact_field, flow_end, noise

from vit5_sit.transport import (
    ClassifierFreeGuidance,
    SamplerConfig,
    StackedRandomGenerator,
    Transport,
    TransportConfig,
    sample,
)
from vit5_sit.transport.solvers import dpm_solver_pp, log_snr, time_grid

PATHS = ("linear", "gvp", "vp")
GRIDS = ("uniform", "shift", "logsnr", "edm")
FIXED = ("euler", "heun", "dpm++2m", "dpm++3m")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _rates(errs):
    return [math.log2(errs[i] / errs[i + 1]) for i in range(len(errs) - 1)]


@pytest.mark.parametrize("path,grid", [("linear", "uniform"), ("gvp", "uniform"), ("vp", "logsnr")])
def test_dpm_solver_2m_is_second_order_on_the_whole_interval(path, grid):
    tr = Transport(TransportConfig(path=path))
    z = noise(500)
    t0, t1 = tr.interval()
    want = flow_end(path, z, t0, t1)
    errs = []
    for steps in (64, 128, 256):
        res = sample(exact_field(path, "velocity"), z, None, tr, SamplerConfig(method="dpm++2m", steps=steps,
                                                                                  grid=grid))
        assert res.nfe == steps  # one network call a step
        errs.append((res.samples - want).pow(2).mean().sqrt().item())
    assert all(1.6 < r < 2.6 for r in _rates(errs)), (errs, _rates(errs))  # GVP: 1.7, 1.8 (first-order ends)


@pytest.mark.parametrize("path", PATHS)
def test_orders_on_an_inner_interval(path):
    """From an exact point at t = 0.1 to t = 0.9 (lambda finite at both ends): first order is first order,
    the 2M and 3M updates converge faster, and 3M is the most accurate."""
    tr = Transport(TransportConfig(path=path))
    z = noise(500)
    start, want = flow_end(path, z, 0.0, 0.1), flow_end(path, z, 0.0, 0.9)
    errs = {}
    for order in (1, 2, 3):
        errs[order] = []
        for steps in (16, 32, 64):
            x = dpm_solver_pp(exact_field(path, "velocity"), start, None, tr, time_grid(tr, 0.1, 0.9, steps, "logsnr"),
                              order)
            errs[order].append((x - want).pow(2).mean().sqrt().item())
    assert all(0.8 < r < 1.2 for r in _rates(errs[1])), errs[1]
    assert _rates(errs[2])[-1] > 1.7 and _rates(errs[3])[-1] > 1.7, errs
    assert errs[3][-1] < errs[2][-1] < errs[1][-1] / 10, errs


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("prediction", ["velocity", "score", "noise"])
def test_data_prediction_is_the_posterior_mean(path, prediction):
    """Transport.data = E[x1 | x_t] = mu + a s^2 (x - a mu) / (a^2 s^2 + b^2) for Gaussian data."""
    tr = Transport(TransportConfig(path=path, prediction=prediction))
    x = noise(50)
    t = torch.linspace(0.05, 0.95, 50, dtype=torch.float64)
    a, _, b, _ = (c[:, None] for c in coefs(path, t))
    want = MU + a * S**2 * (x - a * MU) / (a**2 * S**2 + b**2)
    got = tr.data(exact_field(path, prediction)(x, t), x, t)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("grid", GRIDS)
def test_grids_span_the_interval_increasing(path, grid):
    tr = Transport(TransportConfig(path=path))
    t0, t1 = tr.interval()
    ts = time_grid(tr, t0, t1, 12, grid)
    assert len(ts) == 13 and ts[0] == t0 and ts[-1] == t1
    assert all(b > a for a, b in zip(ts[:-1], ts[1:])), ts


def test_grid_shapes():
    tr = Transport(TransportConfig())
    assert time_grid(tr, 0.0, 1.0, 8, "shift", shift=1.0) == pytest.approx(time_grid(tr, 0.0, 1.0, 8))
    shifted = time_grid(tr, 0.0, 1.0, 8, "shift", shift=3.0)
    assert shifted[1] < 1 / 8 / 2  # more steps near the noise end
    # logsnr: equal steps in lambda between the interior points.
    lam = log_snr(tr, torch.tensor(time_grid(tr, 0.0, 1.0, 8, "logsnr")))[1:-1]
    torch.testing.assert_close(lam.diff(), torch.full((6,), lam.diff()[0].item(), dtype=torch.float64), atol=1e-5,
                               rtol=0)


@pytest.mark.parametrize("method", ["dpm++2m", "dpm++3m"])
@pytest.mark.parametrize("grid", GRIDS)
def test_same_seed_same_sample_for_any_batch_size(method, grid):
    tr = Transport(TransportConfig(path="gvp"))
    cfg = SamplerConfig(method=method, steps=7, grid=grid)
    model = exact_field("gvp", "velocity", MU.float(), S.float())
    seeds = list(range(100, 106))

    def run(batch_seeds):
        rng = StackedRandomGenerator(batch_seeds)
        return sample(model, rng.randn((2,)), None, tr, cfg, rng=rng).samples

    whole = run(seeds)
    torch.testing.assert_close(whole, torch.cat([run([s]) for s in seeds]), rtol=0, atol=1e-6)
    assert not torch.allclose(whole[0], whole[1])


@pytest.mark.parametrize("method", FIXED)
def test_guidance_interval_is_honoured(method):
    """The unconditional half is computed at exactly the steps whose t lies in the interval."""
    calls = []

    def model(x, t, y):
        calls.append((t[0].item(), x.shape[0]))
        return -x + y[:, None].to(x.dtype)

    guided = ClassifierFreeGuidance(model, 3.0, null_class=0, interval=(0.3, 0.7))
    cfg = SamplerConfig(method=method, steps=10, grid="logsnr")
    sample(guided, torch.randn(4, 2), torch.tensor([1, 2, 3, 4]), Transport(TransportConfig()), cfg)
    assert any(n == 8 for _, n in calls) and any(n == 4 for _, n in calls)
    for t, n in calls:
        assert n == (8 if 0.3 <= t <= 0.7 else 4), (t, n)


@pytest.mark.parametrize("kwargs,names", [
    ({"grid": "karras"}, ["'karras'", "'edm'"]),
    ({"shift": 0.0}, ["shift=0.0"]),
    ({"mode": "sde", "method": "dpm++2m"}, ["'dpm++2m'"]),
])
def test_bad_solver_options_name_the_value(kwargs, names):
    with pytest.raises(ValueError) as e:
        SamplerConfig(**kwargs)
    assert all(n in str(e.value) for n in names), str(e.value)
