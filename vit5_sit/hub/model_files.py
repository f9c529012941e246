"""Find and load models for sampling and evaluation: our runs and checkpoints, the demo, official SiT files.

Accepted paths:
- a run folder (``runs/NAME``, holding ``config.yaml`` and ``checkpoints/``): its newest valid checkpoint;
- a checkpoint folder (``runs/NAME/checkpoints/step_0001000``): config from the run folder;
- a model folder (``config.yaml`` beside ``transformer/diffusion_pytorch_model.safetensors``, the bundled demos'
  layout, or ``ema.safetensors`` / ``model.safetensors`` in older folders);
- an official SiT ``.pt`` file (raw EMA state dict or training checkpoint), with a preset naming its model;
- a Hugging Face Hub repo id (``owner/name``, ``owner/name@revision``) holding a model folder (`vit5_sit.hub.api`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vit5_sit.common.checks import ModelLoadError, first_line, tensors_problem
from vit5_sit.config import ExperimentConfig, load_config
from vit5_sit.hub.agreement import WEIGHTS_FIX, check_folder, fit_problem, read_header
from vit5_sit.hub.files import BUNDLED_MODELS, WEIGHTS_FILE, parse_repo_spec, resolve_model_path
from vit5_sit.models import PRESETS, Denoiser, create_model, load_official_state_dict, model_config
from vit5_sit.models.official import StateDictMismatch
from vit5_sit.train.checkpoint import (
    CheckpointError,
    latest_valid_checkpoint,
    verify_checkpoint,
)

DEMO_MODEL = BUNDLED_MODELS["demo"]


def _weights_in(folder: Path, use_ema: bool) -> Path | None:
    """The weights file of a checkpoint or model folder: ema / model.safetensors, or the diffusers layout's
    transformer/diffusion_pytorch_model.safetensors (the EMA weights of an exported folder)."""
    names = ("ema.safetensors", "model.safetensors") if use_ema else ("model.safetensors", "ema.safetensors")
    names += (WEIGHTS_FILE,)
    for name in names:
        if (folder / name).is_file():
            return folder / name
    return None


def weights_file(folder: Path) -> Path:
    """The EMA weights of a checkpoint or model folder (`resolve_checkpoint`'s first value)."""
    weights = _weights_in(Path(folder), True)
    if weights is None:
        raise ModelLoadError(f"{folder}: no weights (ema.safetensors, model.safetensors or {WEIGHTS_FILE})")
    return weights


def local_model_path(path: str | Path | None) -> Path:
    """The path as given (None: the demo model), or for a Hub repo id its snapshot folder in the cache."""
    if path is None:
        return DEMO_MODEL
    if not Path(path).exists() and str(path) in BUNDLED_MODELS:
        return BUNDLED_MODELS[str(path)]
    if Path(path).exists() or parse_repo_spec(str(path)) is None:
        return Path(path)  # a missing path is reported by the caller
    return resolve_model_path(path)


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(folder holding the weights, config.yaml) for a run, checkpoint or model folder."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or folder")
    if (path / "checkpoints").is_dir() or (path / "config.yaml").is_file() and not _weights_in(path, True):
        if not (path / "checkpoints").is_dir():  # config.yaml beside no weights we read: say what is there
            other = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
            if other:
                raise ModelLoadError(f"{path}: holds {', '.join(other[:3])} but no weights this project reads "
                                     f"(ema.safetensors, model.safetensors or {WEIGHTS_FILE}); pickled .bin/.pt "
                                     "files are not loaded from folders: save the weights as safetensors")
        ckpt = latest_valid_checkpoint(path)
        if ckpt is None:
            raise ModelLoadError(f"{path}: run folder has no valid checkpoint in {path / 'checkpoints'}")
        return ckpt.path, path / "config.yaml"
    if (path / "meta.json").is_file() and path.parent.name == "checkpoints":
        try:
            verify_checkpoint(path)
        except CheckpointError as e:
            raise ModelLoadError(str(e)) from None
        return path, path.parent.parent / "config.yaml"
    if (path / "config.yaml").is_file() and _weights_in(path, True):
        return path, path / "config.yaml"
    raise ModelLoadError(
        f"{path}: not a run folder, checkpoint folder or model folder (expected config.yaml with "
        f"checkpoints/ or with ema.safetensors / model.safetensors / {WEIGHTS_FILE} beside it)")


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors weights file; unreadable (truncated, not safetensors, a folder) = one line."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ModelLoadError(f"{path}: not a readable safetensors file ({first_line(e)}); {WEIGHTS_FIX}") from None


def model_vae(folder: str | Path, cfg: ExperimentConfig) -> str:
    """The VAE of a latent model: the ``vae/`` its model folder carries (diffusers' layout), else the config's
    data.vae (a run or checkpoint folder; an exported config names a local VAE by its folder name only)."""
    own = Path(folder) / "vae"
    return str(own) if (own / "config.json").is_file() else cfg.data.vae


