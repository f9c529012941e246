"""The interpolant: paths, predictions, conversions and the training loss (SiT's convention).

    x_t = alpha_t * x1 + sigma_t * x0,   x0 ~ N(0, I) noise, x1 data,   t = 0 noise, t = 1 data.

Along a path the model predicts one of three equivalent fields of (x_t, t):
  velocity  u(x, t) = E[alpha'_t x1 + sigma'_t x0 | x_t = x]   (the probability-flow ODE drift)
  noise     eps(x, t) = E[x0 | x_t = x]
  score     grad log p_t(x) = -eps(x, t) / sigma_t
They are linked through x = alpha_t E[x1 | x] + sigma_t eps, which gives
  velocity = dlog_alpha_t * x + score_coef_t * score,
  dlog_alpha_t = alpha'_t / alpha_t,   score_coef_t = dlog_alpha_t * sigma_t^2 - sigma_t * sigma'_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vit5_sit.common.utils import check_choice

PREDICTIONS = ("velocity", "score", "noise")
LOSS_WEIGHTS = ("none", "velocity", "likelihood")
TIME_DISTS = ("uniform", "logit_normal")

VP_SIGMA_MIN = 0.1  # beta(t) at the data end of SiT's VP path
VP_SIGMA_MAX = 20.0  # beta(t) at the noise end
SBDM_MIN_T = 1e-3  # smallest t the SDE starts at with diffusion_form='sbdm' (its w(t) ~ 1/t at t = 0)


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
PATHS = tuple(INTERPOLANT_PATHS)


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
