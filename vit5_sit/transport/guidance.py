"""Guidance as model wrappers with the network's own (x, t, y) signature: classifier-free guidance (the model's own
unconditional output) and autoguidance (a bad version of the model: Karras et al. 2024, arXiv 2406.02507)."""

from __future__ import annotations

import math
from numbers import Real

import torch

from vit5_sit.common.contract import MAX_GUIDANCE


class GuidanceError(ValueError):
    """Guidance asked of a model that has no unconditional (null) label."""


def check_guidance(scale: float, class_dropout_prob: float | None) -> None:
    """Guidance (scale != 1) needs the null label, which a model has only if it was built with label dropout
    (class_dropout_prob > 0 adds the null row). None: not known (not one of our models), not checked."""
    if float(scale) != 1.0 and class_dropout_prob == 0:
        raise GuidanceError(
            f"cfg_scale={float(scale):g} needs the null (unconditional) label, but the model was built with "
            "class_dropout_prob=0 and has none; use cfg_scale=1 (no guidance) or train with class_dropout_prob > 0")


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


# What a guide must share with the main model, field by field (the first name is ModelConfig's): the data it
# draws (shape), the labels it is conditioned on, and what it predicts (a flow model or a MeanFlow model).
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


def trained_guidance(cfg) -> float:
    """The guidance scale trained into a model (an `ExperimentConfig`): a MeanFlow model's meanflow.guidance_scale,
    whose one network pass is already guided; 1 = none (flow models, unguided MeanFlow and iMF, whose guidance is an
    input rather than trained in)."""
    return float(cfg.meanflow.guidance_scale) if cfg.train.objective == "meanflow" else 1.0


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