def load_for_sampling(path: str | Path | None = None, *, preset: str | None = None,
                      overrides: dict | None = None, use_ema: bool = True, device: torch.device | str = "cpu",
                      ) -> tuple[Denoiser, ExperimentConfig | None]:
    """A model in eval mode on ``device``, and its experiment config (None for official files)."""
    path = local_model_path(path)
    if path.is_file():
        if path.suffix not in (".pt", ".pth", ".bin"):
            raise ModelLoadError(f"{path}: expected an official SiT .pt file, or one of our folders")
        name = preset or "SiT-XL/2"
        model = create_model(model_config(name, **(overrides or {})))
        try:
            load_official_state_dict(model, path)
        except StateDictMismatch as e:
            raise StateDictMismatch(_official_mismatch(path, name, e), e.file_fields, e.differing,
                                    e.details) from None
        except (ValueError, FileNotFoundError) as e:  # unreadable, or tensors of a wrong dtype, NaN or inf
            raise ModelLoadError(str(e)) from None
        return model.to(device).eval(), None
    folder, config_path = resolve_checkpoint(path)
    if not config_path.is_file():
        raise ModelLoadError(f"{folder}: no config.yaml found at {config_path}")
    cfg = load_config(config_path)
    if preset is not None or overrides:
        raise ModelLoadError(f"{path}: --preset/overrides apply to official .pt files only; this folder "
                             "has its own config.yaml")
    model = create_model(cfg.model_config())
    weights = _weights_in(folder, use_ema)
    check_folder(folder, cfg, weights)  # config.yaml against transformer/config.json, the weights' record, ...
    state = read_weights(weights)
    problem = fit_problem({k: tuple(v.shape) for k, v in model.state_dict().items()},
                          {k: tuple(v.shape) for k, v in state.items()})
    if problem:
        raise ModelLoadError(f"{weights}: does not fit the model of {config_path}: {problem}; {WEIGHTS_FIX}")
    check_weights(state, model, weights)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.to(device).eval(), cfg


OFFICIAL_PRESET = "SiT-XL/2"   # what an official SiT file is taken for unless told: SiT-XL-2-256x256.pt
OFFICIAL_IMAGE_SIZE = 256


