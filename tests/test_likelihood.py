"""Hutchinson probes of the likelihood: mean and standard error against a closed-form correlated Gaussian.

Data x1 ~ N(mu, C) with a full covariance C on the linear path x_t = t x1 + (1 - t) x0. Then x_t is
N(t mu, V_t) with V_t = t^2 C + (1 - t)^2 I, and the exact velocity is
  u(x, t) = mu + (t C - (1 - t) I) V_t^-1 (x - t mu),
whose Jacobian is not diagonal: Rademacher probes then have a non-zero variance, which the standard
error has to describe.
"""

import math

import pytest
import torch

from vit5_sit.transport import StackedRandomGenerator, Transport, TransportConfig, nll_estimate

D = 4
GEN = torch.Generator().manual_seed(0)
Q, _ = torch.linalg.qr(torch.randn(D, D, generator=GEN, dtype=torch.float64))
C = Q @ torch.diag(torch.tensor([0.2, 0.5, 1.5, 3.0], dtype=torch.float64)) @ Q.T
MU = torch.tensor([0.5, -1.0, 0.0, 2.0], dtype=torch.float64)
EYE = torch.eye(D, dtype=torch.float64)


def velocity(x, t, y=None):
    a = t[:, None, None]
    gain = (a * C - (1 - a) * EYE) @ torch.linalg.inv(a**2 * C + (1 - a) ** 2 * EYE)  # (B, D, D)
    return MU + (gain @ (x - a[:, :, 0] * MU)[..., None])[..., 0]


def exact_bpd(x):
    log_p = torch.distributions.MultivariateNormal(MU, C).log_prob(x)
    return -log_p / (D * math.log(2))


@pytest.fixture(scope="module")
def data():
    return torch.distributions.MultivariateNormal(MU, C).sample((48,))


def _estimate(x, probes, **kw):
    rng = StackedRandomGenerator(range(len(x)))
    return nll_estimate(velocity, x, None, Transport(TransportConfig()), divergence="hutchinson",
                        probes=probes, rng=rng, atol=1e-7, rtol=1e-7, **kw)


def test_exact_divergence_matches_and_has_zero_stderr(data):
    est = nll_estimate(velocity, data[:8], None, Transport(TransportConfig()), divergence="exact",
                       atol=1e-8, rtol=1e-8)
    assert (est.bpd - exact_bpd(data[:8])).abs().max() < 1e-5
    assert est.probes == 0 and bool((est.stderr == 0).all())


def test_probes_give_a_calibrated_standard_error(data):
    est = _estimate(data, probes=16)
    want = exact_bpd(data)
    assert est.probes == 16 and bool((est.stderr > 0).all())
    z = (est.bpd - want) / est.stderr  # ~ N(0, 1) if the standard error is right (t with 15 dof)
    assert 0.6 < z.pow(2).mean().sqrt() < 1.5, z
    assert z.abs().max() < 5


def test_more_probes_shrink_the_error_and_one_probe_has_none(data):
    x = data[:16]
    few, many = _estimate(x, probes=4), _estimate(x, probes=64)
    # The standard error falls as 1 / sqrt(K): 4x from 4 to 64 probes (spread of the estimates aside).
    ratio = few.stderr.mean() / many.stderr.mean()
    assert 2.5 < ratio < 6, ratio
    assert (many.bpd - exact_bpd(x)).abs().mean() < (few.bpd - exact_bpd(x)).abs().mean()
    one = _estimate(x, probes=1)
    assert bool(one.stderr.isnan().all()) and torch.equal(one.bpd, _estimate(x, probes=1).bpd)  # seeded


def test_bad_probe_options_name_the_value(data):
    with pytest.raises(ValueError, match="probes=0"):
        _estimate(data[:2], probes=0)
    with pytest.raises(ValueError, match="probes=4 needs divergence='hutchinson'"):
        nll_estimate(velocity, data[:2], None, Transport(TransportConfig()), divergence="exact", probes=4)
