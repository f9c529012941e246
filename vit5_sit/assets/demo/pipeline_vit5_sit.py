# Vit5SitDiffusersPipeline, the pipeline, written by vit5-sit 0.1.0 when this model folder was exported: every definition
# below is copied from the vit5_sit package's source (the module named above each group), so that
# diffusers loads the folder without vit5-sit: DiffusionPipeline.from_pretrained(folder,
# trust_remote_code=True). Not edited by hand: export the folder again to update it.
from __future__ import annotations
from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin, SchedulerMixin
import torch
import numbers
from collections.abc import Callable, Sequence
import numpy as np
from numbers import Real
import math
from pathlib import Path
import warnings
import os
import functools
from urllib.parse import urlparse
import socket
import threading
from dataclasses import dataclass
def odeint(*args, **kwargs):  # torchdiffeq: imported on first use, an optional dependency
    import importlib

    return getattr(importlib.import_module('torchdiffeq'), 'odeint')(*args, **kwargs)
import dataclasses


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


OUTPUT_TYPES = ("pil", "np", "pt", "latent", None)  # diffusers' output types; None = "np", as diffusers reads it


# ---- from vit5_sit.common.classes -----------------------------------------------------------------------------


class ClassSpecError(ValueError):
    """A class id or name that the model does not have; the message names it and the nearest matches."""


def check_class_id(class_id: int | str, num_classes: int) -> int:
    """``class_id`` (an int, or a string of ASCII digits) as an int, if the model has that class; else
    ClassSpecError. Huge digit strings are refused without being converted."""
    text = str(class_id)
    i = int(class_id) if len(text) <= 18 else None
    if i is None or not 0 <= i < num_classes:
        shown = text if len(text) <= 18 else f"{text[:8]}...({len(text)} digits)"
        raise ClassSpecError(f"class id {shown} out of range: this model has {num_classes} classes "
                             f"(ids 0-{num_classes - 1})")
    return i


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


# ---- from vit5_sit.pipeline -----------------------------------------------------------------------------------


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
        seeds = [check_seeds(s.item() if isinstance(s, torch.Tensor) else s) for s in seed]
        if len(seeds) != n:
            raise ValueError(f"{len(seeds)} seeds for {n} images: give one seed per image, or the first")
        return seeds
    if generator is None or isinstance(generator, torch.Generator):
        device = "cpu" if generator is None else generator.device
        return [int(s) for s in torch.randint(0, MAX_SEED, (n,), generator=generator, device=device)]
    if isinstance(generator, str | bytes) or not isinstance(generator, Sequence):
        raise SeedError(f"generator of type {type(generator).__name__}: give a torch.Generator, or a list of "
                        "them, one per image")
    for i, g in enumerate(generator):
        if not isinstance(g, torch.Generator):
            raise SeedError(f"generator[{i}] is a {type(g).__name__}: give a list of torch.Generator, one per "
                            "image")
    if len(generator) != n:
        raise ValueError(f"{len(generator)} generators for {n} images: give one generator per image (or one "
                         "for all)")
    # Image i's seed from generator i alone: its image does not depend on the other generators.
    return [int(torch.randint(0, MAX_SEED, (1,), generator=g, device=g.device)) for g in generator]


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


# ---- from vit5_sit.transport.solvers --------------------------------------------------------------------------


MULTISTEP_ORDERS = {"dpm++2m": 2, "dpm++3m": 3}  # method name -> order


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


MULTISTEP_METHODS = tuple(MULTISTEP_ORDERS)  # DPM-Solver++ multistep: ODE only, one NFE a step


ODE_FIXED = ("euler", "heun", *MULTISTEP_METHODS)


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


# ---- from vit5_sit.transport.guidance -------------------------------------------------------------------------


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


# ---- from vit5_sit.transport.diffusers_schedulers -------------------------------------------------------------


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


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


@dataclass
class SampleResult:
    samples: torch.Tensor  # like the noise
    nfe: int  # calls of model_fn (a CFG call, conditional and unconditional together, is one)


# ---- from vit5_sit.transport.diffusers_schedulers -------------------------------------------------------------


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


GRIDS = ("uniform", "shift", "logsnr", "edm")


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


# ---- from vit5_sit.transport.transport ------------------------------------------------------------------------


