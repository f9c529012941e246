# Vit5SitDiffusersPipeline, the pipeline, written by vit5-sit 0.1.0 when this model folder was exported: every definition
# below is copied from the vit5_sit package's source (the module named above each group), so that
# diffusers loads the folder without vit5-sit: DiffusionPipeline.from_pretrained(folder,
# trust_remote_code=True). Not edited by hand: export the folder again to update it.
from __future__ import annotations
from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin, SchedulerMixin
from numbers import Real
import math
import inspect
import dataclasses
from diffusers.configuration_utils import register_to_config
import difflib
import torch
from dataclasses import dataclass
def odeint(*args, **kwargs):  # torchdiffeq: imported on first use, an optional dependency
    import importlib

    try:
        module = importlib.import_module('torchdiffeq')
    except ImportError:
        raise ImportError('odeint' + ' needs torchdiffeq, which is not installed (the adaptive '
                          'solvers such as dopri5 use it): pip install torchdiffeq') from None
    return getattr(module, 'odeint')(*args, **kwargs)
from diffusers.schedulers.scheduling_utils import SchedulerOutput
from pathlib import Path
import json
import importlib
import sys
import numpy as np
import numbers
from collections.abc import Callable, Sequence
import warnings
import os
import functools
from urllib.parse import urlparse
import socket
import threading
from torch import nn
import torch.nn.functional as F
from typing import NamedTuple
from torch.utils.checkpoint import checkpoint
import contextlib


# ---- from vit5_sit.transport.guidance -------------------------------------------------------------------------


class GuidanceError(ValueError):
    """Guidance asked of a model that has no unconditional (null) label."""


# ---- from vit5_sit.common.contract ----------------------------------------------------------------------------


MAX_GUIDANCE = 1_000.0     # classifier-free guidance: SiT and DiT use 1.5-4; far larger scales only overflow


# ---- from vit5_sit.transport.guidance -------------------------------------------------------------------------


def check_guidance_settings(scale: float, interval=(0.0, 1.0), scale_name: str = "cfg_scale",
                            interval_name: str = "guidance_interval") -> None:
    """The one rule for a guidance scale and interval, named as the caller's user wrote them (a CLI passes its
    flags, e.g. ``--cfg-scale``): scale >= 0 (1 = none, 0 = unconditional), 0 <= low <= high <= 1."""
    number = isinstance(scale, Real) and not isinstance(scale, bool)  # numpy scalars too
    if number and not math.isfinite(scale):
        raise GuidanceError(f"{scale_name} {float(scale):g}: not a finite number; give a scale >= 0 (1 = no "
                            "guidance, 0 = unconditional)")
    if not number or scale < 0:
        shown = f"{float(scale):g}" if number else repr(scale)
        raise GuidanceError(f"{scale_name} {shown}: must be >= 0 (1 = no guidance, 0 = unconditional)")
    if scale > MAX_GUIDANCE:
        raise GuidanceError(f"{scale_name} {float(scale):g}: at most {MAX_GUIDANCE:g} (SiT and DiT use 1.5-4; far "
                            "larger scales only overflow the sampler)")
    try:
        low, high = (float(v) for v in interval)
    except (TypeError, ValueError):
        raise GuidanceError(f"{interval_name} {interval!r}: expected two numbers LOW HIGH in [0, 1]") from None
    if not 0.0 <= low <= high <= 1.0:
        raise GuidanceError(f"{interval_name} {low:g} {high:g}: need 0 <= LOW <= HIGH <= 1 (t: 0 = noise, "
                            "1 = data)")


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


def _is_own_scheduler(scheduler) -> bool:
    """Our scheduler (`Vit5SitScheduler`, from this package or a folder's copy): it holds a transport and a sampler."""
    return hasattr(scheduler, "transport") and hasattr(scheduler, "sampler_config")


def config_init(*config_classes):
    """Decorate an ``__init__(self, **fields)``: its signature becomes the fields of the dataclasses, with their
    defaults, and diffusers' `register_to_config` records them (what ConfigMixin writes to the config file and
    passes back on loading)."""
    params, seen = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)], set()
    for config_class in config_classes:
        for f in dataclasses.fields(config_class):
            if f.name in seen:
                raise TypeError(f"{config_class.__name__}.{f.name}: the name is also a field of another config "
                                "of the same component")
            seen.add(f.name)
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default))

    def decorate(init):
        init.__signature__ = inspect.Signature(params)
        return register_to_config(init)

    return decorate


# ---- from vit5_sit.common.utils -------------------------------------------------------------------------------


def check_choice(key: str, value: object, choices: Iterable, error: type[Exception] = ValueError) -> None:
    """Raise `error` naming `key`, the bad value, the valid choices and the nearest one, unless value is one.

    The one choice validator of the project: the config, the transport and the model options all use it.
    """
    choices = tuple(choices)
    if value in choices:
        return
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise error(f"{key}={value!r}: must be one of {', '.join(map(repr, choices))}.{hint}")


# ---- from vit5_sit.transport.transport ------------------------------------------------------------------------


class InterpolantPath:
    """One path x_t = alpha_t x1 + sigma_t x0: its coefficients, alpha'/alpha, and its end-point rules.

    A path is unstable at an end where the conversions divide by zero (alpha_t = 0 at t = 0, sigma_t = 0
    at t = 1): training and sampling times stop eps short of such an end (SiT's `check_interval`).
    """

    name: str
    alpha_zero_at_noise: bool = True  # alpha_0 = 0 exactly, so alpha'/alpha is infinite at t = 0

    def coefficients(self, t: torch.Tensor):
        """(alpha_t, alpha'_t, sigma_t, sigma'_t), each shaped like t."""
        raise NotImplementedError

    def dlog_alpha(self, t: torch.Tensor) -> torch.Tensor:
        """alpha'_t / alpha_t, computed stably."""
        raise NotImplementedError

    def unstable_ends(self, prediction: str) -> tuple[bool, bool]:
        """(noise end t = 0, data end t = 1): which ends the times must stop eps short of."""
        # Linear and GVP: velocity is stable everywhere; score / noise need 1/alpha_t and 1/sigma_t.
        unstable = prediction != "velocity"
        return unstable, unstable

    def default_eps(self, prediction: str) -> tuple[float, float]:
        """SiT's (train_eps, sample_eps) when the config leaves them None."""
        return (1e-3, 1e-3) if prediction != "velocity" else (0.0, 0.0)


class LinearPath(InterpolantPath):
    """alpha_t = t, sigma_t = 1 - t (SiT's ICPlan)."""

    name = "linear"

    def coefficients(self, t):
        return t, torch.ones_like(t), 1 - t, -torch.ones_like(t)

    def dlog_alpha(self, t):
        return 1 / t  # infinite at t = 0


class GVPPath(InterpolantPath):
    """alpha_t = sin(pi t / 2), sigma_t = cos(pi t / 2): alpha^2 + sigma^2 = 1 (SiT's GVPCPlan)."""

    name = "gvp"

    def coefficients(self, t):
        half_pi = math.pi / 2
        return (torch.sin(half_pi * t), half_pi * torch.cos(half_pi * t),
                torch.cos(half_pi * t), -half_pi * torch.sin(half_pi * t))

    def dlog_alpha(self, t):
        return (math.pi / 2) / torch.tan(math.pi / 2 * t)  # infinite at t = 0


VP_SIGMA_MAX = 20.0  # beta(t) at the noise end


VP_SIGMA_MIN = 0.1  # beta(t) at the data end of SiT's VP path


class VPPath(InterpolantPath):
    """The score-SDE VP path with linear beta from VP_SIGMA_MIN (data end) to VP_SIGMA_MAX (SiT's VPCPlan).

    alpha_t = exp(log_alpha_t) never reaches 0, so t = 0 is safe; sigma_1 = 0, so every prediction stops
    short of t = 1.
    """

    name = "vp"
    alpha_zero_at_noise = False

    def log_alpha(self, t: torch.Tensor) -> torch.Tensor:
        return -0.25 * (1 - t) ** 2 * (VP_SIGMA_MAX - VP_SIGMA_MIN) - 0.5 * (1 - t) * VP_SIGMA_MIN

    def coefficients(self, t):
        log_alpha = self.log_alpha(t)
        alpha = torch.exp(log_alpha)
        # Variance preserving, sigma^2 = 1 - alpha^2, written with expm1: accurate where alpha ~ 1 (t ~ 1).
        sigma = torch.sqrt(-torch.expm1(2 * log_alpha))
        d_alpha = alpha * self.dlog_alpha(t)
        return alpha, d_alpha, sigma, -alpha * d_alpha / sigma

    def dlog_alpha(self, t):
        return 0.5 * (1 - t) * (VP_SIGMA_MAX - VP_SIGMA_MIN) + 0.5 * VP_SIGMA_MIN

    def unstable_ends(self, prediction):
        return False, True

    def default_eps(self, prediction):
        return 1e-5, 1e-3


INTERPOLANT_PATHS: dict[str, InterpolantPath] = {p.name: p for p in (LinearPath(), GVPPath(), VPPath())}


PREDICTIONS = ("velocity", "score", "noise")


LOSS_WEIGHTS = ("none", "velocity", "likelihood")


TIME_DISTS = ("uniform", "logit_normal")


@dataclass
class TransportConfig:
    path: str = "linear"  # 'linear' | 'gvp' | 'vp'
    prediction: str = "velocity"  # what the network outputs: 'velocity' | 'score' | 'noise'
    loss_weight: str = "none"  # score / noise prediction only: 'none' | 'velocity' | 'likelihood'
    time_dist: str = "uniform"  # training t: 'uniform' | 'logit_normal'
    logit_normal_mean: float = 0.0  # t = sigmoid(mean + std * n); mean > 0 leans toward data (t = 1)
    logit_normal_std: float = 1.0
    train_eps: float | None = None  # training t avoids the unstable end(s) by this; None = SiT's rule
    sample_eps: float | None = None  # same at sampling; None = SiT's rule

    def __post_init__(self):
        check_choice("TransportConfig.path", self.path, INTERPOLANT_PATHS)
        check_choice("TransportConfig.prediction", self.prediction, PREDICTIONS)
        check_choice("TransportConfig.loss_weight", self.loss_weight, LOSS_WEIGHTS)
        check_choice("TransportConfig.time_dist", self.time_dist, TIME_DISTS)
        if self.prediction == "velocity" and self.loss_weight != "none":
            raise ValueError(
                f"TransportConfig.loss_weight={self.loss_weight!r} has no effect with prediction='velocity' "
                "(the velocity loss is already velocity-weighted); use loss_weight='none'"
            )
        if not self.logit_normal_std > 0:
            raise ValueError(f"TransportConfig.logit_normal_std={self.logit_normal_std!r} must be > 0")
        for name in ("train_eps", "sample_eps"):
            eps = getattr(self, name)
            if eps is not None and not 0.0 <= eps < 0.5:
                raise ValueError(f"TransportConfig.{name}={eps!r} must be in [0, 0.5), or None (SiT's rule)")


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


MODES = ("ode", "sde", "meanflow")  # meanflow: a MeanFlow model's average-velocity steps (transport/meanflow.py)


# ---- from vit5_sit.transport.solvers --------------------------------------------------------------------------


MULTISTEP_ORDERS = {"dpm++2m": 2, "dpm++3m": 3}  # method name -> order


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


MULTISTEP_METHODS = tuple(MULTISTEP_ORDERS)  # DPM-Solver++ multistep: ODE only, one NFE a step


ODE_FIXED = ("euler", "heun", *MULTISTEP_METHODS)


ODE_ADAPTIVE = ("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun")  # through torchdiffeq


SDE_METHODS = ("euler", "heun")  # 'euler' = Euler-Maruyama


MEANFLOW_METHODS = ("euler",)  # x_{t+d} = x_t + d U(x_t, t, d): the only MeanFlow step


# ---- from vit5_sit.common.contract ----------------------------------------------------------------------------


MAX_STEPS = 10_000         # sampler steps: SiT's best sampler takes 250; a time grid of 1e9 steps allocated 8 GB


# ---- from vit5_sit.transport.solvers --------------------------------------------------------------------------


GRIDS = ("uniform", "shift", "logsnr", "edm")


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


DIFFUSION_FORMS = ("constant", "sbdm", "sigma", "linear", "decreasing", "increasing-decreasing")


LAST_STEPS = ("mean", "tweedie", "euler", "none")


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


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


def split_fields(fields: dict, config_class) -> tuple[dict, dict]:
    """(the fields of ``config_class``, the others)."""
    names = {f.name for f in dataclasses.fields(config_class)}
    return {k: v for k, v in fields.items() if k in names}, {k: v for k, v in fields.items() if k not in names}


# ---- from vit5_sit.transport.transport ------------------------------------------------------------------------


SBDM_MIN_T = 1e-3  # smallest t the SDE starts at with diffusion_form='sbdm' (its w(t) ~ 1/t at t = 0)


