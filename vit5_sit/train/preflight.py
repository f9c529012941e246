"""Checks before the first training step: every fault that would otherwise show up hours in, found first.

- the run folder (or the nearest folder that exists above it) is a writable folder (a probe file is
  created and removed, `vit5_sit.common.checks.writable_folder`); a ``checkpoints`` path that is a file is an
  error; free space below a few checkpoints' size is a warning;
- stale ``.step_XXXXXXX.tmp-PID`` folders of killed writers are removed (never a finished checkpoint);
- where to start: ``--resume auto`` takes the newest checkpoint that verifies and never deletes or rewrites
  one; when checkpoints exist but none verifies it refuses, listing each and why;
- a resume with other settings than the run's ``config.yaml`` names the fields that differ: every key that
  decides what is trained (model, transport, objective, meanflow, optimizer, EMA, REPA, the data order, and any
  key added later) must match; only those in ``RESUME_FREE`` (the schedule, logging, paths) may change;
- the checkpoint's weights against the model the config builds (names and shapes read from the
  safetensors header, nothing loaded): a checkpoint of another model is refused with the differing fields,
  also when it was copied without its run's ``config.yaml``;
- the data against the model: number of classes, at least one readable image.

The run folder is created, and ``config.yaml`` written, only after all of these pass (`write_run_config`), so
a start that fails leaves nothing behind.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from vit5_sit.common.checks import UsageError, writable_folder
from vit5_sit.config import ConfigError, ExperimentConfig, load_config, save_config, to_dict
from vit5_sit.models import ModelConfig
from vit5_sit.train.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    checkpoint_report,
    clean_stale_temp_folders,
    list_checkpoints,
)

FREE_SPACE_CHECKPOINTS = 3   # warn when the disk holds fewer checkpoints than this
BYTES_PER_PARAMETER = 16     # fp32 model + EMA + AdamW's two moments
# The settings a resumed run may change from its config.yaml: where the run and its data live, how long it runs
# and its schedule, how the same steps are executed, logging and the sampler of its grids. Every other key
# (model, transport, the objective and its meanflow section, the optimizer, EMA, REPA, the data order: a step's
# batch is positions [step * G, (step + 1) * G) of the seeded stream) decides what is trained and must match,
# and so does any key added later: a new one is fixed until it is listed here.
RESUME_FREE = ("name", "output_dir", "data.path", "data.num_workers", "data.vae",
               "train.max_steps", "train.lr", "train.warmup_steps",                  # the schedule
               "train.grad_accum", "train.compile", "train.grad_checkpointing",      # the same global batch,
               "train.fsdp", "train.tf32",                                           # executed another way
               "train.ckpt_every", "train.keep_last", "train.guide_at", "train.max_nonfinite",
               "train.init_from",                                                    # read at step 0 only
               "repa.encoder_weights",                                               # where the same encoder is read
               "meanflow.shortcut", "meanflow.shortcut_from",                        # a fine-tuning stage (#51)
               "log", "sampler")                                                     # grids only


class PreflightError(ValueError):
    """A run that must not start; the message says why and what to change."""


def check_writable_folder(folder: str | Path, what: str) -> Path:
    """`vit5_sit.common.checks.writable_folder`, raising PreflightError."""
    try:
        return writable_folder(folder, what)
    except UsageError as e:
        raise PreflightError(str(e)) from None


def checkpoint_bytes(mcfg: ModelConfig) -> int:
    """About how large one checkpoint of this model is (model, EMA, optimizer state)."""
    from vit5_sit.models import create_model

    with torch.device("meta"):
        model = create_model(mcfg)
    return BYTES_PER_PARAMETER * sum(p.numel() for p in model.parameters())


def check_grid(cfg: ExperimentConfig) -> None:
    """The run's sample grid can be drawn: its class ids exist and its seeds are valid sample seeds (checked at
    the start, not at the first grid)."""
    num_classes = cfg.model_config().num_classes
    bad = [c for c in cfg.log.sample_classes if c >= num_classes]
    if bad and cfg.log.sample_every:
        raise PreflightError(f"log.sample_classes={cfg.log.sample_classes}: class id(s) {bad} out of range for "
                             f"model.num_classes={num_classes} (ids 0..{num_classes - 1}); set log.sample_classes, "
                             "or log.sample_every=0 for no grids")
    if cfg.log.sample_every:
        from vit5_sit.transport.rng import SeedError, check_seeds

        try:  # image i of the grid has seed log.sample_seed + i
            check_seeds(cfg.log.sample_seed, len(cfg.log.sample_classes) * cfg.log.sample_per_class,
                        "log.sample_seed")
        except SeedError as e:
            raise PreflightError(str(e)) from None
        from vit5_sit.sampling.generate import MAX_GRID_PIXELS, grid_pixels

        rows, cols = len(cfg.log.sample_classes), cfg.log.sample_per_class
        pixels = grid_pixels(rows, cols, cfg.data.resolution)
        if pixels > MAX_GRID_PIXELS:
            raise PreflightError(f"log.sample_classes/log.sample_per_class: a grid of {rows} x {cols} images of "
                                 f"{cfg.data.resolution}px has {pixels:,} pixels, more than PIL opens "
                                 f"({MAX_GRID_PIXELS:,}); lower log.sample_per_class, or log.sample_every=0 "
                                 "for no grids")


def check_run_folder(cfg: ExperimentConfig, log=print) -> None:
    """The run folder can take checkpoints: writable, ``checkpoints`` not a file, free space (a warning)."""
    run_dir = cfg.run_dir
    if run_dir.exists() and not run_dir.is_dir():
        raise PreflightError(f"run folder {run_dir} is a file; set another name=... or output_dir=...")
    ckpts = checkpoint_dir(run_dir)
    if ckpts.exists() and not ckpts.is_dir():
        raise PreflightError(f"{ckpts} is a file, where checkpoint folders go; move it away")
    existing = check_writable_folder(ckpts if ckpts.is_dir() else run_dir, f"run folder {run_dir}")
    need = checkpoint_bytes(cfg.model_config())
    free = shutil.disk_usage(existing).free
    if free < FREE_SPACE_CHECKPOINTS * need:
        log(f"warning: {free / 2**30:.2f} GiB free in {existing}, and each checkpoint takes about "
            f"{need / 2**30:.2f} GiB (train.keep_last={cfg.train.keep_last}, one more while writing): the run "
            f"may stop at a checkpoint; free space or lower train.keep_last")


def start_checkpoint(cfg: ExperimentConfig, resume: str | None, log=print, main: bool = True) -> Path | None:
    """The checkpoint folder to resume from (None: a fresh start). The caller runs `check_grid` and
    `check_run_folder` first, then takes the run folder's lock: only then are temp folders stale.

    ``resume``: None (a fresh run; refused if the run has checkpoints), 'auto' (the newest checkpoint that
    verifies) or a checkpoint folder. ``main``: this process removes stale temp folders (one per run).
    """
    run_dir = cfg.run_dir
    if main:
        clean_stale_temp_folders(run_dir, log)
    start = None
    if resume == "auto":
        report = checkpoint_report(run_dir)
        valid = [c for c, why in report if why is None]
        if not report:
            log(f"--resume auto: no checkpoint in {checkpoint_dir(run_dir)}, starting from scratch")
        elif not valid:
            found = "; ".join(f"{c.path.name}: {why}" for c, why in report)
            raise PreflightError(
                f"--resume auto: none of the {len(report)} checkpoint(s) in {checkpoint_dir(run_dir)} verifies "
                f"({found}). Nothing was changed. To start afresh, use a new name=... (or move "
                f"{checkpoint_dir(run_dir)} aside); to use one anyway, repair its meta.json or pass --resume FOLDER "
                "after fixing it")
        else:
            for c, why in report:
                if why is None:
                    break
                log(f"warning: skipping checkpoint {c.path.name}: {why}")
            start = valid[0].path
    elif resume:
        start = Path(resume)
    elif list_checkpoints(run_dir):
        raise PreflightError(
            f"{run_dir} already has checkpoints; pass --resume auto to continue it, or set a new "
            f"name=... / output_dir=... to start another run")
    if start is not None and start.parent.name == "checkpoints":  # RUN/checkpoints/step_X: RUN/config.yaml
        check_same_run(cfg, start.parent.parent / "config.yaml")
    if start is not None:
        check_checkpoint_fits(cfg, start)
    return start


_WEIGHT_DTYPES = ("F32", "BF16", "F16", "F64")  # safetensors' names of vit5_sit.common.checks.WEIGHT_DTYPES


def check_checkpoint_fits(cfg: ExperimentConfig, start: Path) -> None:
    """The checkpoint's ``model.safetensors`` has the names and shapes of the model ``cfg`` builds.

    Reads only the file's header; a missing or unreadable file is left to the checkpoint's own verification.
    """
    from safetensors import SafetensorError, safe_open

    from vit5_sit.models import create_model
    from vit5_sit.models.official import file_config_fields, listed, state_dict_mismatch

    path = Path(start) / "model.safetensors"
    if not path.is_file():
        return
    try:
        with safe_open(str(path), "pt") as f:
            state = {k: torch.empty(f.get_slice(k).get_shape(), device="meta") for k in f.keys()}  # noqa: SIM118
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError):
        return
    odd = [f"{k} ({d})" for k, d in dtypes.items() if d not in _WEIGHT_DTYPES]
    if odd:
        raise PreflightError(f"{path}: tensor {odd[0]}{f' and {len(odd) - 1} more' if len(odd) > 1 else ''} is "
                             "not floating-point, so these are not weights saved by train.py; resume from another "
                             "checkpoint (--resume RUN/checkpoints/step_N) or start a new run")
    mcfg = cfg.model_config()
    with torch.device("meta"):
        expected = create_model(mcfg).state_dict()
    missing, unexpected, wrong = state_dict_mismatch(expected, state)
    if not (missing or unexpected or wrong):
        return
    fields = file_config_fields(state, "y_embedder.embedding_table.weight" in state and mcfg.class_dropout_prob > 0)
    differing = [f"{k}={v!r} (the config builds {getattr(mcfg, k)!r})" for k, v in fields.items()
                 if getattr(mcfg, k) != v]
    what = [f"{len(missing)} missing: {listed(missing)}" if missing else "",
            f"{len(unexpected)} unexpected: {listed(unexpected)}" if unexpected else "",
            f"{len(wrong)} of another shape: {listed([k for k, _, _ in wrong])}" if wrong else ""]
    raise PreflightError(
        f"{start} holds another model than this config builds ({'; '.join(w for w in what if w)}"
        f"{'; the checkpoint has ' + ', '.join(differing) if differing else ''}). Resume with the config of the "
        f"run that wrote it (its config.yaml), or set those model.* fields")


def config_differences(old: ExperimentConfig, new: ExperimentConfig, free=RESUME_FREE) -> list[str]:
    """``key: old vs new`` for each key that differs, except those under ``free`` (sections or dotted keys)."""
    a, b = _flat(to_dict(old)), _flat(to_dict(new))
    out = []
    for key in sorted(set(a) | set(b)):
        if key == "model.preset":
            continue  # the resolved fields decide the model, not the preset's name
        if not any(key == k or key.startswith(k + ".") for k in free) and a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)!r} in config.yaml, {b.get(key)!r} now")
    return out


def check_same_run(cfg: ExperimentConfig, run_config: Path) -> None:
    """A resume continues the same model and data stream: refuse settings that differ from config.yaml."""
    if not run_config.is_file():
        return  # a checkpoint copied without its run folder: the state-dict load still checks the shapes
    try:
        old = load_config(run_config)
    except ConfigError as e:
        raise PreflightError(f"cannot compare with the run's settings: {e}") from None
    diff = config_differences(old, cfg)
    if diff:
        raise PreflightError(
            f"resuming with other settings than {run_config}: {'; '.join(diff)}. Use the run's values (or "
            f"--config {run_config}), or start a new run with name=...")


def check_dataset(cfg: ExperimentConfig, dataset, mcfg: ModelConfig) -> None:
    """The data fits the model's classes and at least one image can be read (the shape is checked by the loop)."""
    classes = getattr(dataset, "num_classes", None)
    if classes is not None and classes > mcfg.num_classes:
        raise PreflightError(f"{cfg.data.path} has {classes} classes but model.num_classes={mcfg.num_classes}; "
                             f"set model.num_classes={classes}")
    if len(dataset) == 0:
        raise PreflightError(f"data.path={cfg.data.path}: the dataset is empty")
    if hasattr(dataset, "load_or_next"):
        try:
            dataset.load_or_next(0)  # all files unreadable: one line here, not a worker's traceback later
        except ValueError as e:
            raise PreflightError(f"data.path={cfg.data.path}: {e}") from None


def write_run_config(cfg: ExperimentConfig) -> None:
    """Create the run folder and write its config.yaml: the last step before training starts."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, cfg.run_dir / "config.yaml")


def report_skipped(dataset, log=print) -> None:
    """The end-of-run summary of unreadable files (each was also reported once when first met)."""
    skipped = dataset.skipped_files() if hasattr(dataset, "skipped_files") else getattr(dataset, "skipped", [])
    if skipped:
        listed = ", ".join(f"{s.path} ({s.reason})" for s in skipped[:10])
        more = f", ... ({len(skipped) - 10} more)" if len(skipped) > 10 else ""
        log(f"{len(skipped)} unreadable image(s) skipped during the run: {listed}{more}")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


__all__ = ["CheckpointError", "PreflightError", "check_checkpoint_fits", "check_dataset", "check_run_folder",
           "check_same_run",
           "check_writable_folder", "config_differences", "report_skipped", "start_checkpoint",
           "write_run_config"]
