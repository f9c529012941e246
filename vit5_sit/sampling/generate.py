"""Generating images from a model, as library functions: seeded batches, labelled PNG grids, resumable .npz.

The command line is `vit5_sit/cli/sample.py` (`python sample.py`); the ODE/SDE solvers that turn noise into
data are `vit5_sit.transport.samplers` (`transport.sample`); this module runs them batch by batch, guided,
seeded and decoded, for sample.py, the pipeline, the web demo and `eval_fid.py compare`.

Noise is seeded per sample (one generator per seed), so the image a seed gives does not depend on the
batch size or on the number of processes (adaptive ODE solvers excepted: their step sizes are shared by a
batch, so mass sampling records and enforces the batch sizes for them). Mass sampling (`sample_to_npz`)
relies on this: sample i has seed ``seed + i`` wherever and whenever it is drawn, so an interrupted run
that is started again produces exactly the same file.
"""

from __future__ import annotations

import dataclasses
import io
import json
import numbers
import shutil
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from vit5_sit.common.interrupt import Interrupted
from vit5_sit.common.utils import atomic_write_bytes, atomic_write_file, atomic_write_text
from vit5_sit.models import Denoiser
from vit5_sit.transport import (
    AutoGuidance,
    ClassifierFreeGuidance,
    GuidanceError,
    SamplerConfig,
    StackedRandomGenerator,
    Transport,
    check_guide,
    check_seeds,
    sample,
)

# FIXED_STEP_METHODS: adaptive ODE solvers share step sizes in a batch
from vit5_sit.transport.guidance import check_second_guidance
from vit5_sit.transport.samplers import FIXED_STEP_METHODS, ODE_ADAPTIVE

