"""Few-step ODE sampling: time grids that put the steps where they matter, and DPM-Solver++ multistep.

Time grids (``time_grid``) place ``steps + 1`` times on [t0, t1] (t = 0 noise, t = 1 data), ends included:
  uniform  equal steps in t;
  shift    SD3's shifted grid: with s = 1 - u on a uniform ramp u, s' = shift s / (1 + (shift - 1) s);
           shift > 1 spends more steps near the noise end, shift < 1 near the data end;
  logsnr   equal steps in lambda = log(alpha_t / sigma_t), over lambda in [-log 80, -log 0.002] (EDM's sigma
           range, sigma_edm = sigma_t / alpha_t = exp(-lambda)) clipped to the path's own [lambda(t0), lambda(t1)];
  edm      Karras et al.'s rho = 7 spacing of sigma_edm over the same range.
The times come from lambda through the path's own alpha_t, sigma_t (a bisection), so every grid serves every
path (linear, GVP, VP); the first and last times are always t0 and t1.

DPM-Solver++ (Lu et al. 2022, multistep, data prediction) integrates the probability-flow ODE in lambda,
where it is exactly linear in x: from (x_s, t_s) to t,
  x_t = (sigma_t / sigma_s) x_s + alpha_t (1 - e^{-h}) D,   h = lambda_t - lambda_s,
with D the data prediction x1_hat(x_s, t_s) (first order, = DDIM) corrected by the previous steps' data
predictions (orders 2 and 3). alpha_t (1 - e^{-h}) = alpha_t - alpha_s sigma_t / sigma_s needs no lambda, so
a step that starts at alpha = 0 (t = 0 on the linear and GVP paths, lambda = -inf) or lands on sigma = 0
(t = 1, lambda = +inf) is exact arithmetic; such infinite steps are taken at first order. One network call per
step: ``steps`` NFE.
"""

from __future__ import annotations

import math

import torch

from .transport import Transport

GRIDS = ("uniform", "shift", "logsnr", "edm")
MULTISTEP_ORDERS = {"dpm++2m": 2, "dpm++3m": 3}  # method name -> order
EDM_SIGMA_MAX = 80.0  # the logsnr / edm grids' noisiest interior point: sigma_t / alpha_t (EDM's sigma_max)
EDM_SIGMA_MIN = 0.002  # their cleanest interior point (EDM's sigma_min)
EDM_RHO = 7.0  # the edm grid's spacing exponent (Karras et al. 2022)
DATA_END_SIGMA = 1e-4  # a step that lands where sigma_t is below this lands on the data end: first order


def log_snr(transport: Transport, t: torch.Tensor) -> torch.Tensor:
    """lambda_t = log(alpha_t / sigma_t) in float64 (-inf where alpha_t = 0, +inf where sigma_t = 0)."""
    alpha, _, sigma, _ = transport.coefficients(t.to(torch.float64))
    return torch.log(alpha) - torch.log(sigma)


def t_of_log_snr(transport: Transport, lam: torch.Tensor, t0: float, t1: float) -> torch.Tensor:
    """The times in [t0, t1] where lambda_t = lam (lambda increases with t on every path), by bisection."""
    lam = lam.to(torch.float64)
    lo, hi = torch.full_like(lam, t0), torch.full_like(lam, t1)
    for _ in range(64):  # 2^-64 of the interval: float64 round-off
        mid = 0.5 * (lo + hi)
        below = log_snr(transport, mid) < lam
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return 0.5 * (lo + hi)


