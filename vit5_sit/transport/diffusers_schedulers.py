"""diffusers' flow-matching schedulers driving our models, through a small adapter of conventions.

Ours: x_t = t x1 + (1 - t) x0 on the linear path, t = 0 noise, t = 1 data, velocity u = x1 - x0.
diffusers' flow schedulers: x = (1 - s) x_data + s noise, s = 1 noise, model output noise - data.
So s = 1 - t and their model output is -u. The adapter feeds the network t = 1 - sigmas[i] at step i and
hands the scheduler -u; the scheduler's own `step` does the rest. diffusers is imported only here, and only
when a scheduler is built (`make_scheduler`); any scheduler object with diffusers' interface also works.

Served: `FlowMatchEulerDiscreteScheduler`, and `DPMSolverMultistepScheduler` / `UniPCMultistepScheduler` in
their flow modes (``use_flow_sigmas=True, prediction_type="flow_prediction"``), deterministic variants only
(per-sample seeding has no place in a scheduler's own noise). Linear-path models only: GVP and VP paths are
not diffusers' x = (1 - s) x_data + s noise, and our own solvers (``method='dpm++2m'``) serve them.
"""

from __future__ import annotations

import numbers

import torch

from vit5_sit.common.contract import Range

from .samplers import SampleResult
from .transport import Transport

SCHEDULERS = {  # the names sample.py's --scheduler takes -> diffusers class
    "flow-euler": "FlowMatchEulerDiscreteScheduler",
    "dpm-solver": "DPMSolverMultistepScheduler",
    "unipc": "UniPCMultistepScheduler",
}
FLOW_MODE_SCHEDULERS = ("DPMSolverMultistepScheduler", "UniPCMultistepScheduler")  # need flow sigmas


class SchedulerError(ValueError):
    """A scheduler that cannot serve this model; the message names it and the fix."""


# The contract of a scheduler's config: the fields that decide its sigmas, checked before it is used (diffusers
# itself fails inside set_timesteps, or returns sigmas outside [0, 1]: shift=-1 drove times to -4 and 5).
SCHEDULER_FIELDS: dict[str, Range] = {
    "num_train_timesteps": Range(2, 10**7, why="its sigmas come from a grid of that many training steps; "
                                                  "diffusers' flow schedulers use 1000"),
    "shift": Range(0.0, 1e3, lo_open=True, why="SD3's time shift; 1 = none"),
    "flow_shift": Range(0.0, 1e3, lo_open=True, why="SD3's time shift; 1 = none"),
}


def make_scheduler(name: str, shift: float = 1.0):
    """A diffusers flow scheduler by its --scheduler name, configured for our models (shift: SD3's)."""
    if name not in SCHEDULERS:
        raise SchedulerError(f"scheduler {name!r}: choose one of {', '.join(SCHEDULERS)}")
    try:
        import diffusers
    except ImportError:
        raise SchedulerError(f"scheduler {name!r} needs diffusers (pip install diffusers); our own solvers need "
                             "nothing: method='dpm++2m'") from None
    cls = getattr(diffusers, SCHEDULERS[name])
    if name == "flow-euler":
        return cls(shift=shift)
    return cls(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=shift)


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