PART_SIZE = 256        # images per part file of mass sampling; fixed for a run (part k: samples kP..kP+P-1)
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}]"
GRID_MIN_CELL = 64     # labelled grids enlarge smaller images (nearest neighbour) to at least this size


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """(N, C, H, W) in [-1, 1] -> (N, H, W, 3) uint8; one-channel images are repeated to RGB."""
    x = ((x.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    return x.permute(0, 2, 3, 1).cpu().numpy()


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


def _check_batch_size(batch_size) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: must be a whole number >= 1")


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
        from vit5_sit.transport.meanflow import with_guidance

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
        from vit5_sit.data.vae import load_vae

        vae = load_vae(str(vae), device=device)
    out = []
    for lo in range(0, len(seeds), batch_size):
        batch_seeds = list(seeds[lo:lo + batch_size])
        rng = StackedRandomGenerator(batch_seeds, device)
        noise = rng.randn((cfg.in_channels, size, size))  # x0, at t = 0
        y = torch.as_tensor(list(classes[lo:lo + batch_size]), device=device, dtype=torch.long)
        if scheduler is not None:
            from vit5_sit.transport.diffusers_schedulers import sample_with_scheduler

            x1 = sample_with_scheduler(net, noise, y, transport, scheduler, sampler.steps).samples
        else:
            x1 = sample(net, noise, y, transport, sampler, rng=rng).samples  # the model's data space, at t = 1
        images = x1
        if vae is not None:
            from vit5_sit.data.vae import decode

            images = decode(vae, x1)
        out.append(images.float().cpu() if as_float else to_uint8(images))
        if on_batch is not None:
            on_batch(len(batch_seeds))
    return torch.cat(out) if as_float else np.concatenate(out)


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


def step_progress(bar, images: int, evals: int | None) -> Callable[[], None] | None:
    """An `on_step` callback that moves a tqdm bar (unit: images) through one batch, evaluation by evaluation.

    The bar lands exactly on the batch's end after ``evals`` calls; None when the count is unknown
    (adaptive solvers), and the caller updates per batch instead.
    """
    start, calls = bar.n, [0]

    def on_step() -> None:
        calls[0] += 1
        bar.n = start + images if calls[0] >= evals else start + images * calls[0] / evals
        bar.refresh()

    return on_step if evals else None


def make_grid(images: np.ndarray, ncol: int, pad: int = 2) -> np.ndarray:
    """Tile (N, H, W, 3) uint8 images row-major into one image with ``pad`` white pixels between."""
    n, h, w, c = images.shape
    nrow = -(-n // ncol)
    grid = np.full((nrow * (h + pad) + pad, ncol * (w + pad) + pad, c), 255, dtype=np.uint8)
    for i, img in enumerate(images):
        r, col = divmod(i, ncol)
        top, left = pad + r * (h + pad), pad + col * (w + pad)
        grid[top:top + h, left:left + w] = img
    return grid


MAX_GRID_PIXELS = 89_478_485  # PIL's Image.MAX_IMAGE_PIXELS: a larger PNG is refused as a decompression bomb


def grid_pixels(nrow: int, ncol: int, size: int) -> int:
    """Pixels of the image part of a labelled grid of ``nrow`` x ``ncol`` images of ``size`` pixels (after
    the GRID_MIN_CELL enlargement), known before any image is drawn."""
    cell = size * max(1, -(-GRID_MIN_CELL // size)) + 2  # make_grid's padding
    return (nrow * cell + 2) * (ncol * cell + 2)


def save_labelled_grid(images: np.ndarray, path: str | Path, ncol: int, row_labels: Sequence[str],
                       scale: int | None = None) -> Path:
    """A PNG grid with a label left of each row (PIL's default font), written atomically.

    ``scale`` None enlarges images smaller than GRID_MIN_CELL pixels by an integer factor. The image part
    is `make_grid` of the scaled images, right-aligned; the label column is as wide as the longest label.
    """
    from PIL import Image, ImageDraw, ImageFont

    n, h, w, _ = images.shape
    nrow = -(-n // ncol)
    if len(row_labels) != nrow:
        raise ValueError(f"{len(row_labels)} row labels for {nrow} rows of {ncol} images")
    scale = scale or max(1, -(-GRID_MIN_CELL // max(h, w)))
    if scale > 1:
        images = images.repeat(scale, axis=1).repeat(scale, axis=2)
    grid = make_grid(images, ncol)
    cell = h * scale
    try:
        font = ImageFont.load_default(size=max(10, min(20, cell // 4)))
    except TypeError:  # Pillow without FreeType: the fixed bitmap font
        font = ImageFont.load_default()
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    boxes = [probe.textbbox((0, 0), label, font=font) for label in row_labels]
    margin = 6
    label_w = max(b[2] for b in boxes) + 2 * margin
    img = Image.new("RGB", (label_w + grid.shape[1], grid.shape[0]), (255, 255, 255))
    img.paste(Image.fromarray(grid), (label_w, 0))
    draw = ImageDraw.Draw(img)
    pad = 2  # make_grid's padding
    for r, (label, box) in enumerate(zip(row_labels, boxes)):
        y = pad + r * (cell + pad) + (cell - (box[3] - box[1])) // 2 - box[1]
        draw.text((margin, y), label, fill=(0, 0, 0), font=font)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


# ----------------------------------------------------------------------------------------------------------
# Mass sampling for FID: fixed parts of seeds, written atomically, assembled into ADM's .npz layout.

class SamplingStateError(RuntimeError):
    """Part files made with other settings, or unreadable ones; the message says what to do."""


class SamplingInterrupted(Interrupted):
    """Ctrl-C during mass sampling, after the finished batches were kept; ``str(e)`` says how to continue."""


def parts_dir(out: str | Path) -> Path:
    """Where `sample_to_npz` keeps its part files: ``samples.npz`` -> ``samples.npz.parts/``."""
    out = Path(out)
    return out.with_name(out.name + ".parts")


def manifest_path(out: str | Path) -> Path:
    """The settings a finished .npz was made with: ``samples.npz`` -> ``samples.npz.json``."""
    out = Path(out)
    return out.with_name(out.name + ".json")


def sample_labels(num_samples: int, classes: Sequence[int]) -> np.ndarray:
    """Sample i gets class ``classes[i % len(classes)]`` (all classes in turn: balanced)."""
    classes = np.asarray(list(classes), dtype=np.int64)
    return classes[np.arange(num_samples) % len(classes)]


def _jsonable(value):
    return json.loads(json.dumps(value, default=lambda o: dataclasses.asdict(o) if dataclasses.is_dataclass(o)
                                 else str(o)))


def _differences(a: dict, b: dict) -> list[str]:
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k)!r} (existing) vs {b.get(k)!r} (now)" for k in keys if a.get(k) != b.get(k)]


def npz_is_complete(out: str | Path, manifest: dict) -> bool:
    """True if ``out`` exists and its manifest says it was made with exactly these settings."""
    out, mpath = Path(out), manifest_path(out)
    if not (out.is_file() and mpath.is_file()):
        return False
    try:
        return json.loads(mpath.read_bytes()) == _jsonable(manifest)
    except (OSError, ValueError):  # unreadable, not UTF-8 or not JSON: not a finished file of these settings
        return False


def sampling_manifest(model_cfg, transport_cfg, sampler: SamplerConfig, *, num_samples: int,
                      classes: Sequence[int] | None = None, seed: int = 0, cfg_scale: float = 1.0,
                      guidance_interval: tuple[float, float] = (0.0, 1.0), guide_channels: int | None = None,
                      vae=None, image_size: int | None = None, identity: dict | None = None,
                      part_size: int = PART_SIZE, batch_size: int = 64, guide: dict | None = None) -> dict:
    """Everything that decides the images of `sample_to_npz`: not the number of processes, and not the part
    and batch sizes either, except for adaptive ODE solvers, whose step sizes are shared by a batch.

    Computable without loading the model (model_cfg is its ModelConfig), so callers can skip the loading
    when ``npz_is_complete(out, manifest)``. ``guide``: the autoguidance guide's identity (`model_identity`), None
    = no guide (and no key: files sampled before guides existed stay complete).
    """
    classes = list(range(model_cfg.num_classes)) if classes is None else [int(c) for c in classes]
    vae_name = None if vae is None else vae if isinstance(vae, str | Path) else type(vae).__name__
    manifest = {
        "num_samples": num_samples, "seed": seed, "classes": classes, "sampler": sampler,
        "transport": transport_cfg, "cfg_scale": cfg_scale, "guidance_interval": list(guidance_interval),
        "guide_channels": guide_channels,
        "image_size": image_size or model_cfg.input_size, "vae": vae_name, "model": identity or {},
    }
    if guide is not None:
        manifest["guide"] = guide
    if sampler.mode == "ode" and sampler.method not in FIXED_STEP_METHODS:
        manifest["batches"] = {"part_size": part_size, "batch_size": batch_size}
    return _jsonable(manifest)


def sample_to_npz(model: Denoiser, transport: Transport, sampler: SamplerConfig, out: str | Path, *,
                  num_samples: int,
                  classes: Sequence[int] | None = None,  # cycled over the samples; None = all classes
                  seed: int = 0,                          # sample i has seed `seed + i`
                  part_size: int = PART_SIZE,             # images per part file; fixed for a run
                  batch_size: int = 64,                   # images per forward on each process
                  cfg_scale: float = 1.0,
                  guidance_interval: tuple[float, float] = (0.0, 1.0),
                  guide_channels: int | None = None,
                  vae=None,                               # None (pixel model), a name/path, or a loaded VAE
                  image_size: int | None = None,          # model input size; None = trained size
                  device: torch.device | str | None = None,  # None = this process's device
                  identity: dict | None = None,           # which model (checkpoint, sha256): for the manifest
                  guide: Denoiser | None = None,          # autoguidance: cfg_scale weighs the model against it
                  guide_identity: dict | None = None,     # which guide (as identity): for the manifest
                  trained_guidance: float = 1.0,          # guidance trained into the model (as in sample_images)
                  max_parts: int | None = None,           # stop after this many new parts (time-limited jobs)
                  keep_parts: bool = False,               # keep the part files after assembling the .npz
                  progress: bool = True,
                  ) -> Path | None:
    """Sample ``num_samples`` images into ``out`` (ADM layout: arr_0 uint8 N x H x W x 3, arr_1 int64 labels).

    Collective: under `accelerate launch` every process calls it and takes its share of the missing parts.
    Part k (samples ``[k * part_size, (k + 1) * part_size)``) is written atomically to
    ``out.parts/part_K.npz``; parts already there are skipped, so an interrupted run continues where it
    stopped and gives the file an uninterrupted one would. On Ctrl-C the finished batches of the part under
    way are kept too (``part_K.partial.npz``) and SamplingInterrupted is raised. The settings are recorded in
    ``out.parts/manifest.json`` (and, once finished, ``out.json``); parts made with other settings are an
    error, not silently mixed in. Returns ``out`` once it is complete, None if ``max_parts`` stopped it early.
    """
    from tqdm.auto import tqdm

    from vit5_sit.common import distributed as dist

    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples}: must be at least 1")
    check_model_sampler(model.cfg, sampler)
    check_second_guidance(trained_guidance, cfg_scale, guide)  # before any file is written
    if part_size < 1:
        raise ValueError(f"part_size={part_size}: must be at least 1")
    _check_batch_size(batch_size)
    seed = check_seeds(seed, num_samples)
    out = Path(out)
    cfg = model.cfg
    classes = list(range(cfg.num_classes)) if classes is None else [int(c) for c in classes]
    manifest = sampling_manifest(
        cfg, transport.cfg, sampler, num_samples=num_samples, classes=classes, seed=seed, cfg_scale=cfg_scale,
        guidance_interval=guidance_interval, guide_channels=guide_channels, vae=vae, image_size=image_size,
        identity=identity, part_size=part_size, batch_size=batch_size,
        guide=None if guide is None else (guide_identity or {"guide": "unnamed"}))
    if npz_is_complete(out, manifest):
        dist.print0(f"{out}: already complete ({num_samples} images with these settings)")
        return out

    parts = parts_dir(out)
    num_parts = -(-num_samples // part_size)
    part_file = [parts / f"part_{k:06d}.npz" for k in range(num_parts)]
    mpath = parts / "manifest.json"
    parts_manifest = {**manifest, "part_size": part_size}  # part k holds samples [k * part_size, ...)
    if mpath.is_file():  # checked by every process, so that all of them stop
        try:
            old = json.loads(mpath.read_bytes())
        except (OSError, ValueError) as e:
            raise SamplingStateError(
                f"{mpath} is unreadable ({type(e).__name__}), so the parts beside it cannot be matched to these "
                f"settings; delete {parts} to start over, or write to another output file") from None
        if old != parts_manifest:
            diff = "; ".join(_differences(old, parts_manifest))
            raise SamplingStateError(
                f"{parts} holds parts made with other settings ({diff}); delete that folder to start "
                "over, or write to another output file")
    elif dist.is_main():
        atomic_write_text(mpath, json.dumps(parts_manifest, indent=1))
    labels = sample_labels(num_samples, classes)
    if dist.is_main():
        _drop_damaged_parts(part_file, labels, part_size)
    dist.barrier()
    missing = [k for k in range(num_parts) if not part_file[k].is_file()]
    dist.barrier()  # every process has listed the parts before any writes a new one
    mine = missing[dist.rank()::dist.world_size()]
    if max_parts is not None:
        mine = mine[:max_parts]

    device = dist.device() if device is None else torch.device(device)
    if isinstance(vae, str | Path):
        from vit5_sit.data.vae import load_vae

        vae = load_vae(str(vae), device=device)
    sizes = [min(part_size, num_samples - k * part_size) for k in range(num_parts)]
    if dist.is_main():
        done = _images_done(part_file, sizes)
        if done:
            dist.print0(f"{parts}: {done} of {num_samples} images already done; sampling the other "
                        f"{num_samples - done}")
    kept = sum(_kept_images(part_file[k]) for k in mine)  # finished batches of an interrupted run
    bar = tqdm(total=sum(sizes[k] for k in mine), initial=kept, unit="img",
               desc=f"sampling (process 0 of {dist.world_size()})" if dist.world_size() > 1 else "sampling",
               disable=not (progress and dist.is_main()), dynamic_ncols=True, bar_format=BAR_FORMAT)
    evals = steps_per_batch(sampler)
    options = dict(cfg_scale=cfg_scale, guidance_interval=guidance_interval, guide_channels=guide_channels,
                   vae=vae, image_size=image_size, batch_size=batch_size, device=device, guide=guide,
                   trained_guidance=trained_guidance)
    k, batches = None, []
    try:
        for k in mine:
            lo, hi = k * part_size, k * part_size + sizes[k]
            batches = _read_partial(part_file[k], labels[lo:hi])  # finished batches of an interrupted run
            start = lo + sum(len(b) for b in batches)
            for b0 in range(start, hi, batch_size):  # batch boundaries from lo: the same as uninterrupted
                b1 = min(b0 + batch_size, hi)
                batches.append(sample_images(model, transport, sampler, labels[b0:b1].tolist(),
                                             list(range(seed + b0, seed + b1)),
                                             on_step=step_progress(bar, b1 - b0, evals), **options))
                if not evals:
                    bar.update(b1 - b0)
            _write_part(part_file[k], batches, labels, lo, seed)
            batches = []
            _partial_file(part_file[k]).unlink(missing_ok=True)
    except KeyboardInterrupt:
        bar.close()
        if batches and not part_file[k].is_file():
            _write_part(_partial_file(part_file[k]), batches, labels, k * part_size, seed)
        done = _images_done(part_file, sizes)
        raise SamplingInterrupted(
            f"interrupted at image {done} of {num_samples} ({done} kept in {parts}); run the same command "
            "again to continue") from None
    bar.close()
    dist.barrier()
    if max_parts is not None and any(not f.is_file() for f in part_file):
        return None
    if dist.is_main():
        manifest_path(out).unlink(missing_ok=True)  # an older file's manifest must not describe the new one
        _assemble(part_file, out, num_samples, labels)
        atomic_write_text(manifest_path(out), json.dumps(manifest, indent=1))
        if not keep_parts:
            shutil.rmtree(parts, ignore_errors=True)
    dist.barrier()
    return out


def _partial_file(part: Path) -> Path:
    """The finished batches of an interrupted part: ``part_000003.npz`` -> ``part_000003.partial.npz``."""
    return part.with_name(part.stem + ".partial.npz")


def _write_part(path: Path, batches: list[np.ndarray], labels: np.ndarray, lo: int, seed: int) -> None:
    """Images of samples lo, lo + 1, ... with their labels and seeds, written atomically."""
    images = np.concatenate(batches)
    hi = lo + len(images)
    buf = io.BytesIO()
    np.savez(buf, images=images, labels=labels[lo:hi], seeds=np.arange(seed + lo, seed + hi, dtype=np.int64))
    atomic_write_bytes(path, buf.getvalue())


def _read_partial(part: Path, part_labels: np.ndarray) -> list[np.ndarray]:
    """The finished batches kept by an interrupted run ([] if none, or if they don't fit this part)."""
    path = _partial_file(part)
    if not path.is_file():
        return []
    try:
        images, labels = _read_part(path)
    except SamplingStateError:
        return []  # an unreadable partial part is drawn again
    if len(images) > len(part_labels) or not np.array_equal(labels, part_labels[:len(labels)]):
        return []
    return [images]


def _drop_damaged_parts(part_files: list[Path], labels: np.ndarray, part_size: int) -> None:
    """Delete finished parts that cannot be read or hold other labels (damaged on disk after they were written
    atomically): each is a pure function of its seeds, so it is sampled again, the same, instead of failing the
    run at the end. Only the zip directory and the labels are read, not the images."""
    for k, path in enumerate(part_files):
        if not path.is_file():
            continue
        expect = labels[k * part_size:(k + 1) * part_size]
        try:
            with np.load(path) as data:
                ok = "images" in data.files and np.array_equal(data["labels"], expect)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            ok = False
        if not ok:
            print(f"warning: {path} is damaged (unreadable, or not the labels of part {k}); sampling it again",
                  flush=True)
            path.unlink(missing_ok=True)


def _images_done(part_files: list[Path], sizes: list[int]) -> int:
    """Images on disk: finished parts plus the kept batches of interrupted ones."""
    done = 0
    for path, size in zip(part_files, sizes):
        done += size if path.is_file() else _kept_images(path)
    return done


def _kept_images(part: Path) -> int:
    """How many images the partial file of ``part`` holds (0 if none or unreadable)."""
    try:
        with np.load(_partial_file(part)) as data:
            return len(data["labels"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return 0


def _assemble(part_files: list[Path], out: Path, num_samples: int, labels: np.ndarray) -> None:
    """Concatenate the parts into ``out`` (arr_0, arr_1) atomically, one part in memory at a time."""
    first = _read_part(part_files[0])[0]
    shape = (num_samples, *first.shape[1:])
    with atomic_write_file(out) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED,
                                                        allowZip64=True) as zf:
        with zf.open("arr_0.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False,
                    "shape": shape})
            written = 0
            for path in part_files:
                images, part_labels = _read_part(path)
                expect = labels[written:written + len(images)]
                if images.shape[1:] != shape[1:] or not np.array_equal(part_labels, expect):
                    raise SamplingStateError(
                        f"{path}: does not match the other parts (image shape {images.shape[1:]} or "
                        "labels differ); delete it and run again")
                f.write(np.ascontiguousarray(images).tobytes())
                written += len(images)
        if written != num_samples:
            raise SamplingStateError(f"{out}: the parts hold {written} images, expected {num_samples}")
        with zf.open("arr_1.npy", "w") as f:
            np.lib.format.write_array(f, labels.astype(np.int64))


def _read_part(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path) as data:
            return data["images"], data["labels"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise SamplingStateError(f"{path}: unreadable part file ({e}); delete it and run again") from None
