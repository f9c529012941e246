"""MeanFlow (Geng, Deng, Bai, Kolter, He 2025, arXiv 2505.13447): the average velocity, its training target and
the one- or few-step sampler, in this project's time convention.

The paper writes z_t = (1 - t) x + t e (t = 0 data, t = 1 noise) and v = e - x. Here, as everywhere in the
package (SiT), x_t = t x1 + (1 - t) x0 with t = 1 the data and the velocity u = x1 - x0. The one mapping, made
here and nowhere else (tests/test_meanflow.py checks it):

    our t = 1 - paper t,    our velocity = - paper velocity,    interval d = paper (t - r) >= 0.

The network predicts the average of our velocity over [t, t + d] (from the noisier time t toward the data):

    U(x_t, t, d) = 1/d * integral from t to t + d of v(x_s, s) ds,   so  x_{t + d} = x_t + d U(x_t, t, d),

and at d = 0 it is the instantaneous velocity (a flow model). The MeanFlow identity, with t + d held fixed:

    U = v + d * dU/dt,   dU/dt = v . d_x U + d_t U - d_d U     (one JVP, tangent (v, 1, -1) in (x, t, d)),

the paper's u = v - (t - r) du/dt, tangent (v, 0, 1) in (z, r, t), after the mapping. One-step sampling:
x1 = x0 + U(x0, 0, 1); k steps on the uniform grid t_i = i / k: x_{t_{i+1}} = x_{t_i} + (t_{i+1} - t_i) U.

Improved MeanFlow (iMF, Geng et al. 2025, arXiv 2512.02012; ``meanflow.variant=imf``) regresses the compound
function V = U - d sg(dU/dt) on the (guided) instantaneous velocity, with the JVP taken along the network's own
velocity prediction U(x_t, t, 0) instead of the sample's x1 - x0: in our time the paper's
V = u + (t - r) sg(du/dt). The squared error ||V - v_g||^2 is ||U - sg(v_g + d dU/dt)||^2, so the one loss
function serves both; what changes is the tangent, and with it the target's variance. The guidance scale w and
the interval [low, high] (our t) where it acts are network inputs (`guidance_inputs`), drawn per sample in
training, so the guidance of a one-step model is chosen at sampling time, one pass per image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

VARIANTS = ("meanflow", "imf")          # meanflow.variant: MeanFlow (2505.13447) | improved MeanFlow (2512.02012)
IMF_INTERVAL_SPLIT = 0.5                # iMF's training interval ends: low ~ U(0, split), high ~ U(split, 1)
UNGUIDED = (1.0, 0.0, 1.0)              # guidance inputs (scale, low, high) that mean no guidance


@dataclass
class MeanFlowConfig:
    """The objective's settings (the paper's ImageNet values, Table 4 / ablations of Table 1, in our time)."""

    ratio: float = 0.25                    # share of the batch with an interval d > 0 (paper: 25% r != t); the
                                           # rest has d = 0, plain flow matching
    time_mean: float = 0.4                 # logit-normal times: t = sigmoid(mean + std n); the paper's
    time_std: float = 1.0                  # lognorm(-0.4, 1.0) in its time is (0.4, 1.0) here (t = 1 data)
    adaptive_p: float = 1.0                # loss weight 1 / (||error||^2 + c)^p (paper: p = 1); 0 = plain L2
    adaptive_c: float = 1e-3
    guidance_scale: float = 1.0            # guidance trained in (the paper's effective w'); 1 = none
    guidance_mix: float = 0.0              # the paper's kappa: share of the model's own conditional output
    guidance_interval: list[float] = field(default_factory=lambda: [0.0, 1.0])  # our t where guidance is
                                           # trained in (the paper's XL/2 [0, 0.75] in its t is [0.25, 1] here)
    variant: str = "meanflow"              # 'meanflow' | 'imf': improved MeanFlow (the loss on the velocity, the
                                           # JVP along the network's velocity, guidance scale and interval inputs)
    guidance_range: list[float] = field(default_factory=lambda: [1.0, 8.0])  # imf: the guidance scales drawn in
                                           # training, log-uniform on [LOW, HIGH] (official code: [1, 1 + 7])
    teacher: str | None = None             # imf: a frozen flow model (run, checkpoint or model folder, e.g. demo,
                                           # or an official SiT .pt) whose guided velocity replaces x1 - x0 and the
                                           # network's own predictions in the target (`teacher_velocity`)
    shortcut: float = 0.0                  # share of the batch given the whole interval (t = 0, d = 1: the
                                           # one-step sample) and regressed on the network's own two-step sample
                                           # (`shortcut_target`, Shortcut models' self-consistency); 0 = off
    shortcut_from: int = 0                 # the training step from which the shortcut share applies (a
                                           # fine-tuning stage; before it the draws are a run's without it)

    def __post_init__(self) -> None:
        def number(name, lo, hi, lo_open=False, hi_open=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"meanflow.{name}={v!r}: must be a finite number")
            if v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
                raise ValueError(f"meanflow.{name}={v!r}: must be in {'(' if lo_open else '['}{lo:g}, "
                                 f"{hi:g}{')' if hi_open else ']'}")
        number("ratio", 0.0, 1.0)
        number("time_mean", -10.0, 10.0)
        number("time_std", 0.0, 10.0, lo_open=True)
        number("adaptive_p", 0.0, 4.0)
        number("adaptive_c", 0.0, 1e6, lo_open=True)
        number("guidance_scale", 0.0, 100.0)
        number("guidance_mix", 0.0, 1.0, hi_open=True)
        number("shortcut", 0.0, 1.0, hi_open=True)
        sf = self.shortcut_from
        if isinstance(sf, bool) or not isinstance(sf, int) or sf < 0:
            raise ValueError(f"meanflow.shortcut_from={sf!r}: must be a step number >= 0 (0 = from the start)")
        iv = self.guidance_interval
        if (not isinstance(iv, list | tuple) or len(iv) != 2
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in iv)
                or not 0.0 <= iv[0] <= iv[1] <= 1.0):
            raise ValueError(f"meanflow.guidance_interval={iv!r}: expected [LOW, HIGH] with 0 <= LOW <= HIGH <= 1 "
                             "(t: 0 = noise, 1 = data)")
        if self.variant not in VARIANTS:
            raise ValueError(f"meanflow.variant={self.variant!r}: must be one of {', '.join(VARIANTS)}")
        gr = self.guidance_range
        if (not isinstance(gr, list | tuple) or len(gr) != 2
                or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in gr)
                or not 1.0 <= gr[0] <= gr[1] <= 100.0):
            raise ValueError(f"meanflow.guidance_range={gr!r}: expected [LOW, HIGH] with 1 <= LOW <= HIGH <= 100 "
                             "(guidance scales; 1 = none)")
        if self.teacher is not None:
            if not isinstance(self.teacher, str) or not self.teacher.strip():
                raise ValueError(f"meanflow.teacher={self.teacher!r}: give the path of a flow run, checkpoint or model "
                                 "folder (e.g. demo), or an official SiT .pt file; or drop it")
            if not self.imf:
                raise ValueError(f"meanflow.teacher={self.teacher!r} needs meanflow.variant=imf (the teacher's guided "
                                 "velocity is iMF's target); set meanflow.variant=imf or drop meanflow.teacher")
        if self.imf:
            trained_in = [f"meanflow.{k}={getattr(self, k)!r}" for k, default in
                          (("guidance_scale", 1.0), ("guidance_mix", 0.0), ("guidance_interval", [0.0, 1.0]))
                          if getattr(self, k) != default]
            if trained_in:
                raise ValueError(f"{', '.join(trained_in)} with meanflow.variant=imf: iMF takes the guidance scale "
                                 "and interval as inputs, drawn in training from meanflow.guidance_range; drop "
                                 f"{'it' if len(trained_in) == 1 else 'them'}")
        elif list(gr) != [1.0, 8.0]:
            raise ValueError(f"meanflow.guidance_range={gr!r}: no effect with meanflow.variant=meanflow (it trains "
                             "one scale in: meanflow.guidance_scale); drop it or set meanflow.variant=imf")

    @property
    def guided(self) -> bool:
        """Guidance trained in (MeanFlow's one scale)."""
        return float(self.guidance_scale) != 1.0

    @property
    def imf(self) -> bool:
        return self.variant == "imf"


def draw_times(n: int, cfg: MeanFlowConfig, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(t, d), each (n,): two logit-normal times per sample, t the noisier (smaller) one and d the distance to
    the other; d = 0 for a share 1 - ratio of the batch (the paper's r = t)."""
    a = torch.sigmoid(cfg.time_mean + cfg.time_std * torch.randn(n, generator=generator))
    b = torch.sigmoid(cfg.time_mean + cfg.time_std * torch.randn(n, generator=generator))
    keep = torch.rand(n, generator=generator) < cfg.ratio
    t = torch.minimum(a, b)
    d = torch.where(keep, torch.maximum(a, b) - t, torch.zeros_like(t))
    return t, d


def guided_velocity(v: torch.Tensor, cond: torch.Tensor | None, uncond: torch.Tensor, cfg: MeanFlowConfig
                    ) -> torch.Tensor:
    """The paper's guided field w v + kappa u(.|c) + (1 - w - kappa) u(.|null), with w = w' (1 - kappa): the
    network's own instantaneous predictions (d = 0) stand in for the fields it cannot see."""
    kappa = float(cfg.guidance_mix)
    w = float(cfg.guidance_scale) * (1 - kappa)
    out = w * v + (1 - w - kappa) * uncond
    return out if cond is None or kappa == 0 else out + kappa * cond


def meanflow_target(model, x_t: torch.Tensor, t: torch.Tensor, d: torch.Tensor, y: torch.Tensor,
                    v: torch.Tensor, dropped: torch.Tensor, null_label: int, cfg: MeanFlowConfig
                    ) -> torch.Tensor:
    """sg(U_tgt) = v~ + d * dU/dt for each sample, without gradient. v~ is the conditional velocity v, guided
    (`guided_velocity`) where guidance is trained in: not for dropped labels (they learn the unconditional
    field) and only for t in the guidance interval. The JVP runs only over the samples with d > 0 (the target
    of the others is v~ itself). ``model``: the bare `Denoiser` (it has `jvp`)."""
    with torch.no_grad():
        target = v
        if cfg.guided:
            lo, hi = cfg.guidance_interval
            guide = ~dropped & (t >= lo) & (t <= hi)
            if bool(guide.any()):
                idx = guide.nonzero(as_tuple=True)[0]
                xs, ts = x_t[idx], t[idx]
                zero = torch.zeros_like(ts)
                uncond = model(xs, ts, torch.full_like(y[idx], null_label), interval=zero)
                cond = model(xs, ts, y[idx], interval=zero) if cfg.guidance_mix else None
                target = target.clone()
                target[idx] = guided_velocity(v[idx], cond, uncond, cfg).to(target.dtype)
        moving = (d > 0).nonzero(as_tuple=True)[0]
        if len(moving):
            vs, ds = target[moving], d[moving]
            _, dudt = model.jvp((x_t[moving], t[moving], ds), (vs, torch.ones_like(ds), -torch.ones_like(ds)),
                                y[moving])
            target = target.clone()
            target[moving] = vs + ds.view(-1, *[1] * (vs.ndim - 1)) * dudt.to(vs.dtype)
    return target


def guidance_inputs(n: int, scale: float | torch.Tensor = 1.0, interval: tuple[float, float] = (0.0, 1.0),
                    device: torch.device | str | None = None) -> torch.Tensor:
    """(n, 3): the guidance inputs (scale w, low, high) of an iMF network (``Denoiser(..., guidance=)``): w acts
    for t in [low, high] (our t: 0 = noise, 1 = data); w = 1 is no guidance. ``scale``: a number or (n,)."""
    w = torch.as_tensor(scale, dtype=torch.float32, device=device).expand(n)
    lo = torch.full((n,), float(interval[0]), device=device)
    return torch.stack([w, lo, torch.full_like(lo, float(interval[1]))], dim=1)


def draw_guidance(d: torch.Tensor, cfg: MeanFlowConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """iMF's training draw of the guidance inputs, (n, 3) for the intervals d (n,): w log-uniform on
    ``cfg.guidance_range`` (the official code's power law with beta = 1); the interval ends low ~ U(0, 0.5) and
    high ~ U(0.5, 1), the whole of [0, 1] where d = 0 (the paper's t_min, t_max: the same law in our time)."""
    n = d.shape[0]
    lo_w, hi_w = (float(v) for v in cfg.guidance_range)
    w = lo_w * (hi_w / lo_w) ** torch.rand(n, generator=generator)
    low = IMF_INTERVAL_SPLIT * torch.rand(n, generator=generator)
    high = IMF_INTERVAL_SPLIT + (1 - IMF_INTERVAL_SPLIT) * torch.rand(n, generator=generator)
    flow = d == 0
    return torch.stack([w, torch.where(flow, 0.0, low), torch.where(flow, 1.0, high)], dim=1)


def teacher_velocity(teacher, x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor, w: torch.Tensor, null_label: int
                     ) -> torch.Tensor:
    """A frozen flow model's guided velocity v_u + w (v_c - v_u) at (x_t, t), without gradient: the conditional
    velocity v_c where w = 1 (and the unconditional one where ``y`` is the null label), one teacher call on the
    batch plus its guided rows with the null label. ``w`` (n,): the scale acting at t (1 outside the interval)."""
    with torch.no_grad():
        guide = ((w != 1) & (y != null_label)).nonzero(as_tuple=True)[0]
        xs, ts = torch.cat([x_t, x_t[guide]]), torch.cat([t, t[guide]])
        ys = torch.cat([y, torch.full_like(y[guide], null_label)])
        out = teacher(xs, ts, ys).to(x_t.dtype)
        v_c, v_u = out[: len(y)], out[len(y):]
        v = v_c.clone()
        if len(guide):
            scale = w[guide].to(v.dtype).view(-1, *[1] * (v.ndim - 1))
            v[guide] = v_u + scale * (v_c[guide] - v_u)
    return v


def imf_target(model, x_t: torch.Tensor, t: torch.Tensor, d: torch.Tensor, y: torch.Tensor, v: torch.Tensor,
               guidance: torch.Tensor, null_label: int, teacher=None) -> torch.Tensor:
    """sg(v_g + d dU/dt) for each sample, without gradient: iMF's target for U, i.e. V = U - d sg(dU/dt)
    regressed on v_g. ``y``: the labels after dropout; ``guidance`` (n, 3): (w, low, high), `UNGUIDED` for dropped
    labels. The network's own instantaneous predictions (d = 0, no interval: (w', 0, 1)) give
    - the conditional v_c at w' = w where t is in [low, high], else 1, and the unconditional v_u (w' = 1);
    - the guided field v_g = v + (1 - 1/w') (v_c - v_u) (v where w' = 1: dropped labels, t outside the interval);
    - the JVP's tangent (v_c, 1, -1) in (x, t, d) (MeanFlow's is (v, 1, -1)), over the samples with d > 0.
    ``model``: the bare `Denoiser` (it has `jvp`).

    With a ``teacher`` (a frozen flow model, ``meanflow.teacher``): distillation of its guided ODE, the teacher's
    guided velocity (`teacher_velocity`) is both v_g and the tangent, in place of x1 - x0 (``v`` is not used) and of
    the network's own predictions; the target's only randomness left is the point (x_t, t)."""
    with torch.no_grad():
        w, low, high = guidance.unbind(1)
        w_now = torch.where((t >= low) & (t <= high), w, torch.ones_like(w)).to(t)
        zero = torch.zeros_like(t)
        need = ((d > 0) | (w_now != 1)).nonzero(as_tuple=True)[0]
        if teacher is not None:
            target = teacher_velocity(teacher, x_t, t, y, w_now, null_label).to(v.dtype)
            tangent, need = target.clone(), need[:0]
        else:
            target, tangent = v.clone(), v.clone()
        if len(need):
            xs, ts, wn = x_t[need], t[need], w_now[need]
            v_c = model(xs, ts, y[need], interval=zero[need], guidance=guidance_inputs(len(need), wn, device=xs.device))
            tangent[need] = v_c.to(v.dtype)
            guide = (wn != 1).nonzero(as_tuple=True)[0]
            if len(guide):
                xg, tg, wg = xs[guide], ts[guide], wn[guide]
                v_u = model(xg, tg, torch.full_like(y[need][guide], null_label), interval=zero[need][guide],
                            guidance=guidance_inputs(len(guide), 1.0, device=xg.device))
                scale = (1 - 1 / wg).view(-1, *[1] * (v.ndim - 1))
                target[need[guide]] = (v[need[guide]] + scale * (v_c[guide] - v_u)).to(v.dtype)
        moving = (d > 0).nonzero(as_tuple=True)[0]
        if len(moving):
            ds = d[moving]
            _, dudt = model.jvp((x_t[moving], t[moving], ds),
                                (tangent[moving], torch.ones_like(ds), -torch.ones_like(ds)), y[moving],
                                guidance=guidance[moving])
            target[moving] = target[moving] + ds.view(-1, *[1] * (v.ndim - 1)) * dudt.to(v.dtype)
    return target


def shortcut_target(model, x0: torch.Tensor, y: torch.Tensor, guidance: torch.Tensor | None = None) -> torch.Tensor:
    """sg(U) for the whole interval from the noise ``x0`` (t = 0, d = 1): the network's own two-step sample
    x1 = x0 + (u_a + u_b) / 2, with u_a = U(x0, 0, 1/2) and u_b = U(x0 + u_a / 2, 1/2, 1/2), as an average velocity,
    (u_a + u_b) / 2. The discrete self-consistency of Shortcut models (Frans, Hafner, Levine, Abbeel 2024, arXiv
    2410.12557) at the one interval a one-step sample uses; MeanFlow's identity is its limit of small halves.
    ``guidance`` (n, 3): iMF's inputs, the same for both halves; None for MeanFlow."""
    kw = {} if guidance is None else {"guidance": guidance}

    def model_fn(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, interval: torch.Tensor | None = None):
        return model(x, t, y, interval=interval, **kw)

    with torch.no_grad():
        return meanflow_sample(model_fn, x0, y, 2) - x0


def meanflow_loss(pred: torch.Tensor, target: torch.Tensor, cfg: MeanFlowConfig, flat: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted loss (B,), squared error per element (B,)): ||pred - target||^2 summed over the sample, times
    the adaptive weight sg(1 / (||.||^2 + c)^p) (p = 0: plain). ``flat`` (B,) bool: rows weighted by the mean
    adaptive weight of the others instead of their own, so that their gradient shrinks with their error (the
    shortcut rows, whose target the network makes itself: with their own weight a run collapsed to a constant
    output, docs/meanflow.md "The one-step map taught its two-step sample")."""
    sq = (pred.float() - target.float()).square().flatten(1).sum(1)
    weight = (sq.detach() + cfg.adaptive_c).pow(-cfg.adaptive_p) if cfg.adaptive_p else torch.ones_like(sq)
    if flat is not None and bool(flat.any()) and bool((~flat).any()):
        weight = torch.where(flat, weight[~flat].mean(), weight)
    return weight * sq, sq.detach() / pred[0].numel()


def meanflow_grid(steps: int) -> list[float]:
    """The times of a k-step MeanFlow sample: uniform on [0, 1] (noise to data), k + 1 points."""
    return [i / steps for i in range(steps + 1)]


def with_guidance(model, scale: float, guidance_interval: tuple[float, float] = (0.0, 1.0)):
    """An iMF network (``cfg.guidance_input``) as `meanflow_sample`'s ``model_fn``, guided at sampling time: each
    call passes the guidance inputs (``scale``, acting for t in ``guidance_interval``, our t) to the network, one
    pass per step and no unconditional pass. Scale 1 is the unguided model."""
    def model_fn(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, interval: torch.Tensor | None = None):
        guidance = guidance_inputs(x.shape[0], scale, guidance_interval, device=x.device)
        return model(x, t, y, interval=interval, guidance=guidance)
    return model_fn


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
