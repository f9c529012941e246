# Vit5SitScheduler, written by vit5-sit 0.1.0 when this model folder was exported: every definition
# below is copied from the vit5_sit package's source (the module named above each group), so that
# diffusers loads the folder without vit5-sit: DiffusionPipeline.from_pretrained(folder,
# trust_remote_code=True). Not edited by hand: export the folder again to update it.
from __future__ import annotations
from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin, SchedulerMixin
import inspect
import dataclasses
from diffusers.configuration_utils import register_to_config
import difflib
import torch
import math
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


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


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