def expand_like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(B,) times -> (B, 1, ..., 1), broadcastable against x."""
    return t.reshape(-1, *([1] * (x.ndim - 1))).to(x.dtype)


# ---- from vit5_sit.transport.samplers -------------------------------------------------------------------------


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


class SolverError(ValueError):
    """An adaptive solver that could not meet its tolerance; the message names the settings to change."""


def ode_adaptive(model_fn, noise, y, transport, cfg, rng=None):
    """An adaptive torchdiffeq solver (cfg.method) with cfg.atol / cfg.rtol. The step sizes are shared
    by the whole batch, so a sample may differ, within the tolerance, with its batch-mates."""
    t0, t1 = transport.interval()

    def f(t, x):
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
                  ) -> np.ndarray | torch.Tensor:
    """Sample one image per (class, seed) pair; returns uint8 (N, H, W, 3), or the float images."""
    if len(classes) != len(seeds):
        raise ValueError(f"{len(classes)} classes but {len(seeds)} seeds: give one seed per image")
    if len(classes) == 0:
        raise ValueError("no images to sample: give at least one class label")
    _check_batch_size(batch_size)
    check_model_sampler(model.cfg, sampler, scheduler)
    for s in seeds:  # all of them before the first batch, not at the batch that holds a bad one
        check_seeds(s)
    device = torch.device(device)
    cfg = model.cfg
    size = image_size or cfg.input_size
    model = model.to(device).eval()
    net = model if next(model.parameters()).dtype == torch.float32 else HalfPrecisionCalls(model)
    if cfg_scale != 1.0:
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


# ---- from vit5_sit.pipeline -----------------------------------------------------------------------------------


def convert_images(x: torch.Tensor, output_type: str | None):
    """(N, C, H, W) in [-1, 1] -> what diffusers' ``output_type`` names: "pil" PIL images (RGB, exactly
    sample.py's pixels), "np" (N, H, W, 3) / "pt" (N, 3, H, W) floats in [0, 1]; None is "np", as in diffusers.
    One-channel images are RGB in all three (the grey channel repeated), so the types agree in shape."""
    if output_type == "pil":
        from PIL import Image

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


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


class Vit5SitDiffusersPipeline(DiffusionPipeline):
    """Class-conditional generation with a vit5-sit model folder, loaded by diffusers alone.

    ``pipe(class_labels, guidance_scale=None, num_inference_steps=None, seed=None, generator=None, ...)``: the
    arguments of `vit5_sit.pipeline.Vit5SitPipeline` (class ids only: ImageNet names need the package), the same
    images for the same seeds and settings. ``guidance_scale`` None = the model's (``model_index.json``)."""

    model_cpu_offload_seq = "transformer->vae"
    _optional_components = ["vae"]

    def __init__(self, transformer: ModelMixin, scheduler: SchedulerMixin, vae: ModelMixin | None = None,
                 guidance_scale: float = 1.0) -> None:
        super().__init__()
        if vae is not None:  # frozen as vit5_sit.data.vae.load_vae leaves it: CPU convolutions of weights that
            vae.requires_grad_(False)  # need no grad round differently, and the images must be the same
        self.register_modules(transformer=transformer, scheduler=scheduler, vae=vae)
        self.register_to_config(guidance_scale=guidance_scale)

    @torch.no_grad()
    def __call__(self, class_labels: int | Sequence[int], *,
                 guidance_scale: float | None = None,             # 1 = none; None = the model's default
                 guidance_interval: tuple[float, float] = (0.0, 1.0),  # guide only for t in this range
                 num_inference_steps: int | None = None,          # fixed-step methods; None = the scheduler's
                 sampler: str | None = None,                      # 'ode' | 'sde'; None = the scheduler's
                 method: str | None = None,                       # 'euler', 'heun', 'dpm++2m', ...
                 num_images_per_prompt: int = 1,                  # images per class label, one after another
                 seed: int | Sequence[int] | None = None,         # first seed (image i: seed + i), or one each
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,  # draws the seeds
                 output_type: str | None = "pil",                 # 'pil' | 'np' | 'pt' | 'latent' (None = 'np')
                 batch_size: int = 64,                            # images per forward; does not change them
                 return_dict: bool = True,
                 ) -> Vit5SitPipelineOutput | tuple:
        """``num_images_per_prompt`` images per class label; ``return_dict=False``: (images, labels, seeds)."""
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type={output_type!r}: choose one of pil, np, pt, latent")
        if isinstance(num_images_per_prompt, bool) or not isinstance(num_images_per_prompt, numbers.Integral) \
                or num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt={num_images_per_prompt!r}: must be a whole number >= 1")
        model = self.transformer
        labels = [class_labels] if isinstance(class_labels, int | torch.Tensor) else list(class_labels)
        if not labels or any(isinstance(c, bool | str) for c in labels):
            raise ClassSpecError(f"class_labels={class_labels!r}: give class ids (ImageNet names need vit5-sit)")
        labels = [check_class_id(int(c), model.cfg.num_classes) for c in labels for _ in range(num_images_per_prompt)]
        seeds = draw_seeds(len(labels), seed, generator)
        scale = self.config.guidance_scale if guidance_scale is None else float(guidance_scale)
        check_guidance_settings(scale, guidance_interval, "guidance_scale", "guidance_interval")
        settings = self.scheduler.sampler_config(num_inference_steps, sampler, method)
        evals = steps_per_batch(settings)  # None: adaptive
        steps = settings.steps + (settings.mode == "sde" and settings.last_step != "none")
        batches = -(-len(labels) // batch_size)
        with self.progress_bar(total=steps * batches if evals else None) as bar:
            x = sample_images(model, self.scheduler.transport, settings, labels, seeds, cfg_scale=scale,
                              guidance_interval=tuple(guidance_interval), batch_size=batch_size,
                              vae=None if output_type == "latent" else self.vae, as_float=True,
                              device=self._execution_device,
                              on_step=lambda: bar.update(steps / evals if evals else 1))
        self.maybe_free_model_hooks()
        images = x if output_type == "latent" else convert_images(x, output_type)
        out = Vit5SitPipelineOutput(images, labels, seeds)
        return out if return_dict else out.to_tuple()
