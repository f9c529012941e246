"""The sample.py command (vit5-sit-sample): a model's class-conditional images as a labelled PNG grid or a .npz.

    # the bundled demo model (MNIST digits): writes samples.png (ODE Euler, 6 network calls; on a busy 2-core
    # CPU about 8 s with OMP_NUM_THREADS=1, about 20 s without: set it first where other work runs)
    python sample.py
    python sample.py --one-step     # the one-step MeanFlow demo (1 network call an image): samples_1step.png

    # a run of ours (newest valid checkpoint), a checkpoint folder, or a model folder
    python sample.py --ckpt runs/mnist-vit5 --classes 0-9 --per-class 8 --out digits.png
    python sample.py --ckpt runs/vit5-xl2-in256/checkpoints/step_0400000 --cfg-scale 1.5 \\
        --classes "golden retriever,goldfish,207" --save-images out/

    # the official SiT-XL/2 file, with SiT's best sampler (SDE, 250 points = 249 steps), guided like SiT
    python sample.py --ckpt SiT-XL-2-256x256.pt --preset SiT-XL/2 --image-size 256 --cfg-scale 4.0 \\
        --sampler sde --steps 249 --guide-channels 3 --classes 207,360,387,974,88,979,417,279

    # 50,000 images for FID (ADM layout: arr_0 uint8 N x H x W x 3, arr_1 labels), on 8 GPUs; resumable
    accelerate launch --num_processes 8 sample.py --ckpt runs/vit5-xl2-in256 --num-samples 50000 \\
        --cfg-scale 1.5 --sampler sde --steps 249 --out samples/vit5-xl2.npz

--classes takes comma-separated class ids, id ranges (0-9) and, for 1000-class models, ImageNet class
names, matched case-insensitively against any synonym in vit5_sit/assets/imagenet_classes.txt.
Sample i has seed --seed + i, so an image does not depend on --batch-size or the number of processes.
A .npz run writes fixed parts of --part-size images to OUT.parts/ as it goes (Ctrl-C keeps the finished
batches of the part under way too); run the same command again after an interruption and it continues,
giving the file an uninterrupted run would have. Ctrl-C exits with code 130.
The sampler defaults come from the run's config (its `sampler` section), else ODE Euler with 50 steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from vit5_sit.cli.flags import guidance_flags, seed_flag
from vit5_sit.common.checks import (
    OutputLock,
    UsageError,
    finite_float,
    integer,
    output_file,
    output_folder,
    parse_device,
    path_text,
    positive_float,
    positive_int,
    storage_failure,
)
from vit5_sit.common.classes import DEFAULT_IMAGENET_CLASSES, MAX_GRID_CLASSES
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import quiet_when_piped

NPZ_DEFAULT_SAMPLES = 50_000
DEFAULT_OUT = "samples.png"        # the first quickstart command's grid
ONE_STEP_OUT = "samples_1step.png"  # --one-step's: its own name, so the two commands keep both grids
PART_SIZE = 256              # vit5_sit.sampling.generate.PART_SIZE (not imported: --help stays fast)
MAX_IMAGE_SIZE = 9_459       # pixels a side: isqrt(generate.MAX_GRID_PIXELS), the largest image PIL opens


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a typo such as --class must be an error, not a silent prefix match.
    p = Parser(description=__doc__, command="sample", formatter_class=argparse.RawDescriptionHelpFormatter)
    arg = p.add_argument
    arg("--ckpt", metavar="PATH", type=path_text, default=None,
        help="run folder (newest valid checkpoint), checkpoint folder, model folder, official SiT .pt "
             "file, or Hugging Face Hub repo id OWNER/NAME[@REVISION] (default: the bundled demo model)")
    arg("--one-step", action="store_true",
        help="sample the bundled one-step MeanFlow demo model (1 network call per image; = --ckpt demo-1step)")
    arg("--preset", default=None, help="official .pt files only: the model, e.g. SiT-XL/2 (default)")
    arg("--out", default=None, type=path_text, metavar="PNG_OR_NPZ",
        help=f"a .png grid (default: {DEFAULT_OUT}; with --one-step {ONE_STEP_OUT}) or a .npz of --num-samples "
             "images")
    arg("--classes", default=None, metavar="LIST",
        help="comma-separated ids, ranges (0-9) or ImageNet names (default: grid: every class of models "
             f"with at most {MAX_GRID_CLASSES}, ImageNet: {DEFAULT_IMAGENET_CLASSES}, else the first "
             f"{len(DEFAULT_IMAGENET_CLASSES)}; .npz: all, balanced)")
    arg("--per-class", type=positive_int, default=4, help="grid: images per class (default: 4)")
    arg("--num-samples", type=positive_int, default=None,
        help=f".npz: number of images (default: {NPZ_DEFAULT_SAMPLES}); image i has class "
             "classes[i %% len(classes)]")
    arg("--seed", type=integer, default=0,
        help="seed of the first image; image i has seed + i, each in [0, 2**32) (default: 0)")
    arg("--cfg-scale", type=finite_float, default=None,
        help="guidance scale (classifier-free, or autoguidance's weight with a guide); 1 = none (default: .png "
             "grids: the run config's log.sample_cfg_scale, the guidance of its training grids, else 1; .npz: 1)")
    arg("--guidance-interval", type=finite_float, nargs=2, default=None, metavar=("LOW", "HIGH"),
        help="guide only for t in [LOW, HIGH] (t = 0 noise, 1 data; default: .png grids: the run config's "
             "log.sample_guidance_interval, else 0 1)")
    arg("--guide-channels", type=positive_int, default=None, metavar="N",
        help="guide only the first N channels (3 reproduces the official SiT/DiT scripts; default: all)")
    arg("--guide", metavar="PATH", type=path_text, default=None,
        help="autoguidance: a bad version of the model (a run, checkpoint or model folder, or Hub repo id, trained "
             "on the same data and classes with the same objective, e.g. an early checkpoint of the same run; "
             "auto: the guide the --ckpt model folder carries or its run kept, train.guide_at; none: "
             "classifier-free guidance); --cfg-scale is then its weight w: guide + w (model - guide), within "
             "--guidance-interval (default: the model folder's guide/ if it carries one, else none)")
    arg("--sampler", choices=("ode", "sde", "meanflow"), default=None,
        help="default: the run config's, else ode; meanflow: a MeanFlow model's average-velocity steps (the "
             "only sampler of those models, 1 step = 1 network call by default)")
    arg("--method", default=None,
        help="ode: euler, heun, dpm++2m, dpm++3m (DPM-Solver++ multistep, one network call a step), dopri5, ...; "
             "sde: euler (Euler-Maruyama), heun (default: the config's)")
    arg("--steps", type=positive_int, default=None,
        help="fixed-step methods and MeanFlow models: steps (default: the config's; MeanFlow: 1)")
    arg("--tol", type=positive_float, default=None, metavar="TOL",
        help="adaptive ODE solvers (dopri5, ...): atol = rtol = TOL, e.g. 1e-5 for a FID reference (default: the "
             "config's atol / rtol, else 1e-6 / 1e-3)")
    arg("--grid", choices=("uniform", "shift", "logsnr", "edm"), default=None,
        help="fixed-step methods: where the steps go in t (shift: SD3's, shift 3; logsnr: equal steps in "
             "log(alpha/sigma); default: the config's)")
    arg("--scheduler", choices=("flow-euler", "dpm-solver", "unipc"), default=None,
        help="sample with a diffusers flow scheduler instead (FlowMatchEulerDiscreteScheduler, "
             "DPMSolverMultistepScheduler / UniPCMultistepScheduler with flow sigmas), --steps steps; "
             "linear-path models only; needs diffusers")
    arg("--image-size", type=positive_int, default=None, metavar="PX",
        help="output size in pixels (default: the trained size; official files: 256)")
    arg("--vae", default=None, type=path_text, metavar="NAME_OR_PATH",
        help="latent models: VAE hub name or folder (default: the run config's; official files: "
             "stabilityai/sd-vae-ft-ema)")
    arg("--save-images", default=None, type=path_text, metavar="DIR", help="grid: also write each image as a PNG here")
    arg("--batch-size", type=positive_int, default=64, help="images per forward per process (default: 64)")
    arg("--part-size", type=positive_int, default=None,
        help=f".npz: images per part file, fixed for a run (default: {PART_SIZE})")
    arg("--device", default=None, help="cuda, cpu, ... (default: this process's accelerator, else cpu)")
    arg("--no-progress", action="store_true", help="no progress bar")
    return p


@dataclasses.dataclass
class Loaded:
    model: object          # Denoiser in eval mode, on the CPU
    cfg: object            # ExperimentConfig, None for official files
    path: Path
    official: bool
    factor: int            # pixels per model input pixel: 8 for VAE latents, 1 for pixel models
    input_size: int        # the model input size to sample at


def load_model(args) -> Loaded:
    from vit5_sit.common.utils import check_choice
    from vit5_sit.config import LATENT_DOWNSAMPLE
    from vit5_sit.hub.model_files import (
        DEMO_MODEL,
        ModelLoadError,
        load_for_sampling,
        load_official,
        local_model_path,
    )
    from vit5_sit.models import PRESETS

    if args.one_step:
        if args.ckpt is not None:
            raise UsageError(f"--one-step with --ckpt {args.ckpt}: --one-step samples the bundled one-step demo "
                             "(--ckpt demo-1step); give one of the two")
        args.ckpt = "demo-1step"
    if args.ckpt is None:
        if not (DEMO_MODEL / "config.yaml").is_file():
            raise UsageError(f"--ckpt not given and the bundled demo model is missing ({DEMO_MODEL} should "
                             "hold config.yaml and transformer/diffusion_pytorch_model.safetensors); pass --ckpt "
                             "RUN_OR_CHECKPOINT")
        path = DEMO_MODEL
    else:
        try:
            path = local_model_path(args.ckpt)  # a Hub repo id: its folder in the Hugging Face cache
        except ModelLoadError as e:
            raise UsageError(f"--ckpt: {e}") from None
        if not path.exists():
            raise UsageError(f"--ckpt: no such file or folder: {path}")
        if not path.is_file() and not path.is_dir():
            raise UsageError(f"--ckpt: {path} is neither a file nor a folder (a device or a pipe); give an "
                             "official .pt file or one of our folders")
    official = path.is_file()
    if args.preset is not None and not official:
        raise UsageError(f"--preset: applies to official .pt files only; {path} has its own config.yaml")
    if args.preset is not None:
        check_choice("--preset", args.preset, PRESETS, error=UsageError)
    try:
        if official:
            model, cfg = load_official(path, args.preset, args.image_size), None
        else:
            model, cfg = load_for_sampling(path, device="cpu")
    except (ModelLoadError, ValueError, FileNotFoundError) as e:  # ValueError: ConfigError, a file that does not fit
        raise UsageError(str(e) if str(e).startswith("--image-size") else f"--ckpt: {e}") from None
    latent = official or (cfg is not None and cfg.data.kind == "latents")
    factor = LATENT_DOWNSAMPLE if latent else 1
    input_size = model.cfg.input_size
    if args.image_size is not None and not official:
        unit = factor * model.cfg.patch_size
        if args.image_size % unit:
            p = model.cfg.patch_size
            why = f"{factor} pixels per latent x patch size {p}" if latent else f"its patch size {p}"
            raise UsageError(f"--image-size {args.image_size}: this model needs a multiple of {unit} "
                             f"({why}); it was trained at {model.cfg.input_size * factor}")
        input_size = args.image_size // factor
    return Loaded(model, cfg, path, official, factor, input_size)


def folder_guide(loaded: Loaded) -> Path | None:
    """The guide a model folder carries (``guide/``, as `Vit5SitPipeline.from_pretrained` takes it), else None."""
    from vit5_sit.hub.guide import is_guide_folder
    from vit5_sit.hub.layout import GUIDE_FOLDER

    folder = loaded.path / GUIDE_FOLDER
    return folder if not loaded.official and loaded.path.is_dir() and is_guide_folder(folder) else None


def load_guide(args, loaded: Loaded):
    """The autoguidance guide (a Denoiser), or None: ``--guide PATH``, ``auto`` (the guide the model folder carries,
    else the one the run kept, train.guide_at), ``none``; without the flag, the model folder's guide if it carries
    one, as the pipeline does. Checked against the model before any sampling: one error naming the difference."""
    from vit5_sit.hub.guide import load_guide as load
    from vit5_sit.hub.model_files import ModelLoadError, kept_guide, local_model_path
    from vit5_sit.transport import GuidanceError

    spec = args.guide
    if spec == "none" or (spec is None and folder_guide(loaded) is None):
        args.guide = None
        return None
    if args.guide_channels is not None:
        raise UsageError(f"--guide-channels {args.guide_channels}: the official scripts' channel subset is for "
                         "classifier-free guidance; leave it out with a guide (--guide none: no guide)")
    if loaded.cfg is None:
        raise UsageError(f"--guide {spec}: autoguidance is for our models; an official .pt file has no config "
                         "to check a guide against")
    try:
        if spec is None or spec == "auto":
            path = folder_guide(loaded) or kept_guide(loaded.path)
        else:
            path = local_model_path(spec)
            if not path.exists():
                raise ModelLoadError(f"no such file or folder: {path}")
            if path.is_file():
                raise ModelLoadError(f"{path}: a guide is one of our run, checkpoint or model folders (or a Hub "
                                     "repo id), not an official .pt file")
        guide = load(path, loaded.cfg)
    except (ModelLoadError, GuidanceError, ValueError, FileNotFoundError) as e:
        raise UsageError(f"--guide: {e}") from None
    args.guide = str(path)  # resolved: what the log line and an .npz manifest name
    return guide


def sampler_config(args, cfg, model_cfg=None):
    """The run config's sampler (else the defaults: ODE Euler, or 1 MeanFlow step for a MeanFlow model) with the
    --sampler/--method/--steps flags applied."""
    from vit5_sit.sampling.generate import sampler_settings
    from vit5_sit.transport import SamplerConfig

    if args.scheduler is not None:
        if args.sampler is not None or args.method is not None or args.grid is not None or args.tol is not None:
            raise UsageError(f"--scheduler {args.scheduler}: samples with that diffusers scheduler; leave out "
                             "--sampler/--method/--grid/--tol (or leave out --scheduler)")
        steps = args.steps or (cfg.sampler.steps if cfg is not None else None)
        return sampler_settings(None, "ode", "euler", steps)  # its steps, one network call each
    base = cfg.sampler if cfg is not None else None
    if base is None and getattr(model_cfg, "mean_flow", False):
        base = SamplerConfig(mode="meanflow", method="euler", steps=1)
    try:
        return sampler_settings(base, args.sampler, args.method, args.steps, args.grid, args.tol)
    except ValueError as e:
        raise UsageError(f"--sampler/--method/--steps/--grid/--tol: {e}") from None


def sampler_source(args, cfg) -> str:
    """Where the sampler settings came from, for the line sample.py prints before sampling."""
    flags = [f for f, v in (("--sampler", args.sampler), ("--method", args.method), ("--steps", args.steps),
                            ("--grid", args.grid), ("--tol", args.tol)) if v is not None]
    base = "the model's config" if cfg is not None else "the default"
    return f"{base} with {', '.join(flags)}" if flags else base


def vae_for(args, loaded: Loaded):
    from vit5_sit.data.vae import DEFAULT_VAE

    if loaded.factor == 1:
        if args.vae is not None:
            raise UsageError("--vae: this model works on pixels, not VAE latents; leave --vae out")
        return None
    if args.vae is not None or loaded.cfg is None:
        return args.vae or DEFAULT_VAE
    from vit5_sit.hub.model_files import model_vae

    return model_vae(loaded.path, loaded.cfg)  # a model folder's own vae/, else the config's data.vae


def classes_for(args, num_classes: int, grid: bool) -> list[int]:
    from vit5_sit.common.classes import ClassSpecError, grid_classes, parse_classes

    if args.classes is not None:
        try:
            return parse_classes(args.classes, num_classes)
        except ClassSpecError as e:
            raise UsageError(f"--classes: {e}") from None
    return grid_classes(num_classes) if grid else list(range(num_classes))


def check_flags(args) -> bool:
    """Flag combinations that cannot work; returns whether --out is a grid."""
    if args.out is None:  # each quickstart command its own file: --one-step does not overwrite the flow demo's grid
        args.out = ONE_STEP_OUT if args.one_step else DEFAULT_OUT
    out = Path(args.out)
    if out.suffix.lower() not in (".png", ".npz"):
        raise UsageError(f"--out {out}: expected a .png grid or a .npz file of samples")
    grid = out.suffix.lower() == ".png"
    if grid and (args.num_samples is not None or args.part_size is not None):
        raise UsageError("--num-samples/--part-size: for .npz outputs; a .png grid has --per-class images of "
                         "each class")
    if not grid and args.scheduler is not None:
        raise UsageError("--scheduler: for .png grids; a .npz for FID takes our solvers (e.g. --method dpm++2m), "
                         "whose settings its resumable parts record")
    if not grid and args.save_images is not None:
        raise UsageError("--save-images: for .png grids; a .npz holds the images itself")
    if args.image_size is not None and args.image_size > MAX_IMAGE_SIZE:
        raise UsageError(f"--image-size {args.image_size}: at most {MAX_IMAGE_SIZE} (a larger image has more "
                         f"pixels than PIL opens); models sample well near the size they were trained at")
    guidance_flags(args.cfg_scale, args.guidance_interval)
    seed_flag(args.seed, 1 if grid else args.num_samples or NPZ_DEFAULT_SAMPLES)  # a grid's count: below
    output_file(out, "--out")
    if args.save_images is not None:
        output_folder(args.save_images, "--save-images")
    args.device = parse_device(args.device)
    return grid


def run(args) -> int:
    from vit5_sit.common import distributed as dist

    grid = check_flags(args)
    lock = OutputLock(args.out)  # a second run on the same --out is refused, before any work
    refused = None
    if dist.is_main():
        try:
            lock.acquire()
        except UsageError as e:
            refused = str(e)
    if dist.world_size() > 1:  # every process of a launch stops, not only the main one
        import torch.distributed

        box = [refused]
        torch.distributed.broadcast_object_list(box, src=0)
        refused = box[0]
    if refused:
        raise UsageError(refused)
    try:
        return _run(args, grid)
    finally:
        lock.release()


def _run(args, grid: bool) -> int:
    from vit5_sit.common import distributed as dist
    from vit5_sit.data.vae import VAELoadError
    from vit5_sit.sampling.generate import SamplingInterrupted, SamplingStateError
    from vit5_sit.transport import GuidanceError, Transport, TransportConfig, check_guidance
    from vit5_sit.transport.guidance import check_second_guidance, trained_guidance
    from vit5_sit.transport.samplers import FIXED_STEP_METHODS, SolverError

    loaded = load_model(args)
    mcfg = loaded.model.cfg
    if args.guide_channels is not None and args.guide_channels > mcfg.in_channels:
        raise UsageError(f"--guide-channels {args.guide_channels}: the model has {mcfg.in_channels} channels")
    sampler = sampler_config(args, loaded.cfg, mcfg)
    if args.cfg_scale is None and args.guide not in (None, "none", "auto"):
        raise UsageError(f"--guide {args.guide}: give its weight with --cfg-scale W (guide + W (model - guide); "
                         "1 = the model alone; 1.5-3 is the usual range)")
    if args.cfg_scale is None:
        args.cfg_scale = loaded.cfg.log.sample_cfg_scale if grid and loaded.cfg is not None else 1.0
    if args.guidance_interval is None:
        args.guidance_interval = (loaded.cfg.log.sample_guidance_interval if grid and loaded.cfg is not None
                                  else (0.0, 1.0))
    trained = trained_guidance(loaded.cfg) if loaded.cfg is not None else 1.0  # a MeanFlow model's, 1 = none
    try:
        if args.guide is None:  # autoguidance needs no null label: the guide is conditional
            check_guidance(args.cfg_scale, mcfg.class_dropout_prob)
        check_second_guidance(trained, args.cfg_scale, args.guide)
    except GuidanceError as e:
        raise UsageError(f"--cfg-scale: {e}") from None
    transport = Transport(loaded.cfg.transport if loaded.cfg is not None else TransportConfig())
    scheduler = None
    if args.scheduler is not None:
        from vit5_sit.transport.diffusers_schedulers import SchedulerError, check_scheduler, make_scheduler

        try:
            scheduler = make_scheduler(args.scheduler)
            check_scheduler(scheduler, transport)
        except SchedulerError as e:
            raise UsageError(f"--scheduler: {e}") from None
    from vit5_sit.sampling.generate import SamplerMismatch, check_model_sampler

    try:
        check_model_sampler(mcfg, sampler, scheduler)
    except SamplerMismatch as e:
        raise UsageError(f"--sampler: {e}") from None
    guide = load_guide(args, loaded)
    common = dict(
        vae=vae_for(args, loaded), image_size=loaded.input_size, batch_size=args.batch_size,
        device=args.device or dist.device(), cfg_scale=args.cfg_scale,
        guidance_interval=tuple(args.guidance_interval), guide_channels=args.guide_channels,
        trained_guidance=trained)
    if guide is not None:
        common["guide"] = guide
    if scheduler is not None:  # grids only (check_flags)
        common["scheduler"] = scheduler
    classes = classes_for(args, mcfg.num_classes, grid)
    size = loaded.input_size * loaded.factor
    if grid:
        seed_flag(args.seed, len(classes) * args.per_class)
        check_grid_size(len(classes), args.per_class, size, args.image_size is not None)
    steps = f" {sampler.steps} steps" if sampler.method in FIXED_STEP_METHODS else ""
    if sampler.method in FIXED_STEP_METHODS and sampler.grid != "uniform":
        steps += f" on the {sampler.grid} grid"
    if sampler.mode == "ode" and sampler.method not in FIXED_STEP_METHODS:
        steps += f" atol {sampler.atol:g} rtol {sampler.rtol:g}"
    name = f"{sampler.mode}/{sampler.method}" if scheduler is None else f"diffusers {type(scheduler).__name__}"
    guidance = f"autoguidance {args.cfg_scale:g}" if guide is not None else f"cfg {args.cfg_scale:g}"
    low, high = args.guidance_interval
    if args.cfg_scale != 1 and (low, high) != (0, 1):
        guidance += f" on t in [{low:g}, {high:g}]"
    what = f"{size}x{size}, {name}{steps}, {guidance}"
    source = sampler_source(args, loaded.cfg) if scheduler is None else "--scheduler"
    shown_guide = f" (guide: {args.guide})" if guide is not None else ""
    dist.print0(f"sampler {name}{steps} ({source}), {guidance}{shown_guide}")
    start = time.perf_counter()
    try:
        if grid:
            if dist.is_main():
                write_grid(args, loaded, transport, sampler, classes, common)
                print(f"wrote {args.out}: {len(classes)} classes x {args.per_class} images ({what}) in "
                      f"{time.perf_counter() - start:.1f} s")
        else:
            n = write_npz(args, loaded, transport, sampler, classes, common)
            if n:
                dist.print0(f"wrote {args.out}: {n} images ({what}) in {time.perf_counter() - start:.1f} s")
    except VAELoadError as e:
        raise UsageError(f"--vae: {e}") from None
    except SolverError as e:
        raise UsageError(f"--tol/--cfg-scale: {e}") from None
    except SamplingStateError as e:
        raise UsageError(f"--out: {e}") from None
    except SamplingInterrupted as e:
        return interrupted(str(e))
    except GridInterrupted as e:
        return interrupted(f"interrupted at step {e.done} of {e.total} of the grid (a grid is written whole, "
                           f"nothing was written); run the same command again to sample it")
    return 0


def check_grid_size(nrow: int, ncol: int, size: int, sized: bool = False) -> None:
    """Refuse, before sampling, a grid larger than PIL (and most viewers) will open again, naming the flags that
    make it so (``sized``: --image-size was given)."""
    from vit5_sit.sampling.generate import MAX_GRID_PIXELS, grid_pixels

    pixels = grid_pixels(nrow, ncol, size)
    if pixels > MAX_GRID_PIXELS:
        flags = "--classes/--per-class" + ("/--image-size" if sized else "")
        raise UsageError(f"{flags}: a grid of {nrow} x {ncol} images of {size}px has {pixels:,} pixels, more than "
                         f"PIL opens ({MAX_GRID_PIXELS:,}); draw fewer or smaller, or write them to --out FILE.npz")


class GridInterrupted(Exception):
    def __init__(self, done: int, total: int):
        super().__init__(f"{done}/{total}")
        self.done, self.total = done, total


def interrupted(message: str) -> int:
    from vit5_sit.common.interrupt import EXIT_CODE

    print(message, file=sys.stderr, flush=True)
    return EXIT_CODE


def write_grid(args, loaded: Loaded, transport, sampler, classes: list[int], common: dict) -> None:
    from tqdm.auto import tqdm

    from vit5_sit.common.classes import class_label
    from vit5_sit.sampling.generate import BAR_FORMAT, sample_images, save_labelled_grid, steps_per_batch

    labels = [c for c in classes for _ in range(args.per_class)]
    seeds = list(range(args.seed, args.seed + len(labels)))
    # The bar counts sampler steps (Heun's two evaluations a step count as one), over all batches.
    evals = steps_per_batch(sampler)
    steps = sampler.steps + (sampler.mode == "sde" and sampler.last_step != "none")
    batches = -(-len(labels) // args.batch_size)
    bar = tqdm(total=steps * batches if evals else None, unit="step", desc=f"sampling {len(labels)} images",
               disable=args.no_progress, dynamic_ncols=True, bar_format=BAR_FORMAT if evals else None)
    try:
        images = sample_images(loaded.model, transport, sampler, labels, seeds,
                               on_step=lambda: bar.update(steps / evals if evals else 1), **common)
    except KeyboardInterrupt:
        bar.close()
        raise GridInterrupted(round(bar.n), bar.total or round(bar.n)) from None
    bar.close()
    row_labels = [class_label(c, loaded.model.cfg.num_classes) for c in classes]
    save_labelled_grid(images, args.out, args.per_class, row_labels)
    if args.save_images is not None:
        from PIL import Image

        from vit5_sit.common.utils import atomic_write_file

        folder = Path(args.save_images)
        folder.mkdir(parents=True, exist_ok=True)
        for image, label, seed in zip(images, labels, seeds):
            with atomic_write_file(folder / f"seed{seed:06d}_class{label:04d}.png") as tmp:  # never half a PNG
                Image.fromarray(image).save(tmp, format="PNG")


def guide_identity(path: Path) -> dict:
    """What a guide was loaded from, for an .npz manifest: a run, checkpoint or model folder as `model_identity`
    names it; a model folder's guide/ by its weights' sha256."""
    from vit5_sit.common.utils import file_digest
    from vit5_sit.hub.guide import is_guide_folder
    from vit5_sit.hub.model_files import model_identity

    if is_guide_folder(path):
        weights = path / "diffusion_pytorch_model.safetensors"
        return {"weights": f"{path.name}/{weights.name}", "sha256": file_digest(weights)}
    return model_identity(path)


def write_npz(args, loaded: Loaded, transport, sampler, classes: list[int], common: dict) -> int:
    from vit5_sit.hub.model_files import model_identity
    from vit5_sit.sampling.generate import manifest_path, sample_to_npz

    num_samples = args.num_samples or NPZ_DEFAULT_SAMPLES
    identity = {**model_identity(loaded.path, args.preset), "input_size": loaded.input_size}
    if "guide" in common:  # samples of another guide are never mixed in
        common = {**common, "guide_identity": guide_identity(Path(args.guide))}
    done = manifest_path(args.out)
    before = done.stat().st_mtime_ns if done.is_file() else None
    out = sample_to_npz(loaded.model, transport, sampler, args.out, num_samples=num_samples, classes=classes,
                        seed=args.seed, part_size=args.part_size or PART_SIZE, identity=identity,
                        progress=not args.no_progress, **common)
    finished_now = out is not None and (before is None or done.stat().st_mtime_ns != before)
    return num_samples if finished_now else 0  # 0: it was complete already, or max_parts stopped it


@quiet_when_piped
def main(argv: list[str] | None = None) -> int:
    from vit5_sit.common.interrupt import sigterm_as_ctrl_c

    try:
        with sigterm_as_ctrl_c():  # `kill`, `timeout`, a scheduler's stop: kept work and lock as for Ctrl-C
            args = build_parser().parse_args(argv)
            return run(args)
    except KeyboardInterrupt:  # while starting up (imports, loading the model): nothing to keep
        return interrupted("interrupted before any image was finished; run the same command again")
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a read-only folder
        return storage_failure(e, "a grid is written whole: nothing was written"
                               if Path(args.out).suffix.lower() == ".png" else
                               f"every finished part is kept in {args.out}.parts: run the same command again to "
                               "continue")


if __name__ == "__main__":
    sys.exit(main())