def expand_like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(B,) times -> (B, 1, ..., 1), broadcastable against x."""
    return t.reshape(-1, *([1] * (x.ndim - 1))).to(x.dtype)


class Transport:
    """Path + prediction + training-time sampling, from a TransportConfig."""

    def __init__(self, cfg: TransportConfig | None = None):
        self.cfg = cfg = cfg or TransportConfig()
        self.path = INTERPOLANT_PATHS[cfg.path]
        default_train, default_sample = self.path.default_eps(cfg.prediction)  # None means the path's rule
        self.train_eps = default_train if cfg.train_eps is None else cfg.train_eps
        self.sample_eps = default_sample if cfg.sample_eps is None else cfg.sample_eps

    # Path coefficients.
    def coefficients(self, t: torch.Tensor):
        """(alpha_t, alpha'_t, sigma_t, sigma'_t), each shaped like t."""
        return self.path.coefficients(t)

    def dlog_alpha(self, t: torch.Tensor) -> torch.Tensor:
        """alpha'_t / alpha_t, computed stably (infinite at t = 0 for linear and GVP)."""
        return self.path.dlog_alpha(t)

    def score_coef(self, t: torch.Tensor) -> torch.Tensor:
        """lambda_t with velocity = dlog_alpha_t * x + lambda_t * score (SiT's `compute_drift` variance)."""
        _, _, sigma, d_sigma = self.coefficients(t)
        return self.dlog_alpha(t) * sigma**2 - sigma * d_sigma

    # Time intervals: eps short of each end the path marks unstable for this prediction.
    def interval(self, *, sde: bool = False, sbdm: bool = False, last_step_size: float = 0.0):
        """[t0, t1] for sampling (SiT's `check_interval`, eval=True). last_step_size: the SDE's final
        deterministic step, taken from t1 to 1 (0 = none). sbdm: the SDE's w(t) is the score SDE's own."""
        eps = self.sample_eps
        noise_end, data_end = self.path.unstable_ends(self.cfg.prediction)
        t0 = eps if noise_end else 0.0
        if sde and sbdm and self.path.alpha_zero_at_noise:
            t0 = max(eps, SBDM_MIN_T)  # the SBDM coefficient (alpha'/alpha ...) is infinite where alpha = 0
        if sde and last_step_size > 0:
            t1 = 1 - last_step_size
        else:
            t1 = 1 - eps if data_end or sde else 1.0  # the SDE always stops short of the data end
        return t0, t1

    def train_interval(self):
        """[t0, t1] of the training times."""
        noise_end, data_end = self.path.unstable_ends(self.cfg.prediction)
        return (self.train_eps if noise_end else 0.0), (1 - self.train_eps if data_end else 1.0)

    def sample_t(self, n: int, device=None, dtype=torch.float32, generator=None) -> torch.Tensor:
        """n training times in the training interval (generator None = the global torch RNG)."""
        t0, t1 = self.train_interval()
        kw = dict(device=device, dtype=dtype, generator=generator)
        if self.cfg.time_dist == "uniform":
            u = torch.rand(n, **kw)
        else:
            u = torch.sigmoid(self.cfg.logit_normal_mean + self.cfg.logit_normal_std * torch.randn(n, **kw))
        return t0 + (t1 - t0) * u

    def interpolate(self, x0: torch.Tensor, x1: torch.Tensor, t: torch.Tensor):
        """(x_t, u_t): the point on the path and the conditional velocity target."""
        alpha, d_alpha, sigma, d_sigma = (expand_like(c, x1) for c in self.coefficients(t))
        # Time runs from noise (t = 0, x_t = x0) to data (t = 1, x_t = x1): the reverse of DDPM's t.
        return alpha * x1 + sigma * x0, d_alpha * x1 + d_sigma * x0

    # Conversions of the model's prediction (whichever cfg.prediction is) into each field.
    def velocity(self, model_out: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        p = self.cfg.prediction
        if p == "velocity":
            return model_out
        score = model_out if p == "score" else -model_out / expand_like(self.coefficients(t)[2], x)
        return expand_like(self.dlog_alpha(t), x) * x + expand_like(self.score_coef(t), x) * score

    def noise(self, model_out: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        p = self.cfg.prediction
        alpha, d_alpha, sigma, d_sigma = (expand_like(c, x) for c in self.coefficients(t))
        if p == "noise":
            return model_out
        if p == "score":
            return -sigma * model_out
        # From x = alpha E[x1|x] + sigma eps and v = alpha' E[x1|x] + sigma' eps (no division by alpha').
        return (alpha * model_out - d_alpha * x) / (alpha * d_sigma - d_alpha * sigma)

    def data(self, model_out: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The data prediction x1_hat = E[x1 | x_t = x]; on the linear path x + (1 - t) * velocity."""
        if self.cfg.prediction == "velocity":
            # From x = alpha x1_hat + sigma eps and v = alpha' x1_hat + sigma' eps: finite at both ends.
            alpha, d_alpha, sigma, d_sigma = (expand_like(c, x) for c in self.coefficients(t))
            return (d_sigma * x - sigma * model_out) / (d_sigma * alpha - sigma * d_alpha)
        alpha, _, sigma, _ = (expand_like(c, x) for c in self.coefficients(t))
        return (x - sigma * self.noise(model_out, x, t)) / alpha

    def score(self, model_out: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.cfg.prediction == "score":
            return model_out
        return -self.noise(model_out, x, t) / expand_like(self.coefficients(t)[2], x)

    # Training.
    def loss(self, model, x1: torch.Tensor, y: torch.Tensor | None, *,
             t: torch.Tensor | None = None,      # (B,) training times; None = sample_t from the global RNG
             noise: torch.Tensor | None = None,  # x0 like x1; None = randn_like(x1) from the global RNG
             ) -> torch.Tensor:
        """Per-sample loss (B,) of ``model(x_t, t, y)``: the mean over all non-batch dims, in x1's dtype."""
        x0 = torch.randn_like(x1) if noise is None else noise.to(x1)
        t = self.sample_t(x1.shape[0], device=x1.device, dtype=x1.dtype) if t is None else t.to(x1)
        xt, ut = self.interpolate(x0, x1, t)
        return self.prediction_loss(model(xt, t, y), x0, ut, t)

    def prediction_loss(self, out: torch.Tensor, x0: torch.Tensor, ut: torch.Tensor,
                        t: torch.Tensor) -> torch.Tensor:
        """Per-sample loss (B,) of a prediction ``out`` at (x_t, t), x_t built from noise x0 with velocity ut."""
        dims = tuple(range(1, x0.ndim))
        if self.cfg.prediction == "velocity":
            return ((out - ut) ** 2).mean(dims)
        # Score / noise: SiT's weights, in terms of lambda_t and sigma_t.
        sigma = self.coefficients(t)[2]
        weight = {
            "none": torch.ones_like(t),
            "velocity": (self.score_coef(t) / sigma) ** 2,
            "likelihood": self.score_coef(t) / sigma**2,
        }[self.cfg.loss_weight]
        if self.cfg.prediction == "noise":
            err = ((out - x0) ** 2).mean(dims)
        else:
            err = ((out * expand_like(sigma, x0) + x0) ** 2).mean(dims)  # sigma_t * score = -eps
        return weight * err


# ---- from vit5_sit.sampling.generate --------------------------------------------------------------------------


def sampler_settings(base: SamplerConfig | None = None, mode: str | None = None, method: str | None = None,
                     steps: int | None = None, grid: str | None = None, tol: float | None = None) -> SamplerConfig:
    """A model's sampler (``base``: its config's, None = the defaults) with some settings changed; switching
    ``mode`` without a ``method`` takes Euler, since the base's method belongs to the other mode. ``tol`` sets
    an adaptive ODE solver's atol and rtol both (refused for any other method: it would be ignored)."""
    fields = dataclasses.asdict(base if base is not None else SamplerConfig())
    if mode is not None and mode != fields["mode"]:
        fields["mode"], fields["method"] = mode, "euler"
    if method is not None:
        if fields["mode"] == "meanflow" and method != "euler":
            raise ValueError(f"method {method!r}: a MeanFlow model samples with its own average-velocity steps, not "
                             "an ODE/SDE method; leave out the method and set the steps (1 by default)")
        fields["method"] = method
    if steps is not None:
        fields["steps"] = steps
    if grid is not None:
        if fields["mode"] == "meanflow":
            raise ValueError(f"a time grid ({grid}) is for the ODE/SDE solvers; MeanFlow's steps are uniform: leave "
                             "out the grid")
        fields["grid"] = grid
    if tol is not None:
        if fields["mode"] != "ode" or fields["method"] not in ODE_ADAPTIVE:
            raise ValueError(f"a tolerance is for adaptive ODE solvers ({', '.join(ODE_ADAPTIVE)}), not "
                             f"{fields['mode']} {fields['method']!r}: add --method dopri5 or leave the tolerance out")
        fields["atol"] = fields["rtol"] = tol
    if grid is not None and fields["mode"] == "ode" and fields["method"] in ODE_ADAPTIVE:
        raise ValueError(f"a time grid is for fixed-step methods, not {fields['method']!r}, which chooses its own "
                         "steps: leave the grid out, or add a fixed-step --method (euler, heun, dpm++2m)")
    return SamplerConfig(**fields)


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


@dataclass
class SampleResult:
    samples: torch.Tensor  # like the noise
    nfe: int  # calls of model_fn (a CFG call, conditional and unconditional together, is one)


# ---- from vit5_sit.transport.meanflow -------------------------------------------------------------------------


def meanflow_grid(steps: int) -> list[float]:
    """The times of a k-step MeanFlow sample: uniform on [0, 1] (noise to data), k + 1 points."""
    return [i / steps for i in range(steps + 1)]


def meanflow_sample(model_fn, noise: torch.Tensor, y: torch.Tensor, steps: int) -> torch.Tensor:
    """x1 from noise x0 in ``steps`` network evaluations: x_{t+d} = x_t + d U(x_t, t, d) on the uniform grid.
    ``model_fn(x, t, y, interval=d)`` is the network or a guided wrapper; one call per step."""
    x = noise
    grid = meanflow_grid(steps)
    for t0, t1 in zip(grid[:-1], grid[1:]):
        t = torch.full((x.shape[0],), t0, dtype=x.dtype, device=x.device)
        d = torch.full_like(t, t1 - t0)
        x = x + (t1 - t0) * model_fn(x, t, y, interval=d)  # Average-velocity step.
    return x


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


def _sde_interval(transport, cfg):
    last = 0.0 if cfg.last_step == "none" else cfg.last_step_size
    return transport.interval(sde=True, sbdm=cfg.diffusion_form == "sbdm", last_step_size=last)


# ---- from vit5_sit.transport.solvers --------------------------------------------------------------------------


def log_snr(transport: Transport, t: torch.Tensor) -> torch.Tensor:
    """lambda_t = log(alpha_t / sigma_t) in float64 (-inf where alpha_t = 0, +inf where sigma_t = 0)."""
    alpha, _, sigma, _ = transport.coefficients(t.to(torch.float64))
    return torch.log(alpha) - torch.log(sigma)


EDM_SIGMA_MAX = 80.0  # the logsnr / edm grids' noisiest interior point: sigma_t / alpha_t (EDM's sigma_max)


EDM_SIGMA_MIN = 0.002  # their cleanest interior point (EDM's sigma_min)


EDM_RHO = 7.0  # the edm grid's spacing exponent (Karras et al. 2022)


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


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


def steps_grid(transport: Transport, cfg: SamplerConfig, t0: float | None = None,
               t1: float | None = None) -> list[float]:
    """The cfg.steps + 1 times of a fixed-step method on [t0, t1] (None: the ODE's interval), by cfg.grid."""
    if t0 is None or t1 is None:
        t0, t1 = transport.interval()
    return time_grid(transport, t0, t1, cfg.steps, cfg.grid, cfg.shift)


def _t(t: float, x: torch.Tensor) -> torch.Tensor:
    return torch.full((x.shape[0],), t, dtype=x.dtype, device=x.device)


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


# ---- from vit5_sit.transport.solvers --------------------------------------------------------------------------


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


DATA_END_SIGMA = 1e-4  # a step that lands where sigma_t is below this lands on the data end: first order


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


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


def ode_multistep(model_fn, noise, y, transport, cfg, rng=None, t_steps=None):
    """DPM-Solver++ multistep (cfg.method 'dpm++2m' | 'dpm++3m'): cfg.steps steps, cfg.steps NFE."""
    t_steps = steps_grid(transport, cfg) if t_steps is None else t_steps
    return dpm_solver_pp(model_fn, noise, y, transport, t_steps, MULTISTEP_ORDERS[cfg.method])


def _velocity(model_fn, transport, x, t, y):
    t = _t(t, x)
    return transport.velocity(model_fn(x, t, y), x, t)


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


# ---- from vit5_sit.common.contract ----------------------------------------------------------------------------


MAX_NFE = 2 * MAX_STEPS    # network evaluations of one batch by an adaptive solver (dopri5, ...): as many as the


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


class SolverError(ValueError):
    """An adaptive solver that could not meet its tolerance; the message names the settings to change."""


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


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


class Vit5SitScheduler(SchedulerMixin, ConfigMixin):
    """The model's transport and default sampler as a diffusers scheduler (``scheduler/scheduler_config.json``:
    the `TransportConfig` and `SamplerConfig` fields). ``sample`` runs the whole sampler; ``set_timesteps`` and
    ``step`` are diffusers' loop for ODE Euler, with our times: ``timesteps`` are the t (0 = noise, 1 = data) at
    which the model is called, and ``step`` takes the model's output (its prediction, velocity by default)."""

    config_name = "scheduler_config.json"
    order = 1

    @config_init(TransportConfig, SamplerConfig)
    def __init__(self, **fields) -> None:
        transport, sampler = split_fields(fields, TransportConfig)
        self.transport = Transport(TransportConfig(**transport))
        self.sampler = SamplerConfig(**sampler)
        self.timesteps: torch.Tensor | None = None
        self.times: list[float] | None = None
        self.num_inference_steps: int | None = None
        self._step_index = 0

    def sampler_config(self, num_inference_steps: int | None = None, mode: str | None = None,
                       method: str | None = None) -> SamplerConfig:
        """The default sampler with some settings changed (`vit5_sit.sampling.generate.sampler_settings`)."""
        return sampler_settings(self.sampler, mode, method, num_inference_steps)

    def sample(self, model_fn, noise: torch.Tensor, y: torch.Tensor, num_inference_steps: int | None = None,
               rng=None) -> torch.Tensor:
        """noise (t = 0) -> samples (t = 1) with the default sampler: `vit5_sit.transport.sample`."""
        pass  # (an import of vit5_sit: defined in this module)

        return sample(model_fn, noise, y, self.transport, self.sampler_config(num_inference_steps), rng=rng).samples

    def set_timesteps(self, num_inference_steps: int | None = None, device: torch.device | str | None = None):
        """The times of ODE Euler's steps (``timesteps``, in t; ``sigmas`` = 1 - t, diffusers' noise level)."""
        cfg = self.sampler_config(num_inference_steps)
        if (cfg.mode, cfg.method) != ("ode", "euler"):
            raise ValueError(f"set_timesteps / step serve ODE Euler; this scheduler's sampler is {cfg.mode} "
                             f"{cfg.method}: call the pipeline (or scheduler.sample), which runs it whole")
        self.times = steps_grid(self.transport, cfg)
        self.timesteps = torch.tensor(self.times[:-1], dtype=torch.float32, device=device)
        self.sigmas = 1 - torch.tensor(self.times, dtype=torch.float32, device=device)
        self.num_inference_steps = cfg.steps
        self._step_index = 0

    def step(self, model_output: torch.Tensor, timestep, sample: torch.Tensor, return_dict: bool = True):
        """One Euler step from times[i] to times[i + 1] (i: the steps since set_timesteps) along the velocity of
        ``model_output`` at (sample, times[i]), exactly as `vit5_sit.transport.samplers.ode_euler` steps."""
        if self.times is None or self._step_index >= len(self.times) - 1:
            raise ValueError("step() past the last time: call set_timesteps first, then step once per timestep")
        t_cur, t_next = self.times[self._step_index], self.times[self._step_index + 1]
        t = torch.full((sample.shape[0],), t_cur, dtype=sample.dtype, device=sample.device)
        prev = sample + (t_next - t_cur) * self.transport.velocity(model_output, sample, t)
        self._step_index += 1
        return SchedulerOutput(prev_sample=prev) if return_dict else (prev,)

    def __len__(self) -> int:
        return self.sampler.steps


# ---- from vit5_sit.sampling.call ------------------------------------------------------------------------------


def require_accelerate(what: str) -> None:
    """One ImportError naming the install when accelerate (CPU offload's hooks) is missing."""
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise ImportError(f"{what} needs accelerate, which is not installed: pip install accelerate (or place the "
                          "pipeline with pipe.to(device), which needs nothing more)")


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


def code_file(obj) -> tuple[str, str] | None:
    """(file stem, source) of the module that defines ``obj``'s class, if it is vit5-sit code (a model folder's
    module, or in the package the module a folder gets: `vit5_sit.hub.layout.folder_code`); None otherwise."""
    cls = type(obj)
    if cls.__module__.split(".")[0] == "vit5_sit":  # the package: the code a folder gets for this class
        return importlib.import_module("vit5_sit.hub.layout").folder_code(cls.__name__)
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if path is None or not path.endswith(".py"):
        return None
    text = Path(path).read_text(encoding="utf-8")
    return (Path(path).stem, text) if text.startswith("# ") and "written by vit5-sit" in text.splitlines()[0] \
        else None


def write_own_code(pipe, save_directory) -> None:
    """The code files of a saved pipeline and of its vit5-sit components (a folder beside each), and
    ``model_index.json`` naming them as diffusers' remote-code loading reads them: ``[file stem, class]``."""
    out = Path(save_directory)
    index = json.loads((out / "model_index.json").read_text(encoding="utf-8"))
    for name, obj in (("", pipe), *((k, v) for k, v in pipe.components.items() if v is not None)):
        code = code_file(obj)
        if code is None:
            continue
        stem, text = code
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / f"{stem}.py").write_text(text, encoding="utf-8")
        index["_class_name" if not name else name] = [stem, type(obj).__name__]
    index.pop("_name_or_path", None)  # a local path is no part of a folder
    (out / "model_index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ---- from vit5_sit.common.contract ----------------------------------------------------------------------------


KINDS = ("int", "float", "path", "text", "choice", "switch", "device", "list", "object")


@dataclass(frozen=True)
class Arg:
    """What a flag takes. ``kind``: int | float (with ``range``), path (``role`` input / output, ``suffixes`` it must
    end in), text (free text the command parses, e.g. --classes; never empty), choice (argparse ``choices``),
    switch (``store_true``), device (cpu, cuda, cuda:N; checked by `checks.parse_device`), list (comma-separated,
    each item in ``range``); object (Python arguments only: checked by the function's own rule, ``note`` says
    which)."""

    kind: str
    range: Range | None = None
    role: str | None = None                 # paths: 'input' (read) | 'output' (written); None: neither
    suffixes: tuple[str, ...] = ()          # output paths: the file name must end in one of these
    choices: tuple = ()                     # choice: the values it takes (Python arguments; argparse has its own)
    note: str = ""                          # object: the rule that checks it
    into_assets: bool = False               # outputs: may write inside the package's assets (only demo export,
                                            # which regenerates the bundled models); every other output is refused

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Arg.kind={self.kind!r}: choose one of {', '.join(KINDS)}")


# ---- from vit5_sit.common.checks ------------------------------------------------------------------------------


def shown(value: object, limit: int = 80, quote: bool = False) -> str:
    """A value as an error message echoes it: ``repr`` (``quote``) or ``str``, cut to ``limit`` characters with
    the full length named (a 5,000-digit number or a 2,000-entry list stays one readable line)."""
    try:
        text = repr(value) if quote else str(value)
    except ValueError:  # an int beyond Python's 4,300-digit str limit
        return f"<an integer of about {value.bit_length() * 0.30103:,.0f} digits>"
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text):,} characters)"


# ---- from vit5_sit.common.contract ----------------------------------------------------------------------------


def _number(x: float | None) -> str:
    """A bound as written: integers whole (4294967295, not 4.29497e+09), other numbers short."""
    return str(x) if isinstance(x, int) else f"{x:g}" if x is not None else ""


