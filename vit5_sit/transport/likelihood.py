"""Negative log-likelihood in bits per dimension through the probability-flow ODE.

Along the ODE dx/dt = v(x, t), d/dt log p_t(x_t) = -div v(x_t, t). Integrating from the data x (t1, near
1) back to noise (t0, near 0) gives log p_1(x) = log N(x_t0; 0, I) - integral_t0^t1 div v dt.
The end points are the sampler's (Transport.interval): on VP, and for score / noise models, they stop
short of 0 and 1, which biases the result slightly (on VP p_0 is not exactly N(0, I): ~0.01 bits/dim on
2-D unit-scale Gaussians).

The Hutchinson divergence is an unbiased estimate with one random probe per solve; `probes=K` integrates
K probes along the same trajectory (K backward passes per evaluation) and reports their mean and its
standard error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torchdiffeq import odeint

from vit5_sit.common.utils import check_choice

from .samplers import ODE_ADAPTIVE
from .transport import Transport

NLL_FIXED = ("euler", "midpoint", "rk4")  # torchdiffeq fixed-grid methods, `steps` steps
DIVERGENCES = ("auto", "exact", "hutchinson")
EXACT_DIV_MAX_DIM = 64  # 'auto' uses the exact divergence up to this many dims per sample (1 backward each)


@dataclass
class NLLEstimate:
    bpd: torch.Tensor     # (B,) bits/dim: the mean over the probes
    stderr: torch.Tensor  # (B,) standard error of bpd over the probes; 0 if exact, NaN for one probe
    probes: int           # Hutchinson probes per sample (0 = the exact divergence)


def _divergence(v: torch.Tensor, x: torch.Tensor, probes: torch.Tensor | None) -> torch.Tensor:
    """div v (K, B): exact (one backward pass per dim, K = 1) if probes is None, else Hutchinson's unbiased
    estimate probe . (dv/dx probe) for each of the K probes (K, B, ...)."""
    if probes is not None:
        divs = []
        for k, probe in enumerate(probes):
            (vjp,) = torch.autograd.grad(v, x, probe, retain_graph=k < len(probes) - 1)
            divs.append((vjp * probe).flatten(1).sum(1))
        return torch.stack(divs)
    v_flat, div = v.flatten(1), torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    for i in range(v_flat.shape[1]):
        (g,) = torch.autograd.grad(v_flat[:, i].sum(), x, retain_graph=True)
        div = div + g.flatten(1)[:, i]
    return div[None]


def nll_bits_per_dim(model_fn, x: torch.Tensor, y: torch.Tensor | None, transport: Transport,
                     **options) -> torch.Tensor:
    """Bits per dimension (B,) of the data x: `nll_estimate(...).bpd` (the same options)."""
    return nll_estimate(model_fn, x, y, transport, **options).bpd


def nll_estimate(
    model_fn,
    x: torch.Tensor,
    y: torch.Tensor | None,
    transport: Transport,
    *,
    method: str = "dopri5",  # adaptive: 'dopri5' | 'dopri8' | ...; fixed: 'euler' | 'midpoint' | 'rk4'
    steps: int = 100,  # fixed methods only: number of steps
    atol: float = 1e-5,  # adaptive methods only
    rtol: float = 1e-5,  # adaptive methods only
    divergence: str = "auto",  # 'exact' | 'hutchinson' | 'auto' (exact up to EXACT_DIV_MAX_DIM dims)
    probes: int = 1,  # Hutchinson probes per sample, integrated along one trajectory (K backward passes)
    rng=None,  # StackedRandomGenerator for the Hutchinson probes; None = global torch RNG
    bin_width: float | None = None,  # None = bits/dim of the continuous density of x, in x's units
) -> NLLEstimate:
    """Bits per dimension (B,) of the data x, in the units the model was trained on (x1 of the path),
    with the standard error of the Hutchinson estimate over `probes` probes.

    The value is -log2 p(x) / D for the model's density over x as given: data scaled to [-1, 1] and
    the same data in [0, 255] differ by log2(127.5) bits/dim. For quantised data pass `bin_width`, the
    size of one quantisation level in x's units (2 / 256 for 8-bit images mapped to [-1, 1]; the
    caller adds the uniform dequantisation noise to x): the result is then -log2(p(x) * bin_width) / D,
    i.e. bits/dim - log2(bin_width) (+7 for 8-bit [-1, 1] data), the usual discrete bits/dim.
    """
    check_choice("nll_bits_per_dim: method", method, ODE_ADAPTIVE + NLL_FIXED)
    check_choice("nll_bits_per_dim: divergence", divergence, DIVERGENCES)
    if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
        raise ValueError(f"nll_bits_per_dim: probes={probes!r} must be a positive integer")
    if divergence == "exact" and probes > 1:
        raise ValueError(f"nll_bits_per_dim: probes={probes} needs divergence='hutchinson' (or 'auto' above "
                         f"{EXACT_DIV_MAX_DIM} dims); the exact divergence has no probes")
    dim = x[0].numel()
    exact = divergence == "exact" or (divergence == "auto" and dim <= EXACT_DIV_MAX_DIM)
    if exact:
        probe = None
    elif rng is not None:  # each fixed for the whole solve; probe k of sample i from sample i's generator
        probe = torch.stack([rng.rademacher_like(x) for _ in range(probes)])
    else:
        probe = torch.where(torch.rand(probes, *x.shape, device=x.device) < 0.5, -1.0, 1.0).to(x.dtype)
    k = 1 if exact else probes
    t0, t1 = transport.interval()

    def f(t, state):
        x_t, _ = state
        with torch.enable_grad():
            x_t = x_t.detach().requires_grad_(True)
            # Clamped: torchdiffeq's first-step heuristic may probe outside [t0, t1].
            tt = t.clamp(t0, t1).to(x_t.dtype).expand(x_t.shape[0])
            v = transport.velocity(model_fn(x_t, tt, y), x_t, tt)
            div = _divergence(v, x_t, probe)
        return v.detach(), div.detach()

    # Integrate from the data end back to noise; the second state accumulates int_t1^t div v dt (K, B).
    t_span = torch.tensor([t1, t0], dtype=x.dtype, device=x.device)
    state0 = (x, torch.zeros(k, x.shape[0], dtype=x.dtype, device=x.device))
    if method in ODE_ADAPTIVE:
        # step_t: end a step exactly at t0 instead of stepping past it and interpolating back.
        options = {"step_t": t_span[1:]}
        xs, integral = odeint(f, state0, t_span, method=method, atol=atol, rtol=rtol, options=options)
    else:
        xs, integral = odeint(f, state0, t_span, method=method, options={"step_size": (t1 - t0) / steps})
    z, integral = xs[-1], integral[-1]
    log_prior = -0.5 * dim * math.log(2 * math.pi) - 0.5 * (z**2).flatten(1).sum(1)
    log_p = log_prior + integral  # (K, B); integral = int_t1^t0 div v dt = -int_t0^t1 div v dt
    bpd = -log_p / (dim * math.log(2)) - (0.0 if bin_width is None else math.log2(bin_width))
    if exact:
        stderr = torch.zeros_like(bpd[0])
    elif k == 1:
        stderr = torch.full_like(bpd[0], math.nan)  # one probe: no spread to estimate it from
    else:
        stderr = bpd.std(0) / math.sqrt(k)
    return NLLEstimate(bpd.mean(0), stderr, 0 if exact else k)
