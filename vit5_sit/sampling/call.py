"""One pipeline call, for both doors: `vit5_sit.pipeline.Vit5SitPipeline` (the package) and
`vit5_sit.hub.components.Vit5SitDiffusersPipeline` (a model folder loaded by diffusers alone, whose code
`vit5_sit.hub.remote_code` copies from here). Both call `plan_call` then `run_call`, so the two doors take the
same arguments under the same contract (`PIPELINE_ARGS`: types and bounds, checked before anything is built), read
labels and seeds the same way, count the progress bar the same way and give the same images.

    plan = plan_call(arguments, num_classes=10, default_scale=6.0, sampler=SamplerConfig())  # checks, no work
    out = run_call(plan, model, transport, progress_bar=tqdm_factory)                         # samples

What differs between the doors is passed in: ImageNet names (``parse_name``: the package reads its class list;
a folder takes class ids only), the model's default guidance and sampler, a diffusers flow scheduler if one
replaced our sampler, the progress bar, the VAE and the device.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Sequence

import numpy as np
import torch

from vit5_sit.common.classes import ClassSpecError, check_class_id
from vit5_sit.common.contract import (
    BATCH,
    GUIDANCE,
    MAX_CALL_IMAGES,
    MAX_NFE,
    STEPS,
    UNIT,
    Arg,
    Range,
    check_arguments,
    value_problem,
)
from vit5_sit.sampling.generate import sample_images, sampler_settings, steps_per_batch
from vit5_sit.transport.guidance import check_guidance_settings, check_second_guidance
from vit5_sit.transport.rng import SeedError, check_seeds
from vit5_sit.transport.samplers import SamplerConfig

OUTPUT_TYPES = ("pil", "np", "pt", "latent")  # diffusers' output types; None is also taken, as "np" (diffusers')
# The contract of a pipeline call: every keyword of both doors' ``__call__``, its type and range, checked before
# anything is built (tests/test_contract.py fails for a keyword without an entry). None: the default decides.
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
MAX_SEED = 2**31 - 1  # seeds drawn from a torch.Generator lie in [0, MAX_SEED)


class NFELimitError(RuntimeError):
    """A batch needed more network evaluations than ``max_nfe`` allowed (adaptive solvers); it was stopped."""


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


def _is_integer(value) -> bool:
    """A whole number as a label or count may be: Python / numpy integers, not bools, floats or anything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


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


def require_accelerate(what: str) -> None:
    """One ImportError naming the install when accelerate (CPU offload's hooks) is missing."""
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise ImportError(f"{what} needs accelerate, which is not installed: pip install accelerate (or place the "
                          "pipeline with pipe.to(device), which needs nothing more)")


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


def convert_images(x: torch.Tensor, output_type: str | None):
    """(N, C, H, W) in [-1, 1] -> what diffusers' ``output_type`` names: "pil" PIL images (RGB, exactly
    sample.py's pixels), "np" (N, H, W, 3) / "pt" (N, 3, H, W) floats in [0, 1]; None is "np", as in diffusers.
    One-channel images are RGB in all three (the grey channel repeated), so the types agree in shape."""
    if output_type == "pil":
        from PIL import Image

        from vit5_sit.sampling.generate import to_uint8

        return [Image.fromarray(a) for a in to_uint8(x)]
    x = ((x + 1) / 2).clamp(0, 1)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    return x.permute(0, 2, 3, 1).numpy() if output_type in ("np", None) else x