@dataclass(frozen=True)
class Range:
    """A numeric range; each bound says what it protects (``why``, shown in the error)."""

    lo: float | None = None    # None: unbounded below
    hi: float | None = None    # None: unbounded above
    lo_open: bool = False      # lo itself excluded
    hi_open: bool = False      # hi itself excluded
    why: str = ""              # what the bound protects, shown in the error

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is outside the range, e.g. ``must be in [1, 10000] (why)``, or None (None and bools pass:
        their type is the caller's to check)."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        low_bad = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        high_bad = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        if low_bad or high_bad:
            why = f" ({self.why})" if self.why else ""
            what = "a positive integer" if isinstance(value, int) and (self.lo, self.hi) == (1, None) else \
                self.describe()
            return f"must be {what}{why}"
        return None

    def check(self, key: str, value: Any, error: type[Exception] = ValueError) -> None:
        """Raise ``error("KEY=VALUE: must be ...")`` when ``value`` is outside the range."""
        problem = self.problem(value)
        if problem:
            pass  # (an import of vit5_sit: defined in this module)

            raise error(f"{key}={shown(value)}: {problem}")

    def describe(self) -> str:
        lo, hi = _number(self.lo), _number(self.hi)
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {lo}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {hi}"
        return "a finite number"


GUIDANCE = Range(0.0, MAX_GUIDANCE, why="1 = no guidance, 0 = unconditional; SiT uses 1.5-4")


UNIT = Range(0.0, 1.0, why="t: 0 = noise, 1 = data")


STEPS = Range(1, MAX_STEPS, why=f"at most {MAX_STEPS:,}: SiT's best sampler takes 250, and the time grid is "
                                "allocated before sampling")


MAX_CALL_IMAGES = 10_000   # images of one pipeline call, held in memory together; more: sample.py --out X.npz


# ---- from vit5_sit.sampling.call ------------------------------------------------------------------------------


OUTPUT_TYPES = ("pil", "np", "pt", "latent")  # diffusers' output types; None is also taken, as "np" (diffusers')


# ---- from vit5_sit.common.contract ----------------------------------------------------------------------------


MAX_BATCH = 65_536         # images per forward: a larger batch does not fit any accelerator's memory


BATCH = Range(1, MAX_BATCH, why="images per forward")


# ---- from vit5_sit.sampling.call ------------------------------------------------------------------------------


PIPELINE_ARGS: dict[str, Arg] = {
    "class_labels": Arg("object", note="label_ids: class ids (or, in the package, ImageNet names)"),
    "guidance_scale": Arg("float", GUIDANCE),
    "guidance_interval": Arg("list", UNIT),
    "num_inference_steps": Arg("int", STEPS),
    "sampler": Arg("text"),
    "method": Arg("text"),
    "num_images_per_prompt": Arg("int", Range(1, MAX_CALL_IMAGES, why="a call holds its images in memory; for "
                                              "more, sample.py --out FILE.npz writes them in resumable parts")),
    "seed": Arg("object", note="check_seeds: the first seed or one per image, each in [0, 2**32)"),
    "generator": Arg("object", note="draw_seeds: a torch.Generator or one per image"),
    "output_type": Arg("choice", choices=OUTPUT_TYPES),
    "batch_size": Arg("int", BATCH),
    "max_nfe": Arg("int", Range(1, MAX_NFE, why="network evaluations of a batch; adaptive solvers stop at "
                                                "MAX_NFE anyway")),
    "on_step": Arg("object", note="a callable (done, total)"),
    "return_dict": Arg("switch"),
}


# ---- from vit5_sit.common.contract ----------------------------------------------------------------------------


def value_problem(value: Any, entry: Arg) -> str | None:
    """Why a Python argument ``value`` is outside ``entry`` (a pipeline's keyword, a config field), or None."""
    import numbers

    if entry.kind == "int":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return f"expected a whole number, got a {type(value).__name__}"
        value = int(value)
    elif entry.kind == "float":
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return f"expected a number, got a {type(value).__name__}"
        value = float(value)
        if not math.isfinite(value):
            return "must be a finite number"
    elif entry.kind == "switch":
        return None if isinstance(value, bool) else f"expected True or False, got a {type(value).__name__}"
    elif entry.kind == "choice":
        return None if isinstance(value, str) and value in entry.choices else \
            f"choose one of {', '.join(map(str, entry.choices))}"
    elif entry.kind == "list":
        if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
            return f"expected a sequence of numbers, got a {type(value).__name__}"
        for item in value:
            if isinstance(item, bool) or not isinstance(item, numbers.Real) or not math.isfinite(float(item)):
                return f"expected finite numbers, got {item!r}"
            if entry.range is not None and (problem := entry.range.problem(float(item))):
                return f"{problem}, got {item!r}"
        return None
    if entry.range is not None and entry.kind in ("int", "float"):
        return entry.range.problem(value)
    return None


def check_arguments(table: dict[str, Arg], values: dict[str, Any], error: type[Exception] = ValueError,
                    prefix: str = "") -> None:
    """Every argument of ``values`` that ``table`` names (``prefix`` + name: "eval." for a section), by its entry;
    None is 'not given' (the default decides). Raises ``error("NAME=VALUE: must be ...")`` for the first one outside
    its entry."""
    pass  # (an import of vit5_sit: defined in this module)

    for name, value in values.items():
        entry = table.get(prefix + name)
        if entry is not None and value is not None and (problem := value_problem(value, entry)):
            raise error(f"{prefix}{name}={shown(value, quote=isinstance(value, str))}: {problem}")


# ---- from vit5_sit.common.classes -----------------------------------------------------------------------------


class ClassSpecError(ValueError):
    """A class id or name that the model does not have; the message names it and the nearest matches."""


# ---- from vit5_sit.sampling.call ------------------------------------------------------------------------------


def _is_integer(value) -> bool:
    """A whole number as a label or count may be: Python / numpy integers, not bools, floats or anything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


# ---- from vit5_sit.common.classes -----------------------------------------------------------------------------


def check_class_id(class_id: int | str, num_classes: int) -> int:
    """``class_id`` (an int, or a string of ASCII digits) as an int, if the model has that class; else
    ClassSpecError. Huge digit strings are refused without being converted."""
    text = str(class_id)
    if isinstance(class_id, str) and not (text.isascii() and text.isdigit()):  # int('٣') is 3
        raise ClassSpecError(f"class id {text[:18]!r}: expected a whole number in ASCII digits (0-9)")
    i = int(class_id) if len(text) <= 18 else None
    if i is None or not 0 <= i < num_classes:
        shown = text if len(text) <= 18 else f"{text[:8]}...({len(text)} digits)"
        raise ClassSpecError(f"class id {shown} out of range: this model has {num_classes} classes "
                             f"(ids 0-{num_classes - 1})")
    return i


# ---- from vit5_sit.sampling.call ------------------------------------------------------------------------------


def label_ids(labels, num_classes: int, parse_name: Callable[[str, int], list[int]] | None = None) -> list[int]:
    """Class ids from ``labels``: an integer, a sequence of them, or a tensor / array of integers (0-d or 1-d);
    names through ``parse_name(text, num_classes)`` (the package's ImageNet names; None: ids only). Anything else
    (a float, even 1.0, a bool, a float or bool tensor, a nested list, a set) is one ClassSpecError naming it."""
    fix = "give class ids (ImageNet names need the vit5-sit package)" if parse_name is None else \
        "give a class id or an ImageNet class name"
    if isinstance(labels, torch.Tensor | np.ndarray):
        if labels.ndim > 1:
            raise ClassSpecError(f"class_labels of shape {tuple(labels.shape)}: give a flat list of class ids")
        if labels.ndim == 1 and len(labels) > MAX_CALL_IMAGES:
            raise ValueError(f"{len(labels):,} class labels: a call holds at most {MAX_CALL_IMAGES:,} images in "
                             "memory; call it several times, or write them with sample.py --out FILE.npz")
        labels = labels.reshape(-1).tolist()  # floats stay floats and bools bools: refused below
    elif isinstance(labels, str) or _is_integer(labels):
        labels = [labels]
    elif not isinstance(labels, Sequence):
        raise ClassSpecError(f"class_labels of type {type(labels).__name__}: {fix} (a list, or a tensor of "
                             "integers)")
    if len(labels) == 0:
        raise ClassSpecError("class_labels is empty: give at least one class id or name")
    if len(labels) > MAX_CALL_IMAGES:  # before any element is read (a range of 10**12 hung)
        raise ValueError(f"{len(labels):,} class labels: a call holds at most {MAX_CALL_IMAGES:,} images in "
                         "memory; call it several times, or write them with sample.py --out FILE.npz")
    ids = []
    for label in labels:
        if isinstance(label, torch.Tensor | np.ndarray) and label.ndim == 0:
            label = label.item()  # a 0-d integer tensor is its integer; a float or bool one is refused below
        if isinstance(label, str) and parse_name is not None:
            ids += parse_name(label, num_classes)
        elif _is_integer(label):
            ids.append(check_class_id(int(label), num_classes))
        else:
            raise ClassSpecError(f"class label {label!r}: {fix}")
    return ids


# ---- from vit5_sit.transport.rng ------------------------------------------------------------------------------


class SeedError(ValueError):
    """A sample seed that is not a whole number in [0, 2**32); the message names it and the fix."""


SEED_LIMIT = 1 << 32  # sample seeds lie in [0, 2**32), like train.seed (they were once taken modulo 2**32)


def check_seeds(first, count: int = 1, name: str = "seed") -> int:
    """``first`` as an int, after checking that the seeds first .. first + count - 1 are valid sample seeds.

    Image i of a run has seed ``first + i``; every one must lie in [0, 2**32): a larger seed would repeat a
    smaller one's noise, a negative one that of 2**32 - |seed|. ``name`` is the setting as its user writes it
    (``--seed``, ``eval.sample_seed``); raises SeedError.
    """
    if isinstance(first, bool) or not isinstance(first, numbers.Integral):
        raise SeedError(f"{name}={first!r}: expected a whole number >= 0")
    first, last = int(first), int(first) + max(int(count), 1) - 1
    if count > SEED_LIMIT:
        raise SeedError(f"{count} images: more than the {SEED_LIMIT} distinct sample seeds (image i has seed "
                        f"{name} + i); draw at most {SEED_LIMIT} images per run")
    if first < 0 or last >= SEED_LIMIT:
        images = f" (image i has seed {name} + i, for {count} images)" if count > 1 else ""
        raise SeedError(f"{name}={first}: sample seeds must lie in [0, {SEED_LIMIT - 1}]{images}; choose {name} "
                        f"between 0 and {SEED_LIMIT - max(int(count), 1)}")
    return first


# ---- from vit5_sit.sampling.call ------------------------------------------------------------------------------


MAX_SEED = 2**31 - 1  # seeds drawn from a torch.Generator lie in [0, MAX_SEED)


def draw_seeds(n: int, seed, generator) -> list[int]:
    """The seeds of n images: ``seed`` (the first, image i has seed + i; or one per image), else drawn from
    ``generator`` (a list: image i's from generator i), else from torch's global RNG."""
    if seed is not None and generator is not None:
        raise SeedError("give seed or generator, not both: seed fixes every image's seed, generator draws them")
    if seed is not None:
        if isinstance(seed, numbers.Integral):
            first = check_seeds(seed, n)
            return list(range(first, first + n))
        if isinstance(seed, str | bytes) or not isinstance(seed, Sequence | np.ndarray | torch.Tensor):
            raise SeedError(f"seed={seed!r}: give the first seed (an int; image i has seed + i) or one int "
                            "per image")
        if len(seed) != n:  # before any is read: a huge sequence is refused at once
            raise ValueError(f"{len(seed)} seeds for {n} images: give one seed per image, or the first")
        return [check_seeds(s.item() if isinstance(s, torch.Tensor | np.ndarray) else s) for s in seed]
    if generator is None or isinstance(generator, torch.Generator):
        device = "cpu" if generator is None else generator.device
        return [int(s) for s in torch.randint(0, MAX_SEED, (n,), generator=generator, device=device)]
    if isinstance(generator, str | bytes) or not isinstance(generator, Sequence):
        raise SeedError(f"generator of type {type(generator).__name__}: give a torch.Generator, or a list of "
                        "them, one per image")
    if len(generator) != n:
        raise ValueError(f"{len(generator)} generators for {n} images: give one generator per image (or one "
                         "for all)")
    for i, g in enumerate(generator):
        if not isinstance(g, torch.Generator):
            raise SeedError(f"generator[{i}] is a {type(g).__name__}: give a list of torch.Generator, one per "
                            "image")
    # Image i's seed from generator i alone: its image does not depend on the other generators.
    return [int(torch.randint(0, MAX_SEED, (1,), generator=g, device=g.device)) for g in generator]


# ---- from vit5_sit.transport.guidance -------------------------------------------------------------------------


def check_second_guidance(trained: float, scale: float, guide=None) -> None:
    """The one rule for guidance at sampling on a model with guidance trained in (``trained`` != 1, see
    `trained_guidance`): none on top of it, classifier-free (scale != 1) or autoguidance (a guide). Called by
    `vit5_sit.sampling.generate.sample_images`, so sample.py, both pipelines and the web page refuse it alike."""
    if float(trained) == 1.0 or (float(scale) == 1.0 and guide is None):
        return
    asked = f"autoguidance (a guide, weight {float(scale):g})" if guide is not None else f"guidance {float(scale):g}"
    raise GuidanceError(f"{asked} asked of a model with guidance {float(trained):g} trained in (MeanFlow, "
                        f"meanflow.guidance_scale={float(trained):g}): its one pass is already guided, and a second "
                        "guidance only makes the images worse; sample it unguided (--cfg-scale 1, guidance_scale=1, "
                        "no guide)")


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


FIXED_STEP_METHODS = ODE_FIXED  # our own fixed-step solvers: `steps` steps on `grid`, batch-independent


# ---- from vit5_sit.sampling.generate --------------------------------------------------------------------------


def steps_per_batch(sampler: SamplerConfig) -> int | None:
    """Network evaluations of one batch (a guided call counts once); None for adaptive ODE solvers."""
    if sampler.mode == "meanflow":
        return sampler.steps
    if sampler.mode == "ode":
        if sampler.method not in FIXED_STEP_METHODS:
            return None
        return 2 * sampler.steps if sampler.method == "heun" else sampler.steps  # multistep: one call a step
    last = 0 if sampler.last_step == "none" else 1
    return (sampler.steps if sampler.method == "euler" else 2 * sampler.steps) + last


# ---- from vit5_sit.sampling.call ------------------------------------------------------------------------------


class NFELimitError(RuntimeError):
    """A batch needed more network evaluations than ``max_nfe`` allowed (adaptive solvers); it was stopped."""


@dataclasses.dataclass
class CallPlan:
    """A checked call: everything `run_call` needs, decided before any work."""

    labels: list[int]               # one per image
    seeds: list[int]                # one per image
    scale: float                    # guidance weight; 1 = none
    interval: tuple[float, float]   # guidance interval in t
    settings: SamplerConfig         # our sampler (with a diffusers scheduler: ODE Euler, its step count)
    batch_size: int
    max_nfe: int | None
    output_type: str | None
    return_dict: bool
    on_step: Callable[[int, int | None], None] | None = None
    trained_guidance: float = 1.0   # guidance trained into the model (`vit5_sit.transport.guidance`); 1 = none


def plan_call(arguments: dict, *,
              num_classes: int,                  # the model's classes (ids 0 .. num_classes - 1)
              default_scale: float,              # guidance when guidance_scale is None
              default_interval: Sequence[float] = (0.0, 1.0),  # its interval when guidance_interval is None
              sampler: SamplerConfig,            # the model's default sampler
              scheduler=None,                    # a diffusers flow scheduler that replaces our sampler, or None
              parse_name: Callable[[str, int], list[int]] | None = None,  # ImageNet names; None = ids only
              trained_guidance: float = 1.0,     # guidance trained into the model (MeanFlow); 1 = none
              guide=None,                        # autoguidance's guide network, or None
              ) -> CallPlan:
    """Check a call's keyword ``arguments`` (`PIPELINE_ARGS`'s names) and decide everything before any work: one
    ValueError (or subclass) naming the first bad value."""
    a = {name: arguments.get(name) for name in PIPELINE_ARGS}
    check_arguments(PIPELINE_ARGS, a)  # every keyword by its contract, before anything is built
    if a["output_type"] is not None and a["output_type"] not in OUTPUT_TYPES:
        raise ValueError(f"output_type={a['output_type']!r}: choose one of {', '.join(OUTPUT_TYPES)}")
    for name in ("num_images_per_prompt", "batch_size", "return_dict"):  # None is no default here: a mistake
        if a[name] is None:
            raise ValueError(f"{name}=None: {value_problem(None, PIPELINE_ARGS[name])}")
    per_label = int(a["num_images_per_prompt"])
    ids = label_ids(a["class_labels"], num_classes, parse_name)
    if len(ids) * per_label > MAX_CALL_IMAGES:  # before the label list is built (10**12 hung)
        raise ValueError(f"{len(ids)} class label(s) x num_images_per_prompt={per_label:,} = "
                         f"{len(ids) * per_label:,} images: a call holds at most {MAX_CALL_IMAGES:,} in memory; "
                         "call it several times, or write them with sample.py --out FILE.npz")
    labels = [c for c in ids for _ in range(per_label)]
    seeds = draw_seeds(len(labels), a["seed"], a["generator"])
    scale = default_scale if a["guidance_scale"] is None else a["guidance_scale"]
    interval = default_interval if a["guidance_interval"] is None else a["guidance_interval"]
    check_guidance_settings(scale, interval, "guidance_scale", "guidance_interval")
    check_second_guidance(trained_guidance, scale, guide)
    low, high = (float(v) for v in interval)
    if scheduler is not None and (a["sampler"] is not None or a["method"] is not None):
        raise ValueError(f"sampler={a['sampler']!r} / method={a['method']!r}: this pipeline samples with its "
                         f"scheduler ({type(scheduler).__name__}); set pipe.scheduler back to ours to use them")
    try:
        if scheduler is not None:  # its steps, one network evaluation each (counted as ODE Euler)
            steps = sampler.steps if a["num_inference_steps"] is None else a["num_inference_steps"]
            settings = sampler_settings(None, "ode", "euler", steps)
        else:
            settings = sampler_settings(sampler, a["sampler"], a["method"], a["num_inference_steps"])
    except ValueError as e:
        raise ValueError(f"sampler / method / num_inference_steps: {e}") from None
    batch_size = int(a["batch_size"])
    max_nfe = None if a["max_nfe"] is None else int(a["max_nfe"])
    evals = steps_per_batch(settings)  # per batch; None: adaptive, known only once it has run
    if max_nfe is not None and evals is not None and evals > max_nfe:
        raise NFELimitError(f"{settings.mode}/{settings.method} with {settings.steps} steps takes {evals} network "
                            f"evaluations a batch: more than max_nfe={max_nfe}; take fewer steps")
    if a["on_step"] is not None and not callable(a["on_step"]):
        raise ValueError(f"on_step={a['on_step']!r}: give a callable (done, total), or None")
    return CallPlan(labels, seeds, float(scale), (low, high), settings, batch_size, max_nfe, a["output_type"],
                    a["return_dict"], a["on_step"], float(trained_guidance))


# ---- from vit5_sit.sampling.generate --------------------------------------------------------------------------


def _check_batch_size(batch_size) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: must be a whole number >= 1")


class SamplerMismatch(ValueError):
    """A MeanFlow model asked for a flow sampler, or a flow model for the MeanFlow one."""


def check_model_sampler(model_cfg, sampler: SamplerConfig, scheduler=None) -> None:
    """The one rule between a model and its sampler: a MeanFlow model (``model_cfg.mean_flow``) samples with
    mode 'meanflow' (its average-velocity steps) and nothing else; a flow model with anything but it."""
    mean_flow = bool(getattr(model_cfg, "mean_flow", False))
    if mean_flow and (sampler.mode != "meanflow" or scheduler is not None):
        asked = "a diffusers scheduler" if scheduler is not None else f"the {sampler.mode} sampler"
        raise SamplerMismatch(
            f"{asked} was asked of a MeanFlow model, which predicts average velocities and samples with its own "
            "steps: use --sampler meanflow (sampler.mode=meanflow), 1 step by default, --steps k for k")
    if not mean_flow and sampler.mode == "meanflow":
        raise SamplerMismatch(
            "the meanflow sampler was asked of a flow model (trained with train.objective=flow, no interval "
            "input): use an ODE or SDE sampler (--sampler ode / sde), or a model trained with "
            "train.objective=meanflow")


class HalfPrecisionCalls:
    """A model with bfloat16 / float16 weights as the float32 solvers call it: x cast to the weights' dtype, the
    prediction back to float32 (t and the labels go in as they are: the embedders cast them). The solver state
    stays float32; ``cfg`` and ``null_label`` are the model's, for guidance."""

    def __init__(self, model: Denoiser) -> None:
        self.model, self.cfg, self.null_label = model, model.cfg, model.null_label
        self.dtype = next(model.parameters()).dtype

    def __call__(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, **kw) -> torch.Tensor:
        return self.model(x.to(self.dtype), t, y, **kw).float()


# ---- from vit5_sit.transport.meanflow -------------------------------------------------------------------------


def guidance_inputs(n: int, scale: float | torch.Tensor = 1.0, interval: tuple[float, float] = (0.0, 1.0),
                    device: torch.device | str | None = None) -> torch.Tensor:
    """(n, 3): the guidance inputs (scale w, low, high) of an iMF network (``Denoiser(..., guidance=)``): w acts
    for t in [low, high] (our t: 0 = noise, 1 = data); w = 1 is no guidance. ``scale``: a number or (n,)."""
    w = torch.as_tensor(scale, dtype=torch.float32, device=device).expand(n)
    lo = torch.full((n,), float(interval[0]), device=device)
    return torch.stack([w, lo, torch.full_like(lo, float(interval[1]))], dim=1)


def with_guidance(model, scale: float, guidance_interval: tuple[float, float] = (0.0, 1.0)):
    """An iMF network (``cfg.guidance_input``) as `meanflow_sample`'s ``model_fn``, guided at sampling time: each
    call passes the guidance inputs (``scale``, acting for t in ``guidance_interval``, our t) to the network, one
    pass per step and no unconditional pass. Scale 1 is the unguided model."""
    def model_fn(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, interval: torch.Tensor | None = None):
        guidance = guidance_inputs(x.shape[0], scale, guidance_interval, device=x.device)
        return model(x, t, y, interval=interval, guidance=guidance)
    return model_fn


# ---- from vit5_sit.transport.guidance -------------------------------------------------------------------------


GUIDE_FIELDS = (("in_channels", "data channels"), ("input_size", "data size"), ("num_classes", "classes"),
                ("mean_flow", "kind (MeanFlow: average velocities)"))


GUIDE_TRANSPORT_FIELDS = (("path", "transport path"), ("prediction", "prediction"))


def guide_problem(main_cfg, guide_cfg, main_transport=None, guide_transport=None) -> str | None:
    """Why ``guide_cfg`` (a ModelConfig) cannot guide a model of ``main_cfg``, or None. The transports
    (TransportConfig; None = not known, e.g. an official file: SiT's linear velocity) are compared when both are
    given: a guide that predicts another quantity, or on another path, would be mixed with the wrong one."""
    for name, what in GUIDE_FIELDS:
        a, b = getattr(main_cfg, name), getattr(guide_cfg, name)
        if a != b:
            return f"its {what} {name}={b!r} differs from the model's {name}={a!r}"
    if main_transport is not None and guide_transport is not None:
        for name, what in GUIDE_TRANSPORT_FIELDS:
            a, b = getattr(main_transport, name), getattr(guide_transport, name)
            if a != b:
                return f"its {what} {name}={b!r} differs from the model's {name}={a!r}"
    return None


def check_guide(main_cfg, guide_cfg, main_transport=None, guide_transport=None) -> None:
    """One GuidanceError naming the first difference between a guide and the main model (`guide_problem`)."""
    problem = guide_problem(main_cfg, guide_cfg, main_transport, guide_transport)
    if problem is not None:
        raise GuidanceError(f"the guide cannot guide this model: {problem}; take a guide trained on the same data and "
                            "classes with the same objective (e.g. an early checkpoint of the same run)")


class AutoGuidance:
    """Autoguidance (Karras et al. 2024): out = guide + scale * (model - guide), the guide a bad version of the
    model (an early checkpoint of the same run, or a smaller model trained on the same data), both conditional.

    The combination is affine with weights summing to 1, so mixing velocities is mixing denoised images (and, for a
    MeanFlow model, average velocities). scale 1 = the model alone, 0 = the guide alone. interval: guide only the
    samples whose t is in [low, high]; the others get the model's output, and the guide runs only on the guided ones.
    """

    def __init__(
        self,
        model,                      # the main network: (x, t, y) -> prediction
        guide,                      # the guide network, same signature and prediction
        scale: float,               # the weight w; 1 = the model alone
        interval=(0.0, 1.0),        # (low, high) in t: guide where low <= t <= high
    ):
        check_guidance_settings(scale, interval)
        main_cfg, guide_cfg = getattr(model, "cfg", None), getattr(guide, "cfg", None)
        if main_cfg is not None and guide_cfg is not None:
            check_guide(main_cfg, guide_cfg)
        low, high = interval
        self.model, self.guide, self.scale = model, guide, float(scale)
        self.low, self.high = float(low), float(high)
        self.cfg, self.null_label = main_cfg, getattr(model, "null_label", None)

    def __call__(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                 interval: torch.Tensor | None = None) -> torch.Tensor:
        """interval: a MeanFlow model's interval lengths (B,), passed to both networks (None: flow models)."""
        kw = {} if interval is None else {"interval": interval}
        out = self.model(x, t, y, **kw)
        guided = (t >= self.low) & (t <= self.high)  # (B,)
        if self.scale == 1.0 or not bool(guided.any()):
            return out
        if interval is not None:
            kw = {"interval": interval[guided]}
        bad = self.guide(x[guided], t[guided], y[guided], **kw)
        mixed = out.clone()
        mixed[guided] = bad + self.scale * (out[guided] - bad)
        return mixed


def check_guidance(scale: float, class_dropout_prob: float | None) -> None:
    """Guidance (scale != 1) needs the null label, which a model has only if it was built with label dropout
    (class_dropout_prob > 0 adds the null row). None: not known (not one of our models), not checked."""
    if float(scale) != 1.0 and class_dropout_prob == 0:
        raise GuidanceError(
            f"cfg_scale={float(scale):g} needs the null (unconditional) label, but the model was built with "
            "class_dropout_prob=0 and has none; use cfg_scale=1 (no guidance) or train with class_dropout_prob > 0")


class ClassifierFreeGuidance:
    """out = uncond + scale * (cond - uncond), conditional and unconditional in one batched forward.

    interval: guide only samples whose t is in [low, high] (elementwise); the others get the
        conditional output, and the unconditional half is computed only for the guided samples.
    channels: None guides every channel; an int n guides only the first n channels and leaves the
        rest conditional, as the official SiT/DiT code does (n = 3 on 4-channel latents): an opt-in
        for reproducing official numbers only.
    """

    def __init__(
        self,
        model,                      # the network: (x, t, y) -> prediction
        scale: float,               # 1 = conditional model, 0 = unconditional
        null_class: int | None = None,  # the unconditional label; None = the network's null_label
        interval=(0.0, 1.0),        # (low, high) in t: guide where low <= t <= high
        channels: int | None = None,  # None = all channels; n = only the first n (official SiT: 3)
    ):
        check_guidance_settings(scale, interval)
        check_guidance(scale, getattr(getattr(model, "cfg", None), "class_dropout_prob", None))
        low, high = interval
        if channels is not None and channels < 1:
            raise ValueError(f"ClassifierFreeGuidance: channels={channels!r} must be None (all) or >= 1")
        if null_class is None:
            null_class = getattr(model, "null_label", None)
            if null_class is None:
                raise ValueError("ClassifierFreeGuidance: pass null_class (the model has no null_label)")
        self.model, self.scale, self.null_class = model, float(scale), int(null_class)
        self.low, self.high, self.channels = float(low), float(high), channels

    def __call__(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                 interval: torch.Tensor | None = None) -> torch.Tensor:
        """interval: a MeanFlow model's interval lengths (B,), passed on (None: a flow model's call)."""
        kw = {} if interval is None else {"interval": interval}
        guided = (t >= self.low) & (t <= self.high)  # (B,)
        if self.scale == 1.0 or not bool(guided.any()):
            return self.model(x, t, y, **kw)
        n = x.shape[0]
        # Conditional batch, then the unconditional copies of the guided samples, in one forward.
        null = torch.full_like(y[guided], self.null_class)
        if interval is not None:
            kw = {"interval": torch.cat([interval, interval[guided]])}
        out = self.model(torch.cat([x, x[guided]]), torch.cat([t, t[guided]]), torch.cat([y, null]), **kw)
        cond, uncond = out[:n], out[n:]
        c = slice(None) if self.channels is None else slice(0, self.channels)
        mixed = cond.clone()
        mixed[guided, c] = uncond[:, c] + self.scale * (cond[guided, c] - uncond[:, c])
        return mixed


# ---- from vit5_sit.data.vae -----------------------------------------------------------------------------------


DEFAULT_VAE = "stabilityai/sd-vae-ft-ema"


class VAELoadError(OSError):
    """The VAE could not be loaded; the message says why and what to do."""


def looks_like_path(name: str) -> bool:
    """Hub ids are 'name' or 'org/name'; anything else that is not a folder is a mistyped path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


TRUE_STRINGS = ("1", "true", "yes", "on")


def hub_offline_by_env() -> bool:
    """True if the environment declares Hugging Face offline mode (HF_HUB_OFFLINE=1)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_STRINGS


# ---- from vit5_sit.common.utils -------------------------------------------------------------------------------


NETWORK_PROBE_TIMEOUT_S = 3.0  # one TCP connect decides "offline" (DNS included), instead of long retries


def host_reachable(url: str, timeout: float = NETWORK_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the URL's host and port (default: 443 for https, else 80) opens within
    `timeout` seconds, DNS lookup included."""
    parsed = urlparse(url if "://" in url else f"https://{url}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    ok = []

    def probe():
        try:
            socket.create_connection((parsed.hostname, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)  # daemon: a stuck DNS lookup cannot keep us waiting
    thread.start()
    thread.join(timeout)
    return bool(ok)


# ---- from vit5_sit.data.vae -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether one TCP connection to the hub endpoint (HF_ENDPOINT or huggingface.co) succeeds."""
    return host_reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))


def load_vae(
    name_or_path: str = DEFAULT_VAE,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    subfolder: str | None = None,  # e.g. 'vae' to take the VAE out of a full pipeline repo
):
    """Load an ``AutoencoderKL`` from a local folder, the Hugging Face cache, or (if online) the hub.

    Never waits on network retries: local folders and cached models load with ``local_files_only``;
    an uncached hub name fails at once with a ``VAELoadError`` when HF_HUB_OFFLINE=1 is set or the hub
    is unreachable. Returns the model in eval mode with gradients off.
    """
    from diffusers import AutoencoderKL

    def load(source: str, **kwargs):
        if subfolder is not None:
            kwargs["subfolder"] = subfolder
        with warnings.catch_warnings():  # diffusers passes a deprecated argument to huggingface_hub
            warnings.filterwarnings("ignore", message=".*local_dir_use_symlinks.*")
            return AutoencoderKL.from_pretrained(source, torch_dtype=dtype, **kwargs)

    path = Path(name_or_path).expanduser()
    if path.is_dir():
        try:
            vae = load(str(path), local_files_only=True)
        except Exception as e:
            raise VAELoadError(
                f"could not load VAE from folder {str(path)!r} (expected a config.json and weights written "
                f"by AutoencoderKL.save_pretrained): {e}"
            ) from e
    elif looks_like_path(name_or_path):
        raise VAELoadError(f"could not load VAE {name_or_path!r}: no such folder")
    else:
        try:
            vae = load(name_or_path, local_files_only=True)  # the cache first: no network if it is there
        except OSError as cache_miss:
            offline = hub_offline_by_env() or not hub_reachable()
            if offline:
                from huggingface_hub import constants

                why = "HF_HUB_OFFLINE=1" if hub_offline_by_env() else f"{constants.ENDPOINT} unreachable"
                raise VAELoadError(
                    f"could not load VAE {name_or_path!r}: offline ({why}) and not in the Hugging Face cache "
                    f"({constants.HF_HUB_CACHE}). Download it on a connected machine with "
                    f"`hf download {name_or_path}` (older hub versions: `huggingface-cli download`) "
                    "and copy the cache folder here (or point HF_HOME at it), or pass a local folder "
                    "written by AutoencoderKL.save_pretrained"
                ) from cache_miss
            try:
                vae = load(name_or_path)
            except Exception as e:
                raise VAELoadError(f"could not load VAE {name_or_path!r} from the hub: {e}") from e
    return vae.to(device).eval().requires_grad_(False)


# ---- from vit5_sit.transport.rng ------------------------------------------------------------------------------


class StackedRandomGenerator:
    """One torch.Generator per sample (after edm2's StackedRandomGenerator).

    `randn(shape)` draws one tensor of `shape` (without the batch dim) from each generator and stacks
    them: (len(seeds), *shape). The same seed with the same dtype and device gives the same values.
    """

    def __init__(self, seeds, device="cpu"):
        self.device = torch.device(device)
        self.generators = [torch.Generator(self.device).manual_seed(check_seeds(s)) for s in seeds]

    def __len__(self) -> int:
        return len(self.generators)

    def randn(self, shape, dtype=torch.float32) -> torch.Tensor:
        shape = tuple(shape)
        return torch.stack(
            [torch.randn(shape, generator=g, dtype=dtype, device=self.device) for g in self.generators]
        )

    def randn_like(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != len(self.generators):
            raise ValueError(
                f"StackedRandomGenerator has {len(self.generators)} seeds but the batch has "
                f"{x.shape[0]} samples: make one generator per batch from that batch's seeds"
            )
        return self.randn(x.shape[1:], dtype=x.dtype).to(x.device)

    def rademacher_like(self, x: torch.Tensor) -> torch.Tensor:
        """Random signs +-1, like x (for Hutchinson's trace estimator)."""
        return torch.where(self.randn_like(x) >= 0, 1.0, -1.0).to(x.dtype)


# ---- from vit5_sit.transport.diffusers_schedulers -------------------------------------------------------------


class SchedulerError(ValueError):
    """A scheduler that cannot serve this model; the message names it and the fix."""


FLOW_MODE_SCHEDULERS = ("DPMSolverMultistepScheduler", "UniPCMultistepScheduler")  # need flow sigmas


SCHEDULER_FIELDS: dict[str, Range] = {
    "num_train_timesteps": Range(2, 10**7, why="its sigmas come from a grid of that many training steps; "
                                                  "diffusers' flow schedulers use 1000"),
    "shift": Range(0.0, 1e3, lo_open=True, why="SD3's time shift; 1 = none"),
    "flow_shift": Range(0.0, 1e3, lo_open=True, why="SD3's time shift; 1 = none"),
}


def check_scheduler(scheduler, transport: Transport) -> None:
    """Refuse, in one line, a scheduler that cannot drive this model."""
    name = type(scheduler).__name__
    if transport.cfg.path != "linear":
        raise SchedulerError(f"{name} integrates x = (1 - s) data + s noise (the linear path); this model's path is "
                             f"{transport.cfg.path!r}: use our solvers instead (method='dpm++2m')")
    if not all(hasattr(scheduler, a) for a in ("set_timesteps", "step", "timesteps")):
        raise SchedulerError(f"{name} is not a diffusers scheduler (no set_timesteps / step)")
    config = getattr(scheduler, "config", {})
    if name in FLOW_MODE_SCHEDULERS and not (config.get("use_flow_sigmas")
                                             and config.get("prediction_type") == "flow_prediction"):
        raise SchedulerError(f"{name} is not in its flow mode: build it with use_flow_sigmas=True, "
                             "prediction_type='flow_prediction'")
    if name not in (*FLOW_MODE_SCHEDULERS, "FlowMatchEulerDiscreteScheduler") and "flow" not in name.lower():
        raise SchedulerError(f"{name} is not a flow-matching scheduler: use FlowMatchEulerDiscreteScheduler, or "
                             "DPMSolverMultistepScheduler / UniPCMultistepScheduler with use_flow_sigmas=True")
    for key, bound in SCHEDULER_FIELDS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise SchedulerError(f"{name}'s {key}={value!r}: expected a number {bound.describe()}")
        if key == "num_train_timesteps" and not float(value).is_integer():
            raise SchedulerError(f"{name}'s {key}={value!r}: expected a whole number")
        if (problem := bound.problem(value)) is not None:
            raise SchedulerError(f"{name}'s {key}={value!r}: {problem}; build it again with another {key}")
    if config.get("use_dynamic_shifting"):
        raise SchedulerError(f"{name} has use_dynamic_shifting=True, which takes its shift from an image sequence "
                             "length that class-conditional models do not have; build it with use_dynamic_shifting="
                             "False and a fixed shift")
    if config.get("stochastic_sampling") or str(config.get("algorithm_type", "")).startswith("sde"):
        raise SchedulerError(f"{name} is configured to sample stochastically, which cannot be seeded per sample; "
                             "use its deterministic variant")


def sample_with_scheduler(model_fn, noise: torch.Tensor, y, transport: Transport, scheduler,
                          steps: int) -> SampleResult:
    """Integrate `noise` (t = 0) to data with a diffusers flow scheduler in ``steps`` steps (steps NFE)."""
    check_scheduler(scheduler, transport)
    scheduler.set_timesteps(steps, device=noise.device)
    sigmas = scheduler.sigmas.to(torch.float64).cpu()
    if not bool(torch.isfinite(sigmas).all()) or float(sigmas.min()) < 0 or float(sigmas.max()) > 1:
        raise SchedulerError(f"{type(scheduler).__name__} gave sigmas outside [0, 1] ({float(sigmas.min()):g} to "
                             f"{float(sigmas.max()):g}): times outside the path; check its shift and sigma settings")
    t_lo, t_hi = transport.interval()  # velocity models: [0, 1]; score / noise ones stop short of the ends
    x, calls = noise, 0
    with torch.no_grad():
        for i, timestep in enumerate(scheduler.timesteps):
            # Their sigma is our 1 - t; their model output is noise - data = -velocity.
            t = torch.full((x.shape[0],), min(max(1.0 - sigmas[i].item(), t_lo), t_hi), dtype=x.dtype,
                           device=x.device)
            velocity = transport.velocity(model_fn(x, t, y), x, t)
            calls += 1
            x = scheduler.step(-velocity, timestep, x, return_dict=False)[0]
    return SampleResult(x, calls)


# ---- from vit5_sit.data.vae -----------------------------------------------------------------------------------


SD_VAE_SCALING_FACTOR = 0.18215  # the SD VAEs' config.scaling_factor; used only if a config has none


def latent_scaling(vae) -> tuple[float, float]:
    """(scaling_factor, shift_factor) from the VAE config: latents = (z - shift) * scale."""
    scale = getattr(vae.config, "scaling_factor", None)
    shift = getattr(vae.config, "shift_factor", None)
    return float(SD_VAE_SCALING_FACTOR if scale is None else scale), float(0.0 if shift is None else shift)


@torch.no_grad()
def decode(vae, latents: torch.Tensor) -> torch.Tensor:
    """Scaled latents (B, C, h, w) -> images (B, 3, H, W) float32 in [-1, 1]."""
    scale, shift = latent_scaling(vae)
    z = latents.float() / scale + shift
    return vae.decode(z.to(device=vae.device, dtype=vae.dtype)).sample.float().clamp(-1, 1).to(latents.device)


# ---- from vit5_sit.sampling.generate --------------------------------------------------------------------------


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """(N, C, H, W) in [-1, 1] -> (N, H, W, 3) uint8; one-channel images are repeated to RGB."""
    x = ((x.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    return x.permute(0, 2, 3, 1).cpu().numpy()


@torch.no_grad()
def sample_images(model: Denoiser, transport: Transport, sampler: SamplerConfig, classes: Sequence[int],
                  seeds: Sequence[int], *,
                  cfg_scale: float = 1.0,                    # classifier-free guidance; 1 = none
                  guidance_interval: tuple[float, float] = (0.0, 1.0),  # guide only for t in this range
                  guide_channels: int | None = None,         # None = all; 3 = official SiT behaviour
                  vae=None,                                  # None (pixel model), name/path, or loaded VAE
                  image_size: int | None = None,             # model input size; None = trained size
                  batch_size: int = 64,
                  device: torch.device | str = "cpu",
                  on_batch: Callable[[int], None] | None = None,  # called with each batch's image count
                  on_step: Callable[[], None] | None = None,  # called after each network evaluation
                  as_float: bool = False,  # True: (N, C, H, W) float32 in [-1, 1] as decoded, not quantised
                  scheduler=None,  # a diffusers flow scheduler instead of `sampler` (sampler.steps steps)
                  guide: Denoiser | None = None,  # autoguidance: cfg_scale weighs the model against this guide
                  trained_guidance: float = 1.0,  # guidance trained into the model (`guidance.trained_guidance`)
                  ) -> np.ndarray | torch.Tensor:
    """Sample one image per (class, seed) pair; returns uint8 (N, H, W, 3), or the float images.

    Guidance: with ``guide`` None, cfg_scale != 1 is classifier-free guidance (the model's null label); with a
    guide, it is autoguidance, guide + cfg_scale * (model - guide) (`vit5_sit.transport.AutoGuidance`), in both
    cases only for t in ``guidance_interval``."""
    if len(classes) != len(seeds):
        raise ValueError(f"{len(classes)} classes but {len(seeds)} seeds: give one seed per image")
    if len(classes) == 0:
        raise ValueError("no images to sample: give at least one class label")
    _check_batch_size(batch_size)
    check_model_sampler(model.cfg, sampler, scheduler)
    check_second_guidance(trained_guidance, cfg_scale, guide)
    for s in seeds:  # all of them before the first batch, not at the batch that holds a bad one
        check_seeds(s)
    device = torch.device(device)
    cfg = model.cfg
    size = image_size or cfg.input_size
    model = model.to(device).eval()
    net = model if next(model.parameters()).dtype == torch.float32 else HalfPrecisionCalls(model)
    if getattr(cfg, "guidance_input", False):  # iMF: scale and interval are the network's inputs, one pass a step
        if guide is not None or guide_channels is not None:
            raise GuidanceError("an improved-MeanFlow model takes its guidance scale and interval as network inputs: "
                                "choose them with the guidance scale and interval, without a guide or guide_channels")
        pass  # (an import of vit5_sit: defined in this module)

        net = with_guidance(net, cfg_scale, tuple(guidance_interval))
    elif guide is not None:
        if guide_channels is not None:
            raise GuidanceError(f"guide_channels={guide_channels}: the official scripts' channel subset is for "
                                "classifier-free guidance only; leave it out with a guide")
        check_guide(cfg, guide.cfg)
        guide = guide.to(device).eval()
        guide_net = guide if next(guide.parameters()).dtype == torch.float32 else HalfPrecisionCalls(guide)
        net = AutoGuidance(net, guide_net, cfg_scale, interval=guidance_interval)
    elif cfg_scale != 1.0:
        net = ClassifierFreeGuidance(net, cfg_scale, null_class=cfg.null_label, interval=guidance_interval,
                                     channels=guide_channels)
    if on_step is not None:
        guided = net

        def net(x_t, t, y, **kw):
            out = guided(x_t, t, y, **kw)
            on_step()
            return out
    if isinstance(vae, str | Path):
        pass  # (an import of vit5_sit: defined in this module)

        vae = load_vae(str(vae), device=device)
    out = []
    for lo in range(0, len(seeds), batch_size):
        batch_seeds = list(seeds[lo:lo + batch_size])
        rng = StackedRandomGenerator(batch_seeds, device)
        noise = rng.randn((cfg.in_channels, size, size))  # x0, at t = 0
        y = torch.as_tensor(list(classes[lo:lo + batch_size]), device=device, dtype=torch.long)
        if scheduler is not None:
            pass  # (an import of vit5_sit: defined in this module)

            x1 = sample_with_scheduler(net, noise, y, transport, scheduler, sampler.steps).samples
        else:
            x1 = sample(net, noise, y, transport, sampler, rng=rng).samples  # the model's data space, at t = 1
        images = x1
        if vae is not None:
            pass  # (an import of vit5_sit: defined in this module)

            images = decode(vae, x1)
        out.append(images.float().cpu() if as_float else to_uint8(images))
        if on_batch is not None:
            on_batch(len(batch_seeds))
    return torch.cat(out) if as_float else np.concatenate(out)


# ---- from vit5_sit.sampling.call ------------------------------------------------------------------------------


def convert_images(x: torch.Tensor, output_type: str | None):
    """(N, C, H, W) in [-1, 1] -> what diffusers' ``output_type`` names: "pil" PIL images (RGB, exactly
    sample.py's pixels), "np" (N, H, W, 3) / "pt" (N, 3, H, W) floats in [0, 1]; None is "np", as in diffusers.
    One-channel images are RGB in all three (the grey channel repeated), so the types agree in shape."""
    if output_type == "pil":
        from PIL import Image

        pass  # (an import of vit5_sit: defined in this module)

        return [Image.fromarray(a) for a in to_uint8(x)]
    x = ((x + 1) / 2).clamp(0, 1)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    return x.permute(0, 2, 3, 1).numpy() if output_type in ("np", None) else x


@dataclasses.dataclass
class Vit5SitPipelineOutput:
    """Like diffusers' ``ImagePipelineOutput``: ``images``, plus the labels and seeds that made them.

    Read as diffusers' ``BaseOutput`` is: ``out.images``, ``out["images"]``, ``out[0]`` (the images, as in
    ``DiTPipeline``), ``out.to_tuple()`` == ``(images, class_labels, seeds)``, ``images, labels, seeds = out``.
    """

    images: list | np.ndarray | torch.Tensor  # PIL images; np (N, H, W, C) / pt (N, C, H, W) floats in [0, 1]
    class_labels: list[int]
    seeds: list[int]

    def to_tuple(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]

    def __getitem__(self, key: int | slice | str):
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(f"{key!r}: the output has {', '.join(self.keys())}")
            return getattr(self, key)
        return self.to_tuple()[key]

    def __iter__(self):
        return iter(self.to_tuple())

    def __len__(self) -> int:
        return len(self.keys())


def run_call(plan: CallPlan, model, transport, *,
             progress_bar: Callable,            # progress_bar(total=...) -> a tqdm-like bar; total None: not known
             vae=None,                          # latent models: the VAE that decodes (None: pixels, or "latent")
             device: torch.device | str = "cpu",
             scheduler=None,                    # a diffusers flow scheduler, or None for our sampler
             **sampling,                        # more keywords of sample_images (e.g. guide=)
             ) -> Vit5SitPipelineOutput | tuple:
    """Sample a planned call (`plan_call`); the bar counts whole sampler steps over all batches (Heun's two
    evaluations: one step; with guidance a step is still one), or network evaluations for adaptive solvers."""
    settings, labels, batch_size = plan.settings, plan.labels, plan.batch_size
    evals = steps_per_batch(settings)
    batches = -(-len(labels) // batch_size)
    steps = settings.steps + (settings.mode == "sde" and settings.last_step != "none")
    count = {"done": 0, "batch": 0, "in_batch": 0}

    def step() -> None:
        count["done"] += 1
        count["in_batch"] += 1
        bar.update(count["done"] * steps // evals - bar.n if evals else 1)
        if plan.on_step is not None:
            plan.on_step(count["done"], evals * batches if evals else None)
        if plan.max_nfe is not None and count["in_batch"] > plan.max_nfe:
            size = min(batch_size, len(labels) - count["batch"] * batch_size)
            raise NFELimitError(f"{settings.mode}/{settings.method} took more than max_nfe={plan.max_nfe} network "
                                f"evaluations on a batch of {size} images and was stopped; allow more, or use a "
                                "fixed-step method")

    def batch_done(_images: int) -> None:
        count["batch"] += 1
        count["in_batch"] = 0

    with progress_bar(total=steps * batches if evals else None) as bar:
        x = sample_images(model, transport, settings, labels, plan.seeds, cfg_scale=plan.scale,
                          guidance_interval=plan.interval, batch_size=batch_size,
                          vae=None if plan.output_type == "latent" else vae, device=device, on_batch=batch_done,
                          on_step=step, as_float=True, scheduler=scheduler,
                          trained_guidance=plan.trained_guidance, **sampling)
    images = x if plan.output_type == "latent" else convert_images(x, plan.output_type)  # latent: the model's space
    out = Vit5SitPipelineOutput(images, labels, plan.seeds)
    return out if plan.return_dict else out.to_tuple()


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


class Vit5SitDiffusersPipeline(DiffusionPipeline):
    """Class-conditional generation with a vit5-sit model folder, loaded by diffusers alone.

    ``pipe(class_labels, guidance_scale=None, num_inference_steps=None, seed=None, generator=None, ...)``: the call
    of `vit5_sit.pipeline.Vit5SitPipeline` (`vit5_sit.sampling.call`: the same contract, checks and images; class
    ids only, since ImageNet names need the package). ``guidance_scale`` and ``guidance_interval`` None = the
    model's (``model_index.json``).
    With a ``guide`` component (a second transformer: a bad version of the model), guidance_scale weighs the model
    against it (autoguidance) instead of against its unconditional output. ``pipe.scheduler`` may be swapped for a
    diffusers flow scheduler (``FlowMatchEulerDiscreteScheduler``, ``DPMSolverMultistepScheduler`` in its flow
    mode), at load (``scheduler=``) too: our scheduler's transport and default steps then serve it.
    ``save_pretrained`` writes a folder that loads again (its code files and ``model_index.json`` included)."""

    model_cpu_offload_seq = "transformer->guide->vae"
    _optional_components = ["vae", "guide"]

    def __init__(self, transformer: ModelMixin, scheduler: SchedulerMixin, vae: ModelMixin | None = None,
                 guide: ModelMixin | None = None, guidance_scale: float = 1.0, trained_guidance: float = 1.0,
                 sampling: dict | None = None, guidance_interval: Sequence[float] = (0.0, 1.0)) -> None:
        super().__init__()
        for module in (vae, guide):  # frozen as our loaders leave them: CPU convolutions of weights that need no
            if module is not None:   # grad round differently, and the images must be the same
                module.requires_grad_(False)
        self.register_modules(transformer=transformer, scheduler=scheduler, vae=vae, guide=guide)
        check_guidance_settings(guidance_scale, guidance_interval, "model_index.json guidance_scale",
                                "model_index.json guidance_interval")  # a folder edited by hand: refused at load
        self.register_to_config(guidance_scale=guidance_scale, guidance_interval=[float(v) for v in guidance_interval],
                                trained_guidance=trained_guidance)
        if sampling is not None:  # our scheduler's config, kept when a diffusers scheduler replaced it
            self.register_to_config(sampling=sampling)

    def __setattr__(self, name, value) -> None:
        current = self.__dict__.get(name)
        if name == "scheduler" and _is_own_scheduler(current) and not _is_own_scheduler(value):
            self.__dict__["_own_scheduler"] = current  # its transport and default steps serve the new one
        super().__setattr__(name, value)

    def own_scheduler(self):
        """Our scheduler (`Vit5SitScheduler`): ``pipe.scheduler``, or the one a diffusers scheduler replaced (after
        loading, or at load with ``scheduler=``: read from the folder's ``scheduler/``, or from the ``sampling``
        that ``save_pretrained`` recorded beside another scheduler)."""
        for candidate in (self.scheduler, self.__dict__.get("_own_scheduler")):
            if _is_own_scheduler(candidate):
                return candidate
        config = self.config.get("sampling")
        folder = self.config.get("_name_or_path")
        if config is None and folder:
            try:
                config = Vit5SitScheduler.load_config(folder, subfolder="scheduler")
            except (OSError, ValueError):
                config = None
            if config is not None and config.get("_class_name") != Vit5SitScheduler.__name__:
                config = None
        if config is None:
            raise ValueError(f"pipe.scheduler is {type(self.scheduler).__name__}, and this pipeline does not know "
                             "its model's transport and default sampler (Vit5SitScheduler): load the model folder "
                             "with its own scheduler, then set pipe.scheduler")
        self.__dict__["_own_scheduler"] = Vit5SitScheduler.from_config(config)
        return self.__dict__["_own_scheduler"]

    def progress_bar(self, iterable=None, total=None):
        """diffusers' bar; for adaptive solvers (``total`` None: their number of steps is not known ahead) a bar
        that counts network evaluations."""
        if iterable is None and total is None:
            from tqdm.auto import tqdm

            return tqdm(total=None, unit="eval", **getattr(self, "_progress_bar_config", {}))
        return super().progress_bar(iterable=iterable, total=total)

    def enable_model_cpu_offload(self, *args, **kwargs) -> None:
        """diffusers' CPU offload, which needs accelerate: without it, one ImportError naming the install."""
        require_accelerate("enable_model_cpu_offload")
        return super().enable_model_cpu_offload(*args, **kwargs)

    def save_pretrained(self, save_directory, **kwargs) -> None:
        """diffusers' save, then what makes the folder load again with ``trust_remote_code=True``: the code files of
        the pipeline and of our components, named in ``model_index.json``."""
        if not _is_own_scheduler(self.scheduler):  # keep our scheduler's config beside the diffusers one
            own = self.own_scheduler()
            self.register_to_config(sampling={k: v for k, v in own.config.items() if not k.startswith("_")})
        super().save_pretrained(save_directory, **kwargs)
        write_own_code(self, save_directory)

    @torch.no_grad()
    def __call__(self, class_labels: int | Sequence[int], *,
                 guidance_scale: float | None = None,             # 1 = none; None = the model's default
                 guidance_interval: tuple[float, float] | None = None,  # guide only for t in this range; None =
                                                                  # the model's (model_index.json)
                 num_inference_steps: int | None = None,          # fixed-step methods; None = the scheduler's
                 sampler: str | None = None,                      # 'ode' | 'sde'; None = the scheduler's
                 method: str | None = None,                       # 'euler', 'heun', 'dpm++2m', 'dopri5', ...
                 num_images_per_prompt: int = 1,                  # images per class label, one after another
                 seed: int | Sequence[int] | None = None,         # first seed (image i: seed + i), or one each
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,  # draws the seeds
                 output_type: str | None = "pil",                 # 'pil' | 'np' | 'pt' | 'latent' (None = 'np')
                 batch_size: int = 64,                            # images per forward; does not change them
                 max_nfe: int | None = None,                      # network evaluations a batch may take
                 on_step=None,                                    # (done, total) after each network evaluation
                 return_dict: bool = True,
                 ):
        """``num_images_per_prompt`` images per class label; ``return_dict=False``: (images, labels, seeds)."""
        arguments = dict(locals())
        own = self.own_scheduler()
        other = None if self.scheduler is own else self.scheduler  # a diffusers flow scheduler
        plan = plan_call(arguments, num_classes=self.transformer.cfg.num_classes,
                         default_scale=self.config.guidance_scale,
                         default_interval=self.config.guidance_interval, sampler=own.sampler,
                         scheduler=other,
                         trained_guidance=self.config.trained_guidance, guide=self.guide)
        out = run_call(plan, self.transformer, own.transport, progress_bar=self.progress_bar, vae=self.vae,
                       device=self._execution_device, scheduler=other, guide=self.guide)
        self.maybe_free_model_hooks()
        return out


# ---- from vit5_sit.models.layers ------------------------------------------------------------------------------


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, T, D) by a strided convolution (`x_embedder.proj`, as timm's PatchEmbed)."""

    def __init__(self, patch_size: int, in_channels: int, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, hidden_size, kernel_size=patch_size, stride=patch_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


TIMESTEP_FREQ_DIM = 256         # sinusoidal frequencies of the timestep embedding (official SiT)


TIMESTEP_MAX_PERIOD = 10000.0


class TimestepEmbedder(nn.Module):
    """t (B,) in [0, 1] -> (B, D): 256 sinusoidal frequencies laid out [cos, sin], then Linear-SiLU-Linear.

    SiT feeds the raw t in [0, 1] (no x1000 as in DiT); the frequencies are the official ones.
    """

    def __init__(self, hidden_size: int, freq_dim: int = TIMESTEP_FREQ_DIM) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))

    @staticmethod
    def timestep_embedding(t: torch.Tensor, dim: int,
                           max_period: float = TIMESTEP_MAX_PERIOD) -> torch.Tensor:
        half = dim // 2
        steps = torch.arange(half, dtype=torch.float32, device=t.device)
        freqs = torch.exp(-math.log(max_period) * steps / half)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        return emb

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        t_freq = self.timestep_embedding(t, self.freq_dim)  # (B, 256)
        return self.mlp(t_freq.to(self.mlp[0].weight.dtype))


class GuidanceEmbedder(nn.Module):
    """iMF's guidance inputs (B, 3) = (scale w, low, high) -> (B, D): one timestep embedder each, for 1 - 1/w
    (0 without guidance, as the official code) and the two ends of the interval where w acts, summed. The last
    layer of each starts at zero, so a model starts neutral: its output is that of the model without the input."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.scale, self.low, self.high = (TimestepEmbedder(hidden_size) for _ in range(3))

    def forward(self, guidance: torch.Tensor) -> torch.Tensor:
        w, low, high = guidance.float().unbind(1)
        return self.scale(1 - 1 / w) + self.low(low) + self.high(high)  # (B, D)


class LabelEmbedder(nn.Module):
    """Class ids -> (B, D). With class_dropout_prob > 0 the table has a null row, id ``null_label``
    (= num_classes), the unconditional label of classifier-free guidance. Labels are not dropped here: the
    training objective replaces them by the null label (vit5_sit.train.objective), the one place that does."""

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden_size)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels)


NORM_EPS = 1e-6                 # LayerNorm / RMSNorm epsilon (official DiT/SiT and ViT-5)


_FORWARD_AD = [0]  # > 0 while `forward_ad_ops()` is active (nesting depth)


def forward_ad_active() -> bool:
    return _FORWARD_AD[0] > 0


def rms_norm(x: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, in x's dtype (callers pass float32).

    The plain differentiable form: what torch.compile fuses, and the reference `norm_rotate` matches."""
    if x.is_cuda:
        return F.rms_norm(x, (x.shape[-1],), eps=eps)  # a fused kernel
    # On the CPU F.rms_norm runs as pow, mean, add, rsqrt, mul; one vector_norm reduction is faster.
    return x * torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.shape[-1] + eps)


# ---- from vit5_sit.models.positions ---------------------------------------------------------------------------


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate each channel pair (2j, 2j + 1) of x (..., T, head_dim), float32, by its angle.

    Eager: one complex multiplication (a single kernel forward and backward, ~3x faster on the CPU than
    the real form). Under torch.compile: the real form, which the compiler fuses.
    """
    pairs = x.unflatten(-1, (-1, 2))  # (..., T, head_dim / 2, 2)
    if torch.compiler.is_compiling():
        x1, x2 = pairs.unbind(-1)
        return torch.stack([x1 * rope.cos - x2 * rope.sin, x2 * rope.cos + x1 * rope.sin], -1).flatten(-2)
    rot = rope.rot if rope.rot is not None else torch.complex(rope.cos, rope.sin)
    return torch.view_as_real(torch.view_as_complex(pairs) * rot).flatten(-2)


# ---- from vit5_sit.models.layers ------------------------------------------------------------------------------


class _NormRotate(torch.autograd.Function):
    """y = rotate(rms_norm(x) * weight) in float32, returned in x's dtype, with a hand-written backward.

    Autograd through the plain ops saves several float32 tensors and runs ~10 elementwise kernels in the
    backward pass (most of ViT-5's extra cost over LayerNorm on a CPU); here the backward is
    dx = r * (g' - x_hat * mean(g' * x_hat)) with g' = weight * rotate^-1(g), from the saved x_hat and r.
    weight broadcasts against x (None: no weight); rot (T, C/2) complex rotates channel pairs (None: none).
    """

    @staticmethod
    def forward(ctx, x, weight, rot, eps):
        xf = x.float()
        r = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        x_hat = xf * r
        y = x_hat if weight is None else x_hat * weight.float()
        if rot is not None:
            y = torch.view_as_real(torch.view_as_complex(y.unflatten(-1, (-1, 2))) * rot).flatten(-2)
        ctx.save_for_backward(x_hat, r, weight, rot)
        ctx.dtypes = x.dtype, None if weight is None else weight.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x_hat, r, weight, rot = ctx.saved_tensors
        g = grad.float()
        if rot is not None:  # the inverse rotation: multiply by the conjugate
            pairs = g.unflatten(-1, (-1, 2))
            if pairs.stride(-1) != 1 or any(st % 2 for st in pairs.stride()[:-1]):  # e.g. an expanded grad
                pairs = pairs.contiguous()
            g = torch.view_as_real(torch.view_as_complex(pairs) * rot.conj()).flatten(-2)
        grad_weight = None
        if weight is not None:
            if ctx.needs_input_grad[1]:
                grad_weight = (g * x_hat).sum_to_size(weight.shape).to(ctx.dtypes[1])
            g = g * weight.float()
        mean = torch.linalg.vecdot(g, x_hat, dim=-1).unsqueeze_(-1).div_(x_hat.shape[-1])
        grad_x = torch.addcmul(g, x_hat, mean, value=-1).mul_(r)
        return grad_x.to(ctx.dtypes[0]), grad_weight, None, None


def norm_rotate(x: torch.Tensor, weight: torch.Tensor | None = None, rope: Rope | None = None,
                eps: float = NORM_EPS) -> torch.Tensor:
    """RMSNorm of x over its last dimension in float32, times weight (broadcast; None = 1), then RoPE
    (None = none); the result in x's dtype. One call for a pre-norm and for QK-norm + RoPE of q and k.

    Eager on the CPU: one fused autograd function (`_NormRotate`). On CUDA and under torch.compile: the plain
    differentiable ops (CUDA's fused rms_norm kernel; the compiler fuses the rest, and has no complex code
    generation for the eager rotation)."""
    if x.is_cuda or torch.compiler.is_compiling() or forward_ad_active():
        y = rms_norm(x.float(), eps)
        if weight is not None:
            y = y * weight.float()
        return (y if rope is None else apply_rope(y, rope)).to(x.dtype)
    rot = None
    if rope is not None:
        rot = rope.rot if rope.rot is not None else torch.complex(rope.cos, rope.sin)
    return _NormRotate.apply(x, weight, rot, eps)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 (ViT-5). It drops LayerNorm's re-centring: only the rescaling matters
    for transformers, and dropping the mean is slightly cheaper and slightly better (ViT-5, as in LLMs).

    Pre-norms in a DiT block have no affine weight (`affine=False`): adaLN supplies scale and shift. The
    QK-norm uses `affine=True`, a learnable per-channel weight (init 1), as the official ViT-5 does.
    """

    def __init__(self, dim: int, eps: float = NORM_EPS, affine: bool = False) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        """x (..., dim) -> normalised (and, given `Rope` tables, rotated) x, in x's dtype."""
        return norm_rotate(x, self.weight, rope, self.eps)


def make_norm(kind: str, dim: int) -> nn.Module:
    """The pre-norm of a block (and of the final layer): no affine parameters in either kind."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, elementwise_affine=False, eps=NORM_EPS)
    return RMSNorm(dim)


class Attention(nn.Module):
    """Multi-head self-attention through `F.scaled_dot_product_attention`.

    Switches: `qkv_bias` (ViT-5 drops it: with bias-free RMSNorms everywhere, attention relies on the
    weighted projections, and QK-norm works better without an additive bias); `qk_norm` (RMSNorm with a
    learnable per-channel weight over each head's q and k, before RoPE: it bounds the attention logits and
    removes the loss spikes of large models; `q_norm` and `k_norm` hold the weights, as in ViT-5's code);
    RoPE, applied when the caller passes `Rope` tables. With QK-norm, `q_norm` and `k_norm` each normalise,
    weight and rotate in one fused call (`norm_rotate`) in float32; q and k then go back to the compute
    dtype.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.qkv_bias)
        self.q_norm = RMSNorm(cfg.head_dim, affine=True) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, affine=True) if cfg.qk_norm else None
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def project(self, x: torch.Tensor, rope: Rope | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> q, k, v, each (B, H, T, hd): what enters the softmax (QK-norm and RoPE applied).
        The one place q and k are made: `forward` and the attention statistics (vit5_sit.eval.attention)."""
        B, T, _ = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim)  # (B, T, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, hd), views of qkv (no copy)
        if self.q_norm is not None:  # each one fused call: RMSNorm, weight and RoPE (None: no rotation)
            q, k = self.q_norm(q, rope), self.k_norm(k, rope)
        elif rope is not None:
            q, k = apply_rope(q.float(), rope).to(v.dtype), apply_rope(k.float(), rope).to(v.dtype)
        return q, k, v

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.project(x, rope)
        if forward_ad_active():  # the math form: fused kernels have no forward-mode rule
            attn = torch.softmax((q @ k.transpose(-2, -1)) * self.head_dim ** -0.5, dim=-1)  # (B, H, T, T)
            x = attn.to(v.dtype) @ v
        else:
            x = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, hd), laid out (B, T, H, hd) in memory
        x = x.transpose(1, 2).reshape(B, T, D)  # a view for SDPA's output layout
        return self.proj(x)


class Mlp(nn.Module):
    """The official MLP: fc1, GELU (tanh approximation), fc2 (timm `Mlp` keys)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwiGLU(nn.Module):
    """Gated MLP, silu(x W1) * (x W2), then W3, bias-free as in ViT-5's code (W1, W2 fused as `w12`).

    Kept for the ablation only: LayerScale already acts as a static per-channel gate, and together with a
    gated MLP it over-gates (activations become too sparse), which hurts small models in the paper.
    """

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.w12 = nn.Linear(dim, 2 * hidden, bias=False)
        self.w3 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(a) * b)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: x (B, T, D) scaled and shifted per sample by (B, D) vectors from the conditioning."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTBlock(nn.Module):
    """Pre-norm transformer block with adaLN-Zero conditioning (shift, scale, gate per branch, zero-init).

    LayerScale (`layer_scale_init` not None): learnable per-channel λ on both branches, multiplying the
    adaLN-Zero gate. It scales each block's output like a static gate (ViT-5; CaiT). Both start at or near
    zero, so a ViT-5 block learns its residual branches later than a vanilla one (docs/DESIGN.md section 4).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.norm1 = make_norm(cfg.norm, D)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg.norm, D)
        if cfg.mlp == "gelu":
            self.mlp = Mlp(D, int(D * cfg.mlp_ratio))
        else:
            self.mlp = SwiGLU(D, cfg.swiglu_hidden)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 6 * D))
        if cfg.layer_scale_init is not None:
            self.gamma_1 = nn.Parameter(torch.full((D,), float(cfg.layer_scale_init)))
            self.gamma_2 = nn.Parameter(torch.full((D,), float(cfg.layer_scale_init)))
        else:
            self.gamma_1 = self.gamma_2 = None

    def forward(self, x: torch.Tensor, c: torch.Tensor,
                rope: Rope | None = None) -> torch.Tensor:
        mod = self.adaLN_modulation(c)  # (B, 6D)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.chunk(6, dim=1)
        if self.gamma_1 is not None:
            gate_msa, gate_mlp = gate_msa * self.gamma_1, gate_mlp * self.gamma_2  # (B, D)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa), rope)
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    """adaLN (shift, scale) then a linear map of each token to its patch of output channels (zero-init)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.norm_final = make_norm(cfg.norm, D)
        self.linear = nn.Linear(D, cfg.patch_size ** 2 * cfg.out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 2 * D))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


# ---- from vit5_sit.models.positions ---------------------------------------------------------------------------


def grid_positions(n: int, train_n: int) -> torch.Tensor:
    """Positions 0..n-1 rescaled so an n-patch side spans the same range as the training side."""
    return torch.arange(n, dtype=torch.float64) * (train_n / n)


SINCOS_BASE = 10000.0           # frequency base of the absolute 2D sin-cos embedding (DiT/MAE)


def sincos_pos_embed_2d(dim: int, grid_h: int, grid_w: int, train_h: int | None = None,
                        train_w: int | None = None) -> torch.Tensor:
    """DiT/MAE 2D sin-cos embedding, (grid_h * grid_w, dim) float64, tokens row-major.

    As in the official code, the first half of the channels encodes the column and the second half the row;
    each half is [sin, cos] of the position times 1 / 10000^(i / (dim/4)).
    """
    rows = grid_positions(grid_h, train_h or grid_h)
    cols = grid_positions(grid_w, train_w or grid_w)
    omega = SINCOS_BASE ** -(torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))

    def embed_1d(pos: torch.Tensor) -> torch.Tensor:
        out = pos[:, None] * omega[None]
        return torch.cat([out.sin(), out.cos()], dim=1)  # (n, dim/2)

    emb_col = embed_1d(cols)[None, :, :].expand(grid_h, grid_w, dim // 2)
    emb_row = embed_1d(rows)[:, None, :].expand(grid_h, grid_w, dim // 2)
    return torch.cat([emb_col, emb_row], dim=-1).reshape(grid_h * grid_w, dim)


# ---- from vit5_sit.models.denoiser ----------------------------------------------------------------------------


INIT_STD = 0.02                 # N(0, 0.02) for the label table, timestep MLP and register tokens


# ---- from vit5_sit.models.positions ---------------------------------------------------------------------------


def rope_angles_2d(head_dim: int, rows: torch.Tensor, cols: torch.Tensor, base: float) -> torch.Tensor:
    """Axial 2D RoPE angles, (len(rows), head_dim / 2), one per channel pair (2j, 2j + 1): the first
    head_dim/4 pairs turn with the row position, the last head_dim/4 with the column, at frequencies
    base^(-4i / head_dim). This is the official ViT-5 layout (`VisionRotaryEmbedding(head_dim // 2)` on
    both axes, pairs interleaved)."""
    inv_freq = base ** -(torch.arange(head_dim // 4, dtype=torch.float64) * 4 / head_dim)
    return torch.cat([rows[:, None] * inv_freq, cols[:, None] * inv_freq], dim=1)


class Rope(NamedTuple):
    """RoPE tables for T tokens, float32 on the model's device: the cosines and sines of the angles,
    (T, head_dim / 2) each, and the same rotations as complex numbers cos + i sin (complex64; None when
    the tables were made inside torch.compile, which has no complex code generation)."""

    cos: torch.Tensor
    sin: torch.Tensor
    rot: torch.Tensor | None


def rope_tables(angles: torch.Tensor, device: torch.device | str) -> Rope:
    """The `Rope` tables of angles (T, head_dim / 2)."""
    cos, sin = angles.cos().to(device, torch.float32), angles.sin().to(device, torch.float32)
    return Rope(cos, sin, None if torch.compiler.is_compiling() else torch.complex(cos, sin))


# ---- from vit5_sit.models.denoiser ----------------------------------------------------------------------------


X_PRED_MIN_GAP = 0.05


# ---- from vit5_sit.models.layers ------------------------------------------------------------------------------


@contextlib.contextmanager
def forward_ad_ops() -> Iterator[None]:
    """Plain differentiable ops while a forward-mode JVP (``torch.func.jvp``) runs through the model.

    Two fast paths have no forward-mode rule: the fused RMSNorm + RoPE autograd function (`_NormRotate`, a
    hand-written backward only) and the CPU flash-attention kernel of ``F.scaled_dot_product_attention``.
    Inside this context `norm_rotate` takes the plain ops (those CUDA and torch.compile use) and `Attention`
    computes softmax(q k^T / sqrt(hd)) v explicitly: the same function, tested against finite differences
    (tests/test_meanflow.py). `Denoiser.jvp` enters it; nothing else needs to."""
    _FORWARD_AD[0] += 1
    try:
        yield
    finally:
        _FORWARD_AD[0] -= 1


# ---- from vit5_sit.models.denoiser ----------------------------------------------------------------------------


class Denoiser(nn.Module):
    """SiT's DiT-style denoiser; `ModelConfig` switches each ViT-5 component (see the module docstring).

    Absolute position (`pos_embed`): 'sincos' is the official frozen 2D sin-cos table (a Parameter with
    requires_grad=False, in the state dict); 'learned' starts from the same table and trains; 'none' has
    none. ViT-5 keeps the absolute embedding *and* adds RoPE: RoPE gives relative position, the absolute
    embedding stops the model from being blind to a patch-level flip of the image (with relative position
    only, a flipped image is processed like the original up to a fixed reflection of rotary channels).

    Registers: `num_registers` learnable tokens appended after the patches and discarded at the output.
    They absorb the high-norm "artefact" attention that otherwise lands on background patches. With RoPE
    they get their own 2D rotation (row-major on a ceil(sqrt(n)) grid, 2x2 for 4) at a different frequency
    base: un-rotated registers are most similar to patches with small rotation angles, which biases
    attention by position; `register_rope_base=None` leaves them un-rotated (that ablation).

    RoPE and sin-cos tables are cached per (grid, device) in a plain dict, not in the state dict.
    `forward(..., return_hidden=(k, ...))` also returns the patch tokens after block k (1-based; registers
    excluded), for representation alignment (REPA); without it nothing is kept.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = dataclasses.replace(cfg)
        self.in_channels, self.out_channels = cfg.in_channels, cfg.out_channels
        self.patch_size, self.num_classes, self.learn_sigma = cfg.patch_size, cfg.num_classes, cfg.learn_sigma
        D, n = cfg.hidden_size, cfg.grid_size

        self.x_embedder = PatchEmbed(cfg.patch_size, cfg.in_channels, D)
        self.t_embedder = TimestepEmbedder(D)
        # MeanFlow: the interval length t - r of the average velocity gets its own embedder, summed into the
        # conditioning (the paper's ImageNet choice, (t, t - r)): at interval 0 the model is a flow model.
        self.interval_embedder = TimestepEmbedder(D) if cfg.mean_flow else None
        # iMF: the guidance scale and its interval as inputs (one-step models guided at sampling time, one pass).
        self.guidance_embedder = GuidanceEmbedder(D) if cfg.guidance_input else None
        self.y_embedder = LabelEmbedder(cfg.num_classes, D, cfg.class_dropout_prob)
        if cfg.pos_embed != "none":
            self.pos_embed = nn.Parameter(torch.zeros(1, n * n, D), requires_grad=cfg.pos_embed == "learned")
        else:
            self.pos_embed = None
        if cfg.num_registers:
            self.register_tokens = nn.Parameter(torch.zeros(1, cfg.num_registers, D))
        else:
            self.register_tokens = None
        self.blocks = nn.ModuleList([DiTBlock(cfg) for _ in range(cfg.depth)])
        self.final_layer = FinalLayer(cfg)
        self.grad_checkpointing = False
        self._tables: dict[tuple, object] = {}  # (kind, grid_h, grid_w, device) -> cached position tables
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """The official SiT/DiT initialisation, plus N(0, 0.02) register tokens (ViT-5's choice)."""
        def _basic_init(module: nn.Module) -> None:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        self.apply(_basic_init)
        # Xavier bounds of the SwiGLU gate and value halves as two separate (hidden, D) matrices.
        for block in self.blocks:
            if isinstance(block.mlp, SwiGLU):
                h = block.mlp.hidden
                nn.init.xavier_uniform_(block.mlp.w12.weight[:h])
                nn.init.xavier_uniform_(block.mlp.w12.weight[h:])

        if self.pos_embed is not None:  # 'sincos' (frozen) and 'learned' both start from the sin-cos table
            n = self.cfg.grid_size
            with torch.no_grad():
                self.pos_embed.copy_(sincos_pos_embed_2d(self.cfg.hidden_size, n, n).float().unsqueeze(0))
        if self.register_tokens is not None:
            nn.init.trunc_normal_(self.register_tokens, std=INIT_STD)

        # Patch embedding initialised like nn.Linear (instead of nn.Conv2d).
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.zeros_(self.x_embedder.proj.bias)

        nn.init.normal_(self.y_embedder.embedding_table.weight, std=INIT_STD)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=INIT_STD)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=INIT_STD)
        if self.interval_embedder is not None:
            nn.init.normal_(self.interval_embedder.mlp[0].weight, std=INIT_STD)
            nn.init.normal_(self.interval_embedder.mlp[2].weight, std=INIT_STD)
        if self.guidance_embedder is not None:  # neutral at the start: the last layers zero
            for embedder in (self.guidance_embedder.scale, self.guidance_embedder.low, self.guidance_embedder.high):
                nn.init.normal_(embedder.mlp[0].weight, std=INIT_STD)
                nn.init.zeros_(embedder.mlp[2].weight)
                nn.init.zeros_(embedder.mlp[2].bias)

        # adaLN-Zero: every block starts as the identity, the output as zero. A non-zero gate_init starts the
        # gates (chunks 2 and 5 of shift, scale, gate, shift, scale, gate) there instead: with LayerScale, the
        # branch then starts at lambda * gate_init rather than at a product of two zeros.
        D = self.cfg.hidden_size
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
            if self.cfg.gate_init:
                with torch.no_grad():
                    block.adaLN_modulation[-1].bias[2 * D:3 * D] = self.cfg.gate_init
                    block.adaLN_modulation[-1].bias[5 * D:6 * D] = self.cfg.gate_init
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass (torch.utils.checkpoint, non-reentrant): less memory."""
        self.grad_checkpointing = bool(enable)

    # Position tables --------------------------------------------------------------------------------------

    def _cached(self, key: tuple, make):
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = make()
        return table

    def absolute_pos_embed(self, grid_h: int, grid_w: int, device: torch.device) -> torch.Tensor | None:
        """(1, grid_h * grid_w, D) absolute embedding for a grid, or None for pos_embed='none'."""
        n = self.cfg.grid_size
        if self.pos_embed is None or (grid_h, grid_w) == (n, n):
            return self.pos_embed
        if self.cfg.pos_embed == "learned":  # interpolate the trained table (differentiable, not cached)
            D = self.cfg.hidden_size
            table = self.pos_embed.reshape(1, n, n, D).permute(0, 3, 1, 2)
            table = F.interpolate(table.float(), size=(grid_h, grid_w), mode="bicubic", align_corners=False)
            return table.permute(0, 2, 3, 1).reshape(1, grid_h * grid_w, D).to(self.pos_embed.dtype)
        return self._cached(
            ("sincos", grid_h, grid_w, device),
            lambda: sincos_pos_embed_2d(self.cfg.hidden_size, grid_h, grid_w, n, n).float()[None].to(device))

    def rope_tables(self, grid_h: int, grid_w: int, device: torch.device) -> Rope:
        """RoPE tables of the patch tokens then the registers, (grid_h * grid_w + num_registers, hd / 2)."""
        return self._cached(("rope", grid_h, grid_w, device),
                            lambda: self._make_rope_tables(grid_h, grid_w, device))

    def _make_rope_tables(self, grid_h: int, grid_w: int, device: torch.device) -> Rope:
        cfg, n = self.cfg, self.cfg.grid_size
        rows = grid_positions(grid_h, n)[:, None].expand(grid_h, grid_w).reshape(-1)
        cols = grid_positions(grid_w, n)[None, :].expand(grid_h, grid_w).reshape(-1)
        angles = [rope_angles_2d(cfg.head_dim, rows, cols, cfg.rope_base)]
        if cfg.num_registers:
            side = math.ceil(math.sqrt(cfg.num_registers))
            idx = torch.arange(cfg.num_registers, dtype=torch.float64)
            if cfg.register_rope_base is None:  # registers not rotated (angle 0)
                angles.append(torch.zeros(cfg.num_registers, cfg.head_dim // 2, dtype=torch.float64))
            else:
                angles.append(rope_angles_2d(cfg.head_dim, idx // side, idx % side, cfg.register_rope_base))
        return rope_tables(torch.cat(angles), device)

    # Forward ----------------------------------------------------------------------------------------------

    def unpatchify(self, x: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
        """(B, T, p * p * C_out) -> (B, C_out, grid_h * p, grid_w * p)."""
        p, c = self.patch_size, self.out_channels
        x = x.reshape(x.shape[0], grid_h, grid_w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, grid_h * p, grid_w * p)

    @property
    def null_label(self) -> int:
        """The unconditional (classifier-free guidance) label id."""
        return self.cfg.null_label

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, return_hidden: tuple[int, ...] = (),
                interval: torch.Tensor | None = None, guidance: torch.Tensor | None = None):
        """x (B, C, H, W), t (B,) in [0, 1] (0 = noise, 1 = data), y (B,) long -> (B, C, H, W).

        return_hidden: block numbers k (1-based); then returns ``(out, {k: (B, T, D) patch tokens after
        block k})``.
        interval: MeanFlow models (``cfg.mean_flow``) only: (B,) lengths d >= 0 of the time interval [t, t + d]
        whose average velocity the model predicts (`vit5_sit.transport.meanflow`); None = 0, the instantaneous
        velocity.
        guidance: iMF models (``cfg.guidance_input``) only: (B, 3) = (scale w, low, high), the guidance the
        prediction has, acting for t in [low, high] (`vit5_sit.transport.meanflow.guidance_inputs`); None = no
        guidance (1, 0, 1).
        With ``cfg.x_prediction`` the network's output is the data point x_hat and the returned velocity is
        (x_hat - x) / max(1 - t, X_PRED_MIN_GAP).
        """
        B, C, H, W = x.shape
        p = self.patch_size
        x_in = x
        if C != self.in_channels or H % p or W % p:
            raise ValueError(f"input of shape {tuple(x.shape)}: expected {self.in_channels} channels and a "
                             f"height and width divisible by patch_size={p}")
        if t.ndim == 0:
            t = t.expand(B)
        if any(not 1 <= k <= len(self.blocks) for k in return_hidden):
            raise ValueError(f"return_hidden={tuple(return_hidden)}: block numbers run from 1 to {len(self.blocks)}")
        grid_h, grid_w = H // p, W // p
        T = grid_h * grid_w

        x = self.x_embedder(x)                                    # (B, T, D)
        pos = self.absolute_pos_embed(grid_h, grid_w, x.device)
        if pos is not None:
            x = x + pos.to(x.dtype)                               # (B, T, D)
        if self.register_tokens is not None:
            x = torch.cat([x, self.register_tokens.expand(B, -1, -1).to(x.dtype)], dim=1)  # (B, T + R, D)
        rope = self.rope_tables(grid_h, grid_w, x.device) if self.cfg.rope else None  # (T + R, hd / 2)
        c = self.t_embedder(t) + self.y_embedder(y)               # (B, D)
        if self.interval_embedder is not None:
            if interval is None:
                interval = torch.zeros_like(t)
            elif interval.ndim == 0:
                interval = interval.expand(B)
            c = c + self.interval_embedder(interval)              # (B, D)
        elif interval is not None:
            raise ValueError("interval= is for MeanFlow models (ModelConfig.mean_flow=True); this model predicts "
                             "the instantaneous velocity only")
        if self.guidance_embedder is not None:
            if guidance is None:
                guidance = torch.tensor([[1.0, 0.0, 1.0]], device=x.device).expand(B, 3)  # no guidance
            elif guidance.shape != (B, 3):
                raise ValueError(f"guidance of shape {tuple(guidance.shape)}: expected ({B}, 3), a (scale, low, "
                                 "high) row per sample")
            c = c + self.guidance_embedder(guidance)              # (B, D)
        elif guidance is not None:
            raise ValueError("guidance= is for iMF models (ModelConfig.guidance_input=True, meanflow.variant=imf); "
                             "guide this model with classifier-free guidance (two passes) instead")

        hidden = {}
        for k, block in enumerate(self.blocks, start=1):
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, c, rope, use_reentrant=False)
            else:
                x = block(x, c, rope)                             # (B, T + R, D)
            if k in return_hidden:
                hidden[k] = x[:, :T]                              # (B, T, D): patch tokens only
        x = x[:, :T]                                              # (B, T, D): registers dropped
        x = self.final_layer(x, c)                                # (B, T, p * p * C_out)
        x = self.unpatchify(x, grid_h, grid_w)                    # (B, C_out, H, W)
        if self.learn_sigma:
            x = x[:, :C]                                          # (B, C, H, W): the sigma half dropped
        if self.cfg.x_prediction:  # the output is the data point x_hat; the model's answer stays a velocity
            x = (x - x_in) / (1 - t).clamp_min(X_PRED_MIN_GAP).to(x.dtype).view(B, 1, 1, 1)
        return (x, hidden) if return_hidden else x


    def jvp(self, primals: tuple[torch.Tensor, torch.Tensor, torch.Tensor], tangents: tuple, y: torch.Tensor,
            guidance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward-mode JVP of the output in (x, t, interval) for labels y (and iMF's guidance inputs, held
        fixed): returns (output, d output) for the tangents (dx, dt, d interval); through `torch.func.jvp` with
        the plain ops (`forward_ad_ops`)."""
        kw = {} if guidance is None else {"guidance": guidance}
        with forward_ad_ops():
            return torch.func.jvp(lambda x, t, d: self(x, t, y, interval=d, **kw), primals, tangents)


# ---- from vit5_sit.models.config ------------------------------------------------------------------------------


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: must be an integer")
    if value < minimum:
        raise ValueError(f"{name}={value!r}: must be >= {minimum}")


NORMS = ("layernorm", "rmsnorm")


POS_EMBEDS = ("sincos", "learned", "none")


MLPS = ("gelu", "swiglu")


def _check_float(name: str, value: object, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}={value!r}: must be a number")
    if positive and not value > 0:
        raise ValueError(f"{name}={value!r}: must be > 0")


@dataclass
class ModelConfig:
    """Hyper-parameters of `Denoiser`. The defaults are the official SiT-XL/2 (ImageNet 256, VAE latents)."""

    input_size: int = 32                    # training height = width of x (latents: image size / 8)
    in_channels: int = 4                    # channels of x (4 for SD-VAE latents)
    patch_size: int = 2
    hidden_size: int = 1152
    depth: int = 28
    num_heads: int = 16
    mlp_ratio: float = 4.0                  # GELU MLP hidden = mlp_ratio * hidden_size
    num_classes: int = 1000                 # label id num_classes is the null (unconditional) label
    class_dropout_prob: float = 0.1         # training label dropout for CFG; > 0 adds the null row
    learn_sigma: bool = True                # official SiT: 2C output channels, the second half dropped
    norm: str = "layernorm"                 # 'layernorm' | 'rmsnorm' (pre-norms and final norm)
    qk_norm: bool = False                   # RMSNorm over each head's q and k, before RoPE
    qkv_bias: bool = True
    pos_embed: str = "sincos"               # absolute embedding: 'sincos' (frozen) | 'learned' | 'none'
    rope: bool = False                      # 2D axial RoPE on the patch tokens
    rope_base: float = 10000.0              # RoPE frequency base of the patch tokens
    num_registers: int = 0                  # learnable tokens appended after the patches, dropped at output
    register_rope_base: float | None = 100.0  # RoPE base of the registers (2D grid); None = not rotated
    layer_scale_init: float | None = None   # LayerScale init value on both branches; None = off
    gate_init: float = 0.0                  # initial bias of the adaLN gates; 0 = adaLN-Zero (SiT, ViT-5)
    mlp: str = "gelu"                       # 'gelu' (tanh approx.) | 'swiglu' (params ~ the GELU MLP)
    mean_flow: bool = False                 # MeanFlow: a second timestep embedder for the interval length
                                            # (`interval_embedder`), summed into the adaLN conditioning
    guidance_input: bool = False            # iMF (MeanFlow models): the guidance scale and its interval are inputs
                                            # (`guidance_embedder`, starts neutral), summed into the conditioning
    x_prediction: bool = False              # MeanFlow models: the network outputs the data point its average
                                            # velocity reaches at t = 1 (pMF's x-prediction), U = (x - x_t) / (1 - t)

    def __post_init__(self) -> None:
        for name in ("input_size", "in_channels", "patch_size", "hidden_size", "depth", "num_heads",
                     "num_classes"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("num_registers", self.num_registers, minimum=0)
        check_choice("norm", self.norm, NORMS)
        check_choice("pos_embed", self.pos_embed, POS_EMBEDS)
        check_choice("mlp", self.mlp, MLPS)
        for name in ("qk_norm", "qkv_bias", "rope", "learn_sigma", "mean_flow", "guidance_input",
                     "x_prediction"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be True or False")
        if self.guidance_input and not self.mean_flow:
            raise ValueError("guidance_input=True is iMF's, a MeanFlow model's input: it needs mean_flow=True")
        if self.x_prediction and not self.mean_flow:
            raise ValueError("x_prediction=True is an output of MeanFlow models (their average velocity from the "
                             "predicted data point): it needs mean_flow=True (train.objective=meanflow)")
        _check_float("mlp_ratio", self.mlp_ratio, positive=True)
        _check_float("rope_base", self.rope_base, positive=True)
        _check_float("class_dropout_prob", self.class_dropout_prob)
        if not 0.0 <= self.class_dropout_prob < 1.0:
            raise ValueError(f"class_dropout_prob={self.class_dropout_prob!r}: must be in [0, 1)")
        if self.register_rope_base is not None:
            _check_float("register_rope_base", self.register_rope_base, positive=True)
        if self.layer_scale_init is not None:
            _check_float("layer_scale_init", self.layer_scale_init)
        _check_float("gate_init", self.gate_init)
        if self.input_size % self.patch_size:
            raise ValueError(f"input_size={self.input_size} is not divisible by patch_size={self.patch_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.rope and self.head_dim % 4:
            raise ValueError(f"rope=True needs head_dim (hidden_size / num_heads = {self.head_dim}) "
                             "divisible by 4: half the rotary pairs turn with the row, half with the column")
        if self.pos_embed == "sincos" and self.hidden_size % 4:
            raise ValueError(f"pos_embed='sincos' needs hidden_size divisible by 4, got {self.hidden_size}; "
                             "use pos_embed='learned' or 'none'")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def out_channels(self) -> int:
        """Channels of the final linear layer's output (2C with learn_sigma)."""
        return self.in_channels * 2 if self.learn_sigma else self.in_channels

    @property
    def null_label(self) -> int:
        """The null (unconditional) label id: ``num_classes``, the table's extra row. Training drops labels to
        it, classifier-free guidance and unconditional sampling pass it."""
        return self.num_classes

    @property
    def grid_size(self) -> int:
        """Patches per side at the training size."""
        return self.input_size // self.patch_size

    @property
    def swiglu_hidden(self) -> int:
        """SwiGLU hidden width: 2/3 of the GELU MLP's, rounded up to a multiple of 8, so params ~ equal."""
        return -(-int(2 * self.mlp_ratio * self.hidden_size / 3) // 8) * 8


# ---- from vit5_sit.hub.agreement ------------------------------------------------------------------------------


WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"  # diffusers' name of a component's weights


HUB_ARGS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision", "subfolder")


def transformer_files(path: str | Path, kwargs: dict) -> tuple[Path, Path] | None:
    """(config.json, weights) of the transformer that diffusers' ``from_pretrained(path, **kwargs)`` loads, a
    local folder or a Hub repo (resolved as diffusers resolves them); None where they are no plain files there
    (a DDUF archive, pickled weights, a file missing: diffusers' own loading then says what it says)."""
    if kwargs.get("dduf_entries") or kwargs.get("use_safetensors") is False:
        return None
    from diffusers.utils import _get_model_file

    variant = kwargs.get("variant")
    name = WEIGHTS_NAME.replace(".safetensors", f".{variant}.safetensors") if variant else WEIGHTS_NAME
    args = {k: kwargs[k] for k in HUB_ARGS if k in kwargs}
    try:
        return (Path(_get_model_file(path, weights_name="config.json", **args)),
                Path(_get_model_file(path, weights_name=name, **args)))
    except (OSError, ValueError):  # EnvironmentError: not there
        return None


# ---- from vit5_sit.common.checks ------------------------------------------------------------------------------


class ModelLoadError(RuntimeError):
    """The path does not hold a model we can load; the message says what was expected (raised by
    `vit5_sit.hub.model_files` and `vit5_sit.hub.files`)."""


# ---- from vit5_sit.hub.agreement ------------------------------------------------------------------------------


WEIGHTS_FIX = ("use an earlier checkpoint, or export the model folder again from a good one "
               "(python -m vit5_sit.demo export RUN --out FOLDER)")


def read_header(weights: str | Path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """(metadata, {key: shape}) of a safetensors file, without reading its tensors; unreadable = one line."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), "pt") as f:
            return f.metadata() or {}, {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"{weights}: not a readable safetensors file ({first}); {WEIGHTS_FIX}") from None


def _json_value(value: object) -> object:
    return json.loads(json.dumps(value))  # as a JSON file holds it: tuples become lists


def effective_fields(fields: dict, config_class=ModelConfig) -> dict:
    """The fields a loader builds ``config_class`` from, given a config file's values: the class's defaults for
    the fields it leaves out (as diffusers takes them), its values for the others; keys the class does not know
    and diffusers' own (``_class_name``, ...) are left out (diffusers ignores them)."""
    out = {}
    for f in dataclasses.fields(config_class):
        if f.name in fields:
            out[f.name] = fields[f.name]
        else:
            out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return _json_value(out)


MODEL_CONFIG_KEY = "vit5_sit_model_config"  # safetensors metadata: the ModelConfig fields of the weights (JSON)


REEXPORT = ("the files of one model folder must agree (a file edited by hand, or files of two exports): export "
            "the folder again with vit5-sit (python -m vit5_sit.demo export SOURCE --out FOLDER), or download it "
            "again")


def recorded_fields(metadata: dict | None, weights: str | Path) -> dict | None:
    """The `ModelConfig` fields the weights' metadata records (`weights_metadata`), the defaults of fields added
    since; None for weights written before the record existed."""
    text = (metadata or {}).get(MODEL_CONFIG_KEY)
    if text is None:
        return None
    try:
        fields = json.loads(text)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        raise ModelLoadError(f"{weights}: the record of the model config in its metadata ({MODEL_CONFIG_KEY}) is "
                             f"damaged; {REEXPORT}")
    # A field `ModelConfig` gained after the weights were written is absent from their record: it held the
    # default then (as a config.json without it does, `effective_fields`). Fields the class does not know stay.
    return {**{k: v for k, v in effective_fields({}).items() if k not in fields}, **fields}


def disagreement(first: dict, second: dict, first_name: str, second_name: str) -> str | None:
    """The first field on which two statements of one config differ, as ``config.json has depth=4 but the record
    in diffusion_pytorch_model.safetensors has depth=6``; None when they agree. A field only one names differs too."""
    a, b = _json_value(first), _json_value(second)
    for key in [*a, *(k for k in b if k not in a)]:
        if key not in b:
            return f"{first_name} has {key}={a[key]!r}, a field {second_name} does not have"
        if key not in a:
            return f"{second_name} has {key}={b[key]!r}, a field {first_name} does not have"
        if a[key] != b[key]:
            return f"{first_name} has {key}={a[key]!r} but {second_name} has {key}={b[key]!r}"
    return None


LISTED = 3  # keys named in a message; the rest are counted


def _listed(keys: list) -> str:
    more = f" and {len(keys) - LISTED} more" if len(keys) > LISTED else ""
    return ", ".join(str(k) for k in keys[:LISTED]) + more


def fit_problem(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> str | None:
    """Why weights of these keys and shapes (``found``) do not fit the model that has ``expected``, or None."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    wrong = [f"{k} {tuple(found[k])} (the model's: {tuple(v)})" for k, v in expected.items()
             if k in found and tuple(found[k]) != tuple(v)]
    parts = [f"missing keys: {_listed(missing)}" if missing else "",
             f"unexpected keys: {_listed(unexpected)}" if unexpected else "",
             f"wrong shapes: {_listed(wrong)}" if wrong else ""]
    return "; ".join(p for p in parts if p) or None


def expected_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The state dict's keys and shapes of the denoiser ``model`` describes (built on the meta device: no memory)."""
    pass  # (an import of vit5_sit: defined in this module)

    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in Denoiser(model).state_dict().items()}


def check_transformer_files(config: dict, weights: str | Path, where: str) -> None:
    """Before diffusers builds the model: config.json's fields (``config``, as read) against the record in the
    weights' metadata, and the weights' keys and shapes against the model those fields build."""
    metadata, shapes = read_header(weights)
    fields = effective_fields(config)
    recorded = recorded_fields(metadata, weights)
    if recorded is not None:
        problem = disagreement(fields, recorded, "config.json", f"the record in {Path(weights).name}")
        if problem:
            raise ModelLoadError(f"{where}: {problem}; {REEXPORT}")
    try:
        model = ModelConfig(**fields)
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"{where}: config.json: {e}; {REEXPORT}") from None
    problem = fit_problem(expected_shapes(model), shapes)
    if problem:
        raise ModelLoadError(f"{where}: the weights do not fit the model of config.json: {problem}; {WEIGHTS_FIX}")


def read_json(path: Path) -> dict:
    """A JSON object file of a model folder; not readable, not JSON or not an object = one line."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                             f"{REEXPORT}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got a {type(data).__name__}; {REEXPORT}")
    return data


def nonfinite_problem(state: dict[str, torch.Tensor]) -> str | None:
    """Which floating-point tensors hold NaN or inf (they sample black or noise images without any error)."""
    bad = [k for k, t in state.items()
           if t.is_floating_point() and t.device.type != "meta" and not bool(torch.isfinite(t).all())]
    if not bad:
        return None
    return f"{len(bad)} tensor(s) hold NaN or inf ({_listed(bad)}): the model would sample black or noise images"


def check_loaded(model: torch.nn.Module, built: ModelConfig, weights: str | Path | None, where: str) -> None:
    """After diffusers loaded the model: the config it was built with (keyword overrides included) against the
    weights' record, and no NaN or inf in what was loaded."""
    if weights is not None:
        recorded = recorded_fields(read_header(weights)[0], weights)
        if recorded is not None:
            problem = disagreement(dataclasses.asdict(built), recorded, "the model built",
                                   f"the record in {Path(weights).name}")
            if problem:
                raise ModelLoadError(f"{where}: {problem}; load it without overriding its config, or {REEXPORT}")
    problem = nonfinite_problem(model.state_dict())
    if problem:
        raise ModelLoadError(f"{where}: {problem}; {WEIGHTS_FIX}")


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


class Vit5SitTransformer2DModel(ModelMixin, ConfigMixin, Denoiser):
    """`Denoiser` as a diffusers model: the same modules, weights and ``forward(x, t, y)``; its config is the
    `ModelConfig` fields (``transformer/config.json``)."""

    config_name = "config.json"
    # Config values are read as model.config.x only: ModelMixin's fallback (model.x = the config's x) would
    # shadow modules of the same name (pos_embed is a config field and the position table).
    __getattr__ = torch.nn.Module.__getattr__

    @config_init(ModelConfig)
    def __init__(self, **fields) -> None:
        Denoiser.__init__(self, ModelConfig(**fields))  # nn.Module's __init__ through Denoiser's
        self._gradient_checkpointing_func = None         # what ModelMixin.__init__ sets

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """diffusers' loading, refusing a folder whose files state two models (`vit5_sit.hub.agreement`): before
        the model is built, config.json against the record in the weights' metadata and the weights' keys and
        shapes against the model; after, the config it was built with against that record, and NaN or inf."""
        where = str(Path(pretrained_model_name_or_path) / (kwargs.get("subfolder") or ""))
        files = transformer_files(pretrained_model_name_or_path, kwargs)
        if files is not None:
            check_transformer_files(read_json(files[0]), files[1], where)
        loaded = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True: (model, info)
        check_loaded(model, model.cfg, files[1] if files is not None else None, where)
        return loaded


# ---- the components' modules, for diffusers' from_pretrained(..., scheduler=...) -----------------------------
COMPONENT_MODULES = ['transformer_vit5_sit_f8c6fc46a5', 'scheduling_vit5_sit_33a2e37e66']
for _name in COMPONENT_MODULES:
    __import__("sys").modules.setdefault(_name, __import__("sys").modules[__name__])
