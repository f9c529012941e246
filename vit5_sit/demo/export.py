"""Export a run's EMA weights as a model folder (as the bundled demo, ``vit5_sit/assets/demo``, was made).

    python -m vit5_sit.demo export runs/mnist-vit5 --out my_model  # newest valid checkpoint; sample.py --ckpt my_model
    python -m vit5_sit.demo export runs/mnist-vit5 --out my_model --push me/vit5-mnist   # and upload it
    python -m vit5_sit.demo export vit5_sit/assets/demo --out demo-diffusers   # a model folder, in today's layout
    python -m vit5_sit.demo export SiT-XL-2-256x256.pt --out sit-xl2-256 --no-samples   # an official SiT file

``--out`` is required: an export never replaces the bundled demo model unless told to (``--out
vit5_sit/assets/demo``). The folder holds ``config.yaml`` (the run's resolved config), the EMA weights in float16
(``transformer/diffusion_pytorch_model.safetensors``; half the size, cast back to float32 when loaded), diffusers'
layout with its generated code (`vit5_sit.hub.layout`: ``DiffusionPipeline.from_pretrained(FOLDER,
trust_remote_code=True)`` loads it without vit5-sit), ``samples.png`` (the grid ``python sample.py --ckpt
FOLDER`` draws: every class, 4 seeds each, with the folder's own sampler and guidance; ``--no-samples`` leaves it
out), ``README.md`` (a model card: preset, parameters, training, sampler defaults, the sample grid, and the
metrics ``eval_fid.py compare`` measured for this checkpoint, also in ``metrics.json``). ``--push`` uploads it
to a Hugging Face Hub model repo (see `vit5_sit.hub.api`).

The export is written into a new folder beside ``--out``, checked (loaded back as every loader loads it; no
file naming a local path of this machine, `vit5_sit.hub.public`) and then renamed onto ``--out``: a failure or a
kill leaves ``--out`` as it was (an earlier export, or none), and a source that cannot make a folder that loads
(weights missing a key, truncated, NaN) is one error with nothing written. ``--out`` is replaced whole, so a
folder holding other files than a model folder's is refused.

An official SiT ``.pt`` file converts to the same layout (`vit5_sit.hub.official`): ``--preset`` names its model
(default SiT-XL/2), ``--image-size`` its resolution (default 256) and ``--vae`` the VAE stored in ``vae/`` (default
stabilityai/sd-vae-ft-ema), as ``sample.py`` takes them; its weights stay float32. On a CPU, ``--no-samples``: the
grid of an XL/2 model with SiT's 250-step sampler takes hours there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vit5_sit.common.checks import ModelLoadError, UsageError, finite_float, output_folder, path_text, positive_int
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import stops_cleanly

if TYPE_CHECKING:
    import torch

DEMO_MODEL = Path(__file__).parent.parent / "assets" / "demo"  # = vit5_sit.hub.model_files.DEMO_MODEL (which
                                                                # imports torch)


def export_model(run_or_ckpt: str | Path, out: str | Path,
                 dtype: torch.dtype | None = None,  # None = torch.float16 (half the size); official files: float32
                 cfg_scale: float | None = None, sampler: list[str] | None = None,
                 repo_id: str | None = None, samples: bool = True, progress: bool = False,
                 preset: str | None = None, image_size: int | None = None, vae=None,
                 guidance_interval: tuple[float, float] | None = None,  # None = the run's
                 guide: str | Path | None = None,
                 measured: list[str | Path] | None = None,  # bench_guidance.py records of this checkpoint
                 ) -> Path:
    """Write ``out/config.yaml``, the weights (``transformer/diffusion_pytorch_model.safetensors``) with the rest
    of diffusers' layout, ``out/samples.png`` (``samples``: see `draw_samples`) and the card ``out/README.md``
    from a run, checkpoint or model folder, or an official ``.pt`` file (``repo_id``: the Hub repo the card's
    examples name).

    The config is the run's with ``train.max_steps`` set to the exported checkpoint's step (the recipe that
    reproduces these weights); the card lists the metrics cached for that step by ``eval_fid.py compare``.
    ``cfg_scale``: the guidance scale ``sample.py`` uses for this model's grids by default (stored as the
    config's ``log.sample_cfg_scale``) and ``guidance_interval`` its interval in t (``log.sample_guidance_interval``);
    None keeps the run's. ``sampler``: overrides of the config's sampler
    section, e.g. ``["sampler.mode=sde", "sampler.steps=50"]`` (sample.py's default for this model).
    ``preset``, ``image_size``, ``vae`` (a name, a folder or a loaded AutoencoderKL): official ``.pt`` files only
    (defaults SiT-XL/2, 256, stabilityai/sd-vae-ft-ema), see `export_official`; for our folders they are an error.
    ``guide``: autoguidance's guide, written as the folder's ``guide/`` (a model, run or checkpoint folder, or
    "auto": the guide the run kept, `vit5_sit.hub.model_files.kept_guide`), checked against the model first; None
    keeps the guide of a model folder exported again, "none" writes the folder without one.
    ``measured``: records of ``benchmarks/bench_guidance.py --json`` that measured this checkpoint (FID, sFID,
    precision, recall, digits, speckle by steps and guidance): their rows join the card's metrics (`measured_rows`).
    """
    from vit5_sit.common.checks import ModelLoadError

    if Path(run_or_ckpt).is_file() and guide not in (None, "none"):
        raise ModelLoadError("--guide: an official .pt file is exported alone; export it, then add a guide with "
                             "Vit5SitPipeline.from_pretrained(folder, guide=...).save_pretrained(folder)")
    if Path(run_or_ckpt).is_file():
        return export_official(run_or_ckpt, out, preset=preset, image_size=image_size, vae=vae, dtype=dtype,
                               cfg_scale=cfg_scale, guidance_interval=guidance_interval, sampler=sampler,
                               repo_id=repo_id, samples=samples,
                               progress=progress)
    if preset is not None or image_size is not None or vae is not None:
        raise ModelLoadError("--preset/--image-size/--vae apply to official .pt files only; this folder has its "
                             "own config.yaml (its data.vae names the VAE)")
    import torch

    from vit5_sit.hub.agreement import check_record
    from vit5_sit.hub.api import collect_metrics, config_at_step, model_card, read_metrics, write_model_folder
    from vit5_sit.hub.model_files import model_vae, read_weights, resolve_checkpoint, weights_file

    dtype = torch.float16 if dtype is None else dtype
    folder, config_path = resolve_checkpoint(run_or_ckpt)
    overrides = guidance_overrides(cfg_scale, guidance_interval) + list(sampler or [])
    cfg = config_at_step(config_path, folder, overrides)
    run = folder.parent.parent if folder.parent.name == "checkpoints" else None
    metrics = collect_metrics(run, cfg.train.max_steps) if run is not None else read_metrics(folder)
    metrics = [*measured_rows(measured or (), folder, cfg), *metrics]
    ema = read_weights(weights_file(folder))  # truncated or not safetensors: one line
    check_record(weights_file(folder), config_at_step(config_path, folder), folder)  # what the weights say they are
    vae = model_vae(folder, cfg) if cfg.data.kind == "latents" else None  # a model folder's own vae/ first
    if guide is None and (folder / "guide" / "config.json").is_file():
        guide = folder / "guide"  # a model folder's guide goes with it (its default guidance weighs it)
    if guide is not None and str(guide) != "none":  # checked against the model (data shape, classes, kind,
        from vit5_sit.hub.guide import load_guide  # transport) before writing
        from vit5_sit.hub.model_files import kept_guide

        guide = load_guide(kept_guide(run_or_ckpt) if str(guide) == "auto" else guide, cfg)
    else:
        guide = None
    num_params = sum(v.numel() for v in ema.values())
    return write_export(
        out, lambda stage: write_model_folder(stage, ema, cfg, metrics=metrics, dtype=dtype, source=str(folder),
                                              repo_id=repo_id, vae=vae, guide=guide),
        lambda: model_card(cfg, num_params, metrics, repo_id, has_samples=True, guided=guide is not None),
        samples=samples, progress=progress, sources=[folder])


def guidance_overrides(cfg_scale: float | None, interval: tuple[float, float] | None) -> list[str]:
    """The config overrides that set a folder's default guidance (None: the run's)."""
    return ([f"log.sample_cfg_scale={cfg_scale}"] if cfg_scale is not None else []) + \
        ([f"log.sample_guidance_interval=[{interval[0]},{interval[1]}]"] if interval is not None else [])


def measured_rows(records, folder: Path, cfg) -> list[dict]:
    """The card's metrics rows of ``benchmarks/bench_guidance.py --json`` records: one per row, its settings named
    as `eval_fid.py compare` names them (``n1000_seed0_meanflow_euler_1steps_cfg2.5``; autoguidance
    ``..._auto3_guide-LABEL`` with the record's label of its guide; an interval appended as ``_gi0-0.5``). A
    record that measured another checkpoint than ``folder`` is one error, not a wrong card."""
    import json

    from vit5_sit.hub.model_files import resolve_checkpoint

    default = (float(cfg.log.sample_cfg_scale), [float(v) for v in cfg.log.sample_guidance_interval])

    def is_default(r) -> bool:  # the folder's default guidance first: the card quotes it
        return (float(r["scale"]), [float(v) for v in r["interval"]]) == default

    rows = []
    for record in records:
        try:
            data = json.loads(Path(record).read_text())
            measured, found = Path(data["model"]), data["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"--measured {record}: not a bench_guidance.py --json record ({e})") from None
        if not measured.exists() or resolve_checkpoint(measured)[0].resolve() != folder.resolve():
            raise ModelLoadError(f"--measured {record}: it measured {measured}, not {folder}; give the records of "
                                 "the exported checkpoint")
        for r in sorted(found, key=lambda r: (not is_default(r), r.get("steps", 0), float(r["scale"]))):
            interval = "" if list(r["interval"]) == [0.0, 1.0] else f"_gi{r['interval'][0]:g}-{r['interval'][1]:g}"
            guidance = f"auto{r['scale']:g}_guide-{r['guide']}" if r.get("guide") else f"cfg{r['scale']:g}"
            settings = (f"n{r['num_samples']}_seed{r['seed']}_{cfg.sampler.mode}_{cfg.sampler.method}_"
                        f"{r.get('steps', cfg.sampler.steps)}steps_{guidance}{interval}")
            rows.append({"settings": settings, "step": cfg.train.max_steps,
                         "measured_by": "benchmarks/bench_guidance.py",
                         "reference": Path(str(data.get("reference", ""))).name or None,
                         **{k: r[k] for k in ("fid", "sfid", "precision", "recall", "digit_accuracy", "speckle",
                                              "num_samples") if k in r}})
    return rows


def export_official(path: str | Path, out: str | Path, *, preset: str | None = None, image_size: int | None = None,
                    vae=None, dtype: torch.dtype | None = None, cfg_scale: float | None = None,
                    guidance_interval: tuple[float, float] | None = None, sampler: list[str] | None = None,
                    repo_id: str | None = None, samples: bool = True,
                    progress: bool = False) -> Path:
    """An official SiT file (a raw state dict, e.g. ``SiT-XL-2-256x256.pt``, read with ``weights_only=True``) as
    a model folder: ``preset`` (default SiT-XL/2) at ``image_size`` pixels (default 256), SiT's ImageNet recipe
    as its config (`vit5_sit.hub.official.official_config`), ``vae`` stored in ``vae/`` (default the config's:
    stabilityai/sd-vae-ft-ema), float32 weights unless ``dtype`` says otherwise."""
    from vit5_sit.common.checks import ModelLoadError
    from vit5_sit.config import ConfigError, with_overrides
    from vit5_sit.data.vae import DEFAULT_VAE
    from vit5_sit.hub.api import model_card, write_model_folder
    from vit5_sit.hub.model_files import OFFICIAL_PRESET, load_official
    from vit5_sit.hub.official import official_config

    path = Path(path)
    preset = preset or OFFICIAL_PRESET
    model = load_official(path, preset, image_size)
    cfg = official_config(model.cfg, preset, str(vae) if isinstance(vae, str | Path) else DEFAULT_VAE, path)
    try:  # --cfg-scale / --guidance-interval / --sampler: overrides, checked as for our runs
        cfg = with_overrides(cfg, guidance_overrides(cfg_scale, guidance_interval) + list(sampler or []))
    except ConfigError as e:
        raise ModelLoadError(str(e)) from None
    state = model.state_dict()
    num_params = sum(v.numel() for v in state.values())
    return write_export(
        out, lambda stage: write_model_folder(stage, state, cfg, dtype=dtype, source=str(path), repo_id=repo_id,
                                              vae=vae, converted_from=str(path)),
        lambda: model_card(cfg, num_params, (), repo_id, has_samples=True, converted_from=str(path)),
        samples=samples, progress=progress, sources=[path] + ([Path(vae)] if isinstance(vae, str | Path) else []))


# Top-level names of a model folder (`vit5_sit.hub.files.MODEL_FILES`, code files with their hash, autoguidance's
# guide/): a destination holding anything else is not replaced (an export replaces the whole folder).
EXPORTED_NAMES = ("config.yaml", "ema.safetensors", "README.md", "metrics.json", "samples.png", "model_index.json",
                  "pipeline_vit5_sit*.py", "transformer", "scheduler", "vae", "guide", ".*.tmp")


def replaceable_problem(out: Path) -> str | None:
    """Why an export may not replace the folder ``out``, or None: it holds what no export writes (notes, a git
    clone's .git, another project), which the replacement would delete."""
    import fnmatch

    from vit5_sit.hub.files import MODEL_FILES

    if out.exists() and not out.is_dir():
        return "is a file, not a folder; give a folder"
    if not out.is_dir():
        return None
    names = {*EXPORTED_NAMES, *(p.split("/")[0] for p in MODEL_FILES)}
    foreign = sorted(p.name for p in out.iterdir() if not any(fnmatch.fnmatchcase(p.name, n) for n in names))
    if not foreign:
        return None
    more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
    return (f"holds {', '.join(foreign[:3])}{more}, which are no files of a model folder, and an export replaces the "
            "whole folder; give a new folder (or an earlier export), or move them out")


def write_export(out: str | Path, write, card, *, samples: bool, progress: bool, sources: list) -> Path:
    """Write a model folder atomically: ``write(stage)`` fills a new folder beside ``out``, ``samples.png`` is
    drawn from it (``samples``) and ``card()`` rewritten to show it, then what was written is checked (loaded back
    as every loader loads it; no local path in any file) and the folder renamed onto ``out``. A failure or a kill
    before the rename leaves ``out`` as it was (an earlier export, or none). A grid that cannot be drawn leaves the
    folder without it, written, and raises the UsageError after the rename."""
    from vit5_sit.common.utils import atomic_folder, atomic_write_text
    from vit5_sit.hub.api import CARD_FILE

    out = Path(out)
    problem = replaceable_problem(out)
    if problem:
        raise UsageError(f"--out {out}: {problem}")
    grid_error = None
    with atomic_folder(out) as stage:
        write(stage)
        if samples:
            try:
                draw_samples(stage, progress=progress, shown_as=out)
                atomic_write_text(stage / CARD_FILE, card())
            except UsageError as e:
                grid_error = e
        check_export(stage, sources + [out.resolve().parent])
    if grid_error is not None:
        raise grid_error
    return out


def check_export(folder: Path, local: list) -> None:
    """What an export wrote, before it is renamed into place: it loads as `load_for_sampling` loads it (config.yaml
    and the files derived from it agree, the weights fit and are finite), and no file holds a local path of
    ``local`` (the source, the destination's folder)."""
    from vit5_sit.hub.model_files import load_for_sampling
    from vit5_sit.hub.public import local_paths_in

    load_for_sampling(folder)
    leaks = local_paths_in(folder, [str(Path(p).resolve()) for p in local])
    if leaks:
        file, path = leaks[0]
        raise ModelLoadError(f"{file} would publish the local path {path}; nothing was written (a bug of vit5-sit: "
                             "please report it)")


def draw_samples(folder: str | Path, progress: bool = False, shown_as: str | Path | None = None) -> Path:
    """``folder/samples.png``: the grid ``python sample.py --ckpt FOLDER`` draws (every class of models with at
    most 16, else sample.py's default classes; 4 images each, seeds 0, 1, ...; the folder's sampler section and
    ``log.sample_cfg_scale``), written atomically. Raises UsageError when it cannot be drawn (a latent model's
    VAE missing offline, ...; naming ``shown_as``, the folder's final place, when given) and KeyboardInterrupt
    when interrupted (nothing written then)."""
    import tempfile

    from vit5_sit.cli.sample import build_parser, run
    from vit5_sit.common.utils import atomic_write_bytes
    from vit5_sit.hub.api import SAMPLES_FILE

    out = Path(folder) / SAMPLES_FILE
    with tempfile.TemporaryDirectory(prefix="vit5-sit-grid-") as tmp:  # sample.py writes nowhere in the package
        grid = Path(tmp) / SAMPLES_FILE
        flags = ["--ckpt", str(folder), "--out", str(grid), *([] if progress else ["--no-progress"])]
        args = build_parser().parse_args(flags)
        try:
            code = run(args)  # sample.py itself: the same defaults, the same pixels
        except UsageError as e:
            raise UsageError(f"{Path(shown_as or folder) / SAMPLES_FILE}: {e}") from None
        if code:  # 130: interrupted (sample.py said so); a grid is written whole, so nothing was
            raise KeyboardInterrupt
        atomic_write_bytes(out, grid.read_bytes())
    return out


@stops_cleanly("interrupted: the model folder is as it was before (an earlier export, or none); run the same "
               "command again")
def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m vit5_sit.demo", command="demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="export a run's EMA weights as a model folder")
    e.add_argument("run", type=path_text, help="run folder (newest valid checkpoint), checkpoint folder, model "
                   "folder, or an official SiT .pt file")
    e.add_argument("--out", type=path_text, required=True, help="the model folder to write (required; the bundled "
                   "demo model is vit5_sit/assets/demo)")
    e.add_argument("--cfg-scale", type=finite_float, default=None,
                   help="guidance scale of the model's grids in sample.py (log.sample_cfg_scale; default: the run's)")
    e.add_argument("--guidance-interval", type=finite_float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                   help="its interval in t, 0 noise, 1 data (log.sample_guidance_interval; default: the run's)")
    e.add_argument("--sampler", choices=("ode", "sde", "meanflow"), default=None,
                   help="sample.py's default sampler for this model (sampler.mode; default: the run's)")
    e.add_argument("--method", default=None, help="sampler.method (default: the run's)")
    e.add_argument("--steps", type=positive_int, default=None, help="sampler.steps (default: the run's)")
    e.add_argument("--preset", default=None, help="official .pt files only: the model, e.g. SiT-XL/2 (default)")
    e.add_argument("--image-size", type=positive_int, default=None,
                   help="official .pt files only: the image size in pixels (default 256; the model's input is a "
                        "1/8 of it in VAE latents)")
    e.add_argument("--vae", type=path_text, default=None, metavar="NAME_OR_PATH",
                   help="official .pt files only: the VAE stored in the folder's vae/ (hub name or folder; default "
                        "stabilityai/sd-vae-ft-ema)")
    e.add_argument("--no-samples", action="store_true", help="do not draw samples.png (the card then has no "
                   "sample grid); by default the folder's own sampler and guidance draw it, as `sample.py --ckpt "
                   "FOLDER` does")
    e.add_argument("--push", metavar="OWNER/NAME", default=None,
                   help="also upload the folder to this Hugging Face Hub model repo (created if missing)")
    e.add_argument("--private", action="store_true", help="--push: create the repo as private")
    e.add_argument("--measured", type=path_text, nargs="+", default=None, metavar="RECORD",
                   help="benchmarks/bench_guidance.py --json records of this checkpoint: their rows (FID, digits, "
                        "speckle by steps and guidance) join the card's metrics")
    e.add_argument("--guide", type=path_text, default=None, metavar="PATH",
                   help="autoguidance's guide, stored as the folder's guide/: a run, checkpoint or model folder of "
                        "the same data, classes and kind, 'auto' (the guide the run kept) or 'none' (default: a "
                        "model folder's own guide/, else none)")
    args = p.parse_args(argv)
    from vit5_sit.cli.flags import guidance_flags
    from vit5_sit.common.utils import check_choice
    from vit5_sit.config import ConfigError  # torch: imported after parsing, so --help is instant
    from vit5_sit.data.vae import VAELoadError
    from vit5_sit.hub.api import HubError, parse_repo_spec, push_folder, repo_id_problem
    from vit5_sit.models.presets import PRESETS
    from vit5_sit.transport.guidance import GuidanceError

    if args.push is not None and (parse_repo_spec(args.push) is None or "@" in args.push):
        print(f"error: --push {args.push}: expected a Hub repo id OWNER/NAME, e.g. me/vit5-mnist", file=sys.stderr)
        return 2
    if args.push is not None and (problem := repo_id_problem(args.push)) is not None:
        print(f"error: --push {args.push}: {problem}", file=sys.stderr)  # before the export, not after it
        return 2
    try:
        output_folder(args.out, "--out", into_assets=True)  # a file there, a read-only folder: said before loading
        # the run (into the package's assets too: `--out vit5_sit/assets/demo` regenerates the bundled demo)
        if (problem := replaceable_problem(Path(args.out))) is not None:
            raise UsageError(f"--out {args.out}: {problem}")
        if args.preset is not None:
            check_choice("--preset", args.preset, PRESETS, error=UsageError)
        guidance_flags(args.cfg_scale, args.guidance_interval)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    method = args.method or ("euler" if args.sampler else None)  # as sample.py: a mode's own default method
    sampler = [f"sampler.{key}={value}" for key, value in
               (("mode", args.sampler), ("method", method), ("steps", args.steps)) if value is not None]
    try:
        out = export_model(args.run, args.out, cfg_scale=args.cfg_scale, guidance_interval=args.guidance_interval,
                           sampler=sampler, repo_id=args.push,
                           samples=not args.no_samples, progress=True, preset=args.preset,
                           image_size=args.image_size, vae=args.vae, guide=args.guide, measured=args.measured)
    except (ModelLoadError, ConfigError, VAELoadError, GuidanceError) as err:
        print(f"error: {args.run}: {err}", file=sys.stderr)
        return 2
    except UsageError as err:  # the sample grid could not be drawn; the rest of the folder is written
        print(f"error: {err}; the model folder {args.out} is written without it (--no-samples: on purpose)",
              file=sys.stderr)
        return 2
    print(f"exported {args.run} -> {out}")
    if args.push is not None:
        try:
            url = push_folder(out, args.push, private=args.private or None)
        except HubError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"pushed {out} -> {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