def time_grid(transport: Transport, t0: float, t1: float, steps: int, grid: str = "uniform",
              shift: float = 3.0) -> list[float]:
    """``steps + 1`` increasing times from t0 to t1 (both included) spaced by ``grid`` (see the module doc)."""
    u = torch.linspace(0, 1, steps + 1, dtype=torch.float64)
    if grid == "uniform":
        t = t0 + (t1 - t0) * u
    elif grid == "shift":
        s = 1 - u  # diffusers' sigma on the ramp: 1 = noise
        t = t0 + (t1 - t0) * (1 - shift * s / (1 + (shift - 1) * s))
    elif grid in ("logsnr", "edm"):
        ends = log_snr(transport, torch.tensor([t0, t1], dtype=torch.float64))
        lam_lo = max(ends[0].item(), -math.log(EDM_SIGMA_MAX))
        lam_hi = min(ends[1].item(), -math.log(EDM_SIGMA_MIN))
        if grid == "logsnr":
            lam = lam_lo + (lam_hi - lam_lo) * u
        else:  # rho-spaced sigma_edm = exp(-lambda), from exp(-lam_lo) down to exp(-lam_hi)
            hi, lo = math.exp(-lam_lo / EDM_RHO), math.exp(-lam_hi / EDM_RHO)
            lam = -EDM_RHO * torch.log(hi + u * (lo - hi))
        t = t_of_log_snr(transport, lam, t0, t1)
    else:
        raise ValueError(f"time grid {grid!r}: choose one of {', '.join(GRIDS)}")
    t[0], t[-1] = t0, t1
    return t.tolist()


def _coefficients(transport: Transport, t: float) -> tuple[float, float, float]:
    """(alpha_t, sigma_t, lambda_t) as Python floats (float64)."""
    alpha, _, sigma, _ = (c.item() for c in transport.coefficients(torch.tensor(t, dtype=torch.float64)))
    if alpha <= 0:
        lam = -math.inf
    elif sigma <= 0:
        lam = math.inf
    else:
        lam = math.log(alpha) - math.log(sigma)
    return alpha, sigma, lam


def dpm_solver_pp(model_fn, noise: torch.Tensor, y, transport: Transport, t_steps: list[float],
                  order: int = 2) -> torch.Tensor:
    """DPM-Solver++ multistep (order 1, 2 or 3) through the times ``t_steps``: len(t_steps) - 1 NFE."""
    x = noise
    history: list[tuple[float, torch.Tensor]] = []  # (lambda, data prediction) of the last points, newest last
    for t_cur, t_next in zip(t_steps[:-1], t_steps[1:]):
        alpha_s, sigma_s, lam_s = _coefficients(transport, t_cur)
        alpha_t, sigma_t, lam_t = _coefficients(transport, t_next)
        t = torch.full((x.shape[0],), t_cur, dtype=x.dtype, device=x.device)
        data = transport.data(model_fn(x, t, y), x, t)
        history = [*history[-(order - 1):], (lam_s, data)] if order > 1 else [(lam_s, data)]
        h = lam_t - lam_s
        # Steps of infinite length in lambda (from alpha = 0, onto sigma = 0) and the history's finite part.
        k = 1
        if math.isfinite(h) and sigma_t >= DATA_END_SIGMA:
            while k < len(history) and math.isfinite(history[-k][0] - history[-k - 1][0]):
                k += 1
        ratio = sigma_t / sigma_s
        c1 = alpha_t - alpha_s * ratio  # alpha_t (1 - e^{-h})
        if k == 1:
            # First order (DDIM): the data prediction held constant over the step.
            d = data
        elif k == 2:
            # Second order: the data prediction's slope in lambda from the previous point.
            lam_p, data_p = history[-2]
            r0 = (lam_s - lam_p) / h
            d = data + (data - data_p) / (2 * r0)
        else:
            # Third order: slope and curvature from the two previous points (DPM-Solver++(3M)).
            (lam_p2, data_p2), (lam_p, data_p) = history[-3], history[-2]
            r0, r1 = (lam_s - lam_p) / h, (lam_p - lam_p2) / h
            d1_0, d1_1 = (data - data_p) / r0, (data_p - data_p2) / r1
            d1 = d1_0 + (r0 / (r0 + r1)) * (d1_0 - d1_1)
            d2 = (d1_0 - d1_1) / (r0 + r1)
            em1 = math.expm1(-h)  # e^{-h} - 1
            x = ratio * x + c1 * data + alpha_t * (em1 / h + 1) * d1 - alpha_t * ((em1 + h) / h**2 - 0.5) * d2
            continue
        # DPM-Solver++ update: exact in x, the data prediction's part integrated in lambda.
        x = ratio * x + c1 * d
    return x
