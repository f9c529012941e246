"""The ODE / SDE solvers: integrate the flow from noise x0 (t = t0, near 0) to data x1 (t = t1, near 1).

They work on tensors only; `vit5_sit.sampling.generate` turns them into images (seeds, guidance, VAE decoding, files).

Each sampler is a pure function `(model_fn, noise, y, transport, cfg, rng) -> samples`; `sample` picks
one from a SamplerConfig and counts the network evaluations (NFE). `model_fn(x, t, y)` is the network
or a guided wrapper (ClassifierFreeGuidance); one call is one NFE, whatever its batch.

Few-step solvers (DPM-Solver++ multistep, 'dpm++2m' / 'dpm++3m', one NFE a step) and the time grids every
fixed-step method can use (``grid``: uniform, SD3's shift, logSNR-uniform, EDM's) are in `solvers.py`.

Step counts versus the official SiT scripts: SiT's `--num-sampling-steps N` puts N points on [t0, t1]
(N - 1 steps); here `steps` is the number of steps. So SiT ODE Euler N = `steps=N - 1`, and SiT's
SDE with 250 points (249 Euler-Maruyama steps + the last step) = `steps=249`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torchdiffeq import odeint

from vit5_sit.common.contract import MAX_NFE, MAX_STEPS
from vit5_sit.common.utils import check_choice

from .meanflow import meanflow_sample
from .solvers import GRIDS, MULTISTEP_ORDERS, dpm_solver_pp, time_grid
from .transport import Transport, expand_like

MODES = ("ode", "sde", "meanflow")  # meanflow: a MeanFlow model's average-velocity steps (transport/meanflow.py)
MEANFLOW_METHODS = ("euler",)  # x_{t+d} = x_t + d U(x_t, t, d): the only MeanFlow step
SDE_METHODS = ("euler", "heun")  # 'euler' = Euler-Maruyama
MULTISTEP_METHODS = tuple(MULTISTEP_ORDERS)  # DPM-Solver++ multistep: ODE only, one NFE a step
ODE_FIXED = ("euler", "heun", *MULTISTEP_METHODS)
FIXED_STEP_METHODS = ODE_FIXED  # our own fixed-step solvers: `steps` steps on `grid`, batch-independent
ODE_ADAPTIVE = ("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun")  # through torchdiffeq
DIFFUSION_FORMS = ("constant", "sbdm", "sigma", "linear", "decreasing", "increasing-decreasing")
LAST_STEPS = ("mean", "tweedie", "euler", "none")


class SolverError(ValueError):
    """An adaptive solver that could not meet its tolerance; the message names the settings to change."""


@dataclass
class SamplerConfig:
    mode: str = "ode"  # 'ode' (probability flow, deterministic) | 'sde' | 'meanflow' (MeanFlow models only)
    method: str = "euler"  # ode: 'euler' | 'heun' | 'dpm++2m' | 'dpm++3m' | 'dopri5' | ...; sde: 'euler' | 'heun'
    steps: int = 50  # fixed-step methods: number of steps (ignored by adaptive ones)
    grid: str = "uniform"  # fixed-step methods: where the steps go: 'uniform' | 'shift' | 'logsnr' | 'edm'
    shift: float = 3.0  # grid='shift': SD3's shift; > 1 puts more steps near the noise end
    atol: float = 1e-6  # adaptive ODE methods: absolute tolerance
    rtol: float = 1e-3  # adaptive ODE methods: relative tolerance
    diffusion_form: str = "sigma"  # sde: w(t), see `diffusion`; 'sigma' is SiT's best ImageNet setting
    diffusion_norm: float = 1.0  # sde: scale of w(t)
    last_step: str = "mean"  # sde: final noiseless step to t = 1: 'mean' | 'tweedie' | 'euler' | 'none'
    # ('mean' suits forms with w(1) = 0; after 'constant', or 'sbdm' on VP, 'euler' keeps the variance)
    last_step_size: float = 0.04  # sde: length of that last step (in t)

    def __post_init__(self):
        check_choice("SamplerConfig.mode", self.mode, MODES)
        methods = {"ode": ODE_FIXED + ODE_ADAPTIVE, "sde": SDE_METHODS, "meanflow": MEANFLOW_METHODS}[self.mode]
        check_choice(f"SamplerConfig(mode={self.mode!r}).method", self.method, methods)
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"SamplerConfig.steps={self.steps!r} must be a positive integer")
        if self.steps > MAX_STEPS:  # before the time grid is allocated (1e9 steps: 8 GB)
            raise ValueError(f"SamplerConfig.steps={self.steps:,}: at most {MAX_STEPS:,} (SiT's best sampler takes "
                             "250, and the time grid is allocated before sampling)")
        check_choice("SamplerConfig.grid", self.grid, GRIDS)
        if isinstance(self.shift, bool) or not isinstance(self.shift, int | float) or not 0 < self.shift < math.inf:
            raise ValueError(f"SamplerConfig.shift={self.shift!r} must be a number > 0 (1 = the uniform grid)")
        for name in ("atol", "rtol"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SamplerConfig.{name}={getattr(self, name)!r} must be > 0")
        check_choice("SamplerConfig.diffusion_form", self.diffusion_form, DIFFUSION_FORMS)
        if not self.diffusion_norm >= 0:
            raise ValueError(f"SamplerConfig.diffusion_norm={self.diffusion_norm!r} must be >= 0")
        check_choice("SamplerConfig.last_step", self.last_step, LAST_STEPS)
        if self.last_step != "none" and not 0 < self.last_step_size < 1:
            raise ValueError(f"SamplerConfig.last_step_size={self.last_step_size!r} must be in (0, 1)")


@dataclass
class SampleResult:
    samples: torch.Tensor  # like the noise
    nfe: int  # calls of model_fn (a CFG call, conditional and unconditional together, is one)


def sample(model_fn, noise, y, transport: Transport, cfg: SamplerConfig, rng=None) -> SampleResult:
    """Integrate `noise` (x0, at t = t0) to samples x1 (at t = t1) with the solver that `cfg` names.
    rng: a StackedRandomGenerator for the SDE's per-step noise (None = the global torch RNG); the ODE
    samplers use no randomness."""
    calls = [0]

    def counted(x, t, y_, **kw):
        calls[0] += 1
        return model_fn(x, t, y_, **kw)

    if cfg.mode == "meanflow":
        with torch.no_grad():
            return SampleResult(meanflow_sample(counted, noise, y, cfg.steps), calls[0])
    if cfg.mode == "sde":
        sampler = sde_euler_maruyama if cfg.method == "euler" else sde_heun
    elif cfg.method in MULTISTEP_METHODS:
        sampler = ode_multistep
    else:
        sampler = {"euler": ode_euler, "heun": ode_heun}.get(cfg.method, ode_adaptive)
    with torch.no_grad():
        samples = sampler(counted, noise, y, transport, cfg, rng)
    return SampleResult(samples, calls[0])


# Helpers shared by the samplers.
def steps_grid(transport: Transport, cfg: SamplerConfig, t0: float | None = None,
               t1: float | None = None) -> list[float]:
    """The cfg.steps + 1 times of a fixed-step method on [t0, t1] (None: the ODE's interval), by cfg.grid."""
    if t0 is None or t1 is None:
        t0, t1 = transport.interval()
    return time_grid(transport, t0, t1, cfg.steps, cfg.grid, cfg.shift)


def _t(t: float, x: torch.Tensor) -> torch.Tensor:
    return torch.full((x.shape[0],), t, dtype=x.dtype, device=x.device)


def _velocity(model_fn, transport, x, t, y):
    t = _t(t, x)
    return transport.velocity(model_fn(x, t, y), x, t)


def diffusion(transport: Transport, t: torch.Tensor, form: str, norm: float) -> torch.Tensor:
    """The SDE's diffusion coefficient w(t) (B,); the SDE is dx = (v + w score) dt + sqrt(2 w) dW."""
    if form == "constant":
        return torch.full_like(t, norm)
    if form == "sbdm":  # the score SDE's own coefficient: infinite at t = 0 on linear and GVP
        return norm * transport.score_coef(t)
    if form == "sigma":
        return norm * transport.coefficients(t)[2]
    if form == "linear":
        return norm * (1 - t)
    if form == "decreasing":
        return 0.25 * (norm * torch.cos(torch.pi * t) + 1) ** 2
    return norm * torch.sin(torch.pi * t) ** 2  # 'increasing-decreasing'


def _sde_drift(model_fn, transport, cfg, x, t, y):
    """(SDE drift v + w score, velocity v, w) at scalar time t, from one model call."""
    t = _t(t, x)
    out = model_fn(x, t, y)
    v = transport.velocity(out, x, t)
    w = expand_like(diffusion(transport, t, cfg.diffusion_form, cfg.diffusion_norm), x)
    # A zero diffusion adds no score term (this avoids 0 * inf where sigma_t = 0, at t = 1).
    w_score = torch.where(w == 0, torch.zeros_like(v), w * transport.score(out, x, t))
    return v + w_score, v, w


def _sde_interval(transport, cfg):
    last = 0.0 if cfg.last_step == "none" else cfg.last_step_size
    return transport.interval(sde=True, sbdm=cfg.diffusion_form == "sbdm", last_step_size=last)


def _last_step(model_fn, transport, cfg, x, t1, y):
    """The SDE's final deterministic step from t1 to 1 (no noise is added)."""
    if cfg.last_step == "none":
        return x
    if cfg.last_step == "tweedie":  # the posterior mean E[x1 | x_t] = (x + sigma^2 score) / alpha
        t = _t(t1, x)
        alpha, _, sigma, _ = (expand_like(c, x) for c in transport.coefficients(t))
        return (x + sigma**2 * transport.score(model_fn(x, t, y), x, t)) / alpha
    drift, v, _ = _sde_drift(model_fn, transport, cfg, x, t1, y)
    if cfg.last_step == "mean":  # the mean of one more Euler-Maruyama step
        return x + cfg.last_step_size * drift
    return x + cfg.last_step_size * v  # 'euler': one probability-flow Euler step


# ODE samplers.
def ode_euler(model_fn, noise, y, transport, cfg, rng=None, t_steps=None):
    """Euler on the probability-flow ODE: cfg.steps steps, cfg.steps NFE (t_steps: other times, ends included)."""
    t_steps = steps_grid(transport, cfg) if t_steps is None else t_steps
    x = noise
    for t_cur, t_next in zip(t_steps[:-1], t_steps[1:]):
        # Euler step along the velocity.
        x = x + (t_next - t_cur) * _velocity(model_fn, transport, x, t_cur, y)
    return x


def ode_heun(model_fn, noise, y, transport, cfg, rng=None, t_steps=None):
    """Heun (explicit trapezoid) on the probability-flow ODE: cfg.steps steps, 2 * cfg.steps NFE."""
    t_steps = steps_grid(transport, cfg) if t_steps is None else t_steps
    x = noise
    for t_cur, t_next in zip(t_steps[:-1], t_steps[1:]):
        h = t_next - t_cur
        # Euler step.
        d_cur = _velocity(model_fn, transport, x, t_cur, y)
        x_next = x + h * d_cur
        # Second-order correction: average the slopes at both ends.
        d_next = _velocity(model_fn, transport, x_next, t_next, y)
        x = x + 0.5 * h * (d_cur + d_next)
    return x


def ode_multistep(model_fn, noise, y, transport, cfg, rng=None, t_steps=None):
    """DPM-Solver++ multistep (cfg.method 'dpm++2m' | 'dpm++3m'): cfg.steps steps, cfg.steps NFE."""
    t_steps = steps_grid(transport, cfg) if t_steps is None else t_steps
    return dpm_solver_pp(model_fn, noise, y, transport, t_steps, MULTISTEP_ORDERS[cfg.method])


def ode_adaptive(model_fn, noise, y, transport, cfg, rng=None):
    """An adaptive torchdiffeq solver (cfg.method) with cfg.atol / cfg.rtol. The step sizes are shared
    by the whole batch, so a sample may differ, within the tolerance, with its batch-mates. It is stopped with a
    SolverError past MAX_NFE network evaluations (a tight tolerance with a large guidance never ends)."""
    t0, t1 = transport.interval()
    calls = [0]

    def f(t, x):
        calls[0] += 1
        if calls[0] > MAX_NFE:
            raise SolverError(f"{cfg.method} took more than {MAX_NFE:,} network evaluations (MAX_NFE) at atol="
                              f"{cfg.atol:g} rtol={cfg.rtol:g} and was stopped: loosen the tolerance (sample.py "
                              "--tol 1e-5, sampler.atol/rtol), lower the guidance scale, or use a fixed-step method "
                              "(--method heun --steps 50)")
        # Clamped: torchdiffeq's first-step heuristic may probe outside [t0, t1] (VP is NaN past t = 1).
        t = t.clamp(t0, t1).to(x.dtype).expand(x.shape[0])
        return transport.velocity(model_fn(x, t, y), x, t)

    t_span = torch.tensor([t0, t1], dtype=noise.dtype, device=noise.device)
    # step_t: land the last step exactly on t1 rather than step past it and interpolate back.
    options = {"step_t": t_span[1:]}
    try:
        return odeint(f, noise, t_span, method=cfg.method, atol=cfg.atol, rtol=cfg.rtol, options=options)[-1]
    except AssertionError as e:  # torchdiffeq's 'underflow in dt ...': the step size fell below float precision
        if "underflow" not in str(e):
            raise
        raise SolverError(f"{cfg.method} could not keep atol={cfg.atol:g} rtol={cfg.rtol:g}: its step size "
                          "underflowed (the tolerance is below what float32 holds, or the guidance scale makes the "
                          "velocity blow up); loosen the tolerance (sample.py --tol 1e-5, sampler.atol/rtol) or "
                          "lower the guidance scale") from None


# SDE samplers.
def sde_euler_maruyama(model_fn, noise, y, transport, cfg, rng=None):
    """Euler-Maruyama on dx = (v + w score) dt + sqrt(2 w) dW, which keeps the marginals p_t of the
    probability-flow ODE. cfg.steps steps (1 NFE each) then the last step (1 NFE unless 'none')."""
    randn_like = torch.randn_like if rng is None else rng.randn_like
    t0, t1 = _sde_interval(transport, cfg)
    t_steps = steps_grid(transport, cfg, t0, t1)
    x = noise
    for t_cur, t_next in zip(t_steps[:-1], t_steps[1:]):
        dt = t_next - t_cur
        # Drift step.
        drift, _, w = _sde_drift(model_fn, transport, cfg, x, t_cur, y)
        x_mean = x + dt * drift
        # Brownian increment with variance 2 w dt.
        x = x_mean + torch.sqrt(2 * w * dt) * randn_like(x)
    # Last step to t = 1 without noise.
    return _last_step(model_fn, transport, cfg, x, t1, y)


def sde_heun(model_fn, noise, y, transport, cfg, rng=None):
    """SiT's stochastic Heun: add the step's noise first, then a Heun step of the drift.
    cfg.steps steps (2 NFE each) then the last step (1 NFE unless 'none')."""
    randn_like = torch.randn_like if rng is None else rng.randn_like
    t0, t1 = _sde_interval(transport, cfg)
    t_steps = steps_grid(transport, cfg, t0, t1)
    x = noise
    for t_cur, t_next in zip(t_steps[:-1], t_steps[1:]):
        dt = t_next - t_cur
        # Brownian increment with variance 2 w(t_cur) dt.
        w = expand_like(diffusion(transport, _t(t_cur, x), cfg.diffusion_form, cfg.diffusion_norm), x)
        x_hat = x + torch.sqrt(2 * w * dt) * randn_like(x)
        # Euler step of the drift.
        d_cur = _sde_drift(model_fn, transport, cfg, x_hat, t_cur, y)[0]
        x_next = x_hat + dt * d_cur
        # Second-order correction of the drift.
        d_next = _sde_drift(model_fn, transport, cfg, x_next, t_next, y)[0]
        x = x_hat + 0.5 * dt * (d_cur + d_next)
    # Last step to t = 1 without noise.
    return _last_step(model_fn, transport, cfg, x, t1, y)