def load_official(path: str | Path, preset: str | None = None, image_size: int | None = None,
                  device: torch.device | str = "cpu") -> Denoiser:
    """An official SiT ``.pt`` file as a model in eval mode: ``preset`` (default SiT-XL/2) for images of
    ``image_size`` pixels (default 256; the model works on latents of image_size / 8). One line
    (`ModelLoadError`) for a size that is no multiple of 8 or a file that does not fit: the fields that differ,
    the presets that fit it, and where the input size differs, that ``--image-size`` sets it."""
    from vit5_sit.config import LATENT_DOWNSAMPLE

    size = OFFICIAL_IMAGE_SIZE if image_size is None else image_size
    if size % LATENT_DOWNSAMPLE:
        raise ModelLoadError(f"--image-size {size}: official SiT models work on VAE latents, so the size must be "
                             f"a multiple of {LATENT_DOWNSAMPLE} (256 for SiT-XL-2-256x256.pt)")
    try:
        model, _ = load_for_sampling(path, preset=preset or OFFICIAL_PRESET,
                                     overrides={"input_size": size // LATENT_DOWNSAMPLE}, device=device)
    except StateDictMismatch as e:
        hint = " (--image-size sets the official model's input_size: image size / 8)" if "input_size=" in str(e) else ""
        raise ModelLoadError(f"{e}{hint}") from None
    return model


def check_model(path: str | Path, use_ema: bool = True) -> None:
    """What `load_for_sampling` checks of one of our folders (run, checkpoint or model folder; not official
    files), without building the model: for commands that load many models one after another (compare),
    so that a bad one is refused before the first is sampled. Reads the weights one tensor at a time."""
    from safetensors import SafetensorError, safe_open

    folder, config_path = resolve_checkpoint(local_model_path(path))
    if not config_path.is_file():
        raise ModelLoadError(f"{folder}: no config.yaml found at {config_path}")
    from vit5_sit.config import ConfigError

    try:
        cfg = load_config(config_path)
        with torch.device("meta"):
            expected = create_model(cfg.model_config()).state_dict()
    except ConfigError as e:
        raise ModelLoadError(f"{config_path}: {e}") from None
    weights = _weights_in(folder, use_ema)
    check_folder(folder, cfg, weights)
    problem = fit_problem({k: tuple(v.shape) for k, v in expected.items()}, read_header(weights)[1])
    if problem:
        raise ModelLoadError(f"{weights}: does not fit the model of {config_path}: {problem}; {WEIGHTS_FIX}")
    try:
        with safe_open(str(weights), "pt") as f:
            names = set(f.keys())  # noqa: SIM118
            for name in sorted(names):
                problem = tensors_problem({name: f.get_tensor(name)}, {name: expected[name]})
                if problem:
                    raise ModelLoadError(f"{weights}: {problem}; {WEIGHTS_FIX}")
    except (SafetensorError, OSError) as e:
        raise ModelLoadError(f"{weights}: not a readable safetensors file ({first_line(e)})") from None


def check_weights(state: dict[str, torch.Tensor], model: torch.nn.Module | None, source: str | Path) -> None:
    """Refuse, before loading, tensors that the model would take silently and sample garbage with: a dtype
    other than floating point (cast to float, the small weights become 0), another shape, NaN or inf
    (`vit5_sit.common.checks.tensors_problem`). ``model``: the model they are for (None: dtype and finiteness only)."""
    problem = tensors_problem(state, model.state_dict() if model is not None else None)
    if problem:
        raise ModelLoadError(f"{source}: {problem}; {WEIGHTS_FIX}")


def check_finite(model: torch.nn.Module, source: str | Path) -> None:
    """Refuse a loaded model whose weights hold NaN or inf: they sample black or noise images without any error."""
    check_weights(model.state_dict(), None, source)


# Fields of an official file that a preset fixes; the others (input size, classes) are per-use overrides.
_NOT_PRESET = ("input_size", "num_classes")


def _official_mismatch(path: Path, preset: str, e: StateDictMismatch) -> str:
    """Why an official file does not fit `preset`, for sampling: the presets that fit it, by name."""
    parts = [f"this file has {k}={v!r} ({preset} has {m!r})" for k, (v, m) in e.differing.items()]
    if any(k not in _NOT_PRESET for k in e.differing):
        wanted = {k: v for k, v in e.file_fields.items() if k not in _NOT_PRESET}
        fits = [n for n, c in PRESETS.items() if all(getattr(c, k) == v for k, v in wanted.items())]
        parts.append(f"presets that fit it: {', '.join(fits)}" if fits else
                     "no preset fits it (load it in Python: create_model(preset, field=value, ...) and "
                     "load_official_state_dict)")
    if not e.differing:
        parts = e.details  # the shapes agree on every field we can read: list the keys
    return f"{path}: does not fit preset {preset}: " + "; ".join(parts)


def model_identity(path: str | Path | None = None, preset: str | None = None) -> dict:
    """What a model was loaded from, for the manifests of mass sampling: samples made from other weights
    are never mixed in. A checkpoint folder is named by its weights' sha256 (from meta.json, so copying the
    run keeps it); other files by path, size and modification time."""
    import json

    path = local_model_path(path)
    if path.is_file():
        st = path.stat()
        return {"weights": str(path.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                "preset": preset or "SiT-XL/2"}
    folder, config_path = resolve_checkpoint(path)
    weights = _weights_in(folder, True)
    meta = folder / "meta.json"
    if meta.is_file() and weights is not None:
        try:
            files = json.loads(meta.read_bytes().decode("utf-8")).get("files", {})
            return {"weights": weights.name, "sha256": str(files[weights.name]["sha256"])}
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            pass  # no usable meta.json (a model folder): name the file instead
    st = weights.stat()
    return {"weights": str(weights.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def kept_guide(path: str | Path) -> Path:
    """The autoguidance guide a run keeps (``train.guide_at``: the checkpoint nearest that share of its training):
    for a run folder or one of its checkpoints, that checkpoint's folder. ModelLoadError when it kept none."""
    from vit5_sit.config import load_config
    from vit5_sit.train.checkpoint import PREFIX, checkpoint_dir

    folder, config_path = resolve_checkpoint(path)
    if folder.parent.name != "checkpoints":
        raise ModelLoadError(f"{path}: not a run or checkpoint folder, so it keeps no guide by training; give the "
                             "guide's folder (an early checkpoint of the same run, or a model folder)")
    run = config_path.parent
    train = load_config(config_path).train
    step = train.guide_step()
    if step is None:
        raise ModelLoadError(f"{run}: keeps no guide (train.guide_at={train.guide_at}, max_steps "
                             f"{train.max_steps}, ckpt_every {train.ckpt_every}); give the guide's folder")
    guide = checkpoint_dir(run) / f"{PREFIX}{step:07d}"
    if not guide.is_dir():
        raise ModelLoadError(f"{run}: its guide, the checkpoint at step {step} (train.guide_at="
                             f"{train.guide_at:g} of {train.max_steps} steps), is not there yet (trained to "
                             "that step?) or was deleted; give the guide's folder")
    return guide
