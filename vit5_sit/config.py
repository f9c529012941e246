"""The experiment config: one typed tree, read from YAML and dotted command-line overrides, validated here.

A config file has the sections of `ExperimentConfig`; any field can be overridden on the command line as
``section.field=value`` (``model.rope=false train.lr=2e-4``). The ``model`` section names a preset
(``model.preset=ViT5-S/2``) and overrides any field of it, so each ablation is one override. Unknown keys
and bad values are errors that name the key, the nearest valid one, and the expected type.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vit5_sit.data import DATASET_KINDS, DIGIT_CLASSES, EXPORTERS
from vit5_sit.models import PRESETS, ModelConfig, model_config
from vit5_sit.transport import GuidanceError, SamplerConfig, TransportConfig, check_guidance
from vit5_sit.utils import check_choice

LATENT_DOWNSAMPLE = 8  # spatial downsampling of the Stable Diffusion VAE
LATENT_CHANNELS = 4    # its latent channels


class ConfigError(ValueError):
    """A config key or value that cannot be used; the message says which and how to fix it."""


@dataclass
class ModelSection:
    """A preset plus overrides of any `ModelConfig` field (resolved by `ExperimentConfig.model_config`)."""

    preset: str = "ViT5-T/4"
    overrides: dict[str, Any] = field(default_factory=dict)  # ModelConfig field -> value


@dataclass
class DataConfig:
    kind: str = "mnist"                     # 'images' (class folders), 'latents' (encoded cache), 'mnist' or
                                            # 'digits' (sklearn's 8x8 digits, upscaled)
    path: str = "data/mnist32"              # image root, latent-cache folder, or where the digits are exported
    resolution: int = 32                    # pixels; the model's input is resolution/8 for latents
    channels: int = 1                       # image channels for pixel-space training
    random_flip: bool = True                # horizontal flips (latents: the stored flipped copy)
    num_workers: int = 2                    # DataLoader workers per process
    vae: str = "stabilityai/sd-vae-ft-ema"  # hub name or local folder; used to decode latent samples

    def __post_init__(self) -> None:
        check_choice("data.kind", self.kind, DATASET_KINDS, error=ConfigError)
        _positive("data.resolution", self.resolution)
        check_choice("data.channels", self.channels, (1, 3), error=ConfigError)


@dataclass
class TrainConfig:
    global_batch_size: int = 256           # images per optimizer step, over all processes and accumulation
    grad_accum: int = 1                    # micro-batches per optimizer step
    max_steps: int = 400_000               # optimizer steps
    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    warmup_steps: int = 0                  # linear lr warm-up; 0 = constant lr (SiT)
    grad_clip: float | None = None         # max global grad norm; None = no clipping (SiT)
    ema_decay: float = 0.9999
    ema_warmup: bool = False               # decay min(ema_decay, (1+n)/(10+n)) at update n (short runs)
    mixed_precision: str = "no"            # 'no', 'bf16' or 'fp16'
    compile: bool = False                  # torch.compile the model
    grad_checkpointing: bool = False       # recompute block activations in the backward pass
    fsdp: bool = False                     # shard params, grads, AdamW state and EMA over processes (FSDP2)
    tf32: bool = True                      # TF32 matmuls on Ampere+ GPUs
    seed: int = 0
    ckpt_every: int = 50_000               # steps between checkpoints
    keep_last: int = 3                     # checkpoints kept (oldest deleted); 0 = keep all
    max_nonfinite: int = 5                 # consecutive non-finite losses that stop the run

    def __post_init__(self) -> None:
        check_choice("train.mixed_precision", self.mixed_precision, ("no", "bf16", "fp16"), error=ConfigError)
        for name in ("global_batch_size", "grad_accum", "max_steps", "ckpt_every", "max_nonfinite"):
            _positive(f"train.{name}", getattr(self, name))
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay={self.ema_decay}: must be in [0, 1) (SiT uses 0.9999)")
        if self.lr <= 0:
            raise ConfigError(f"train.lr={self.lr}: must be positive")


@dataclass
class LogConfig:
    tracker: str = "tensorboard"           # 'tensorboard', 'wandb' or 'none'
    project: str = "vit5-sit"              # tracker project name
    every: int = 100                       # steps between tracker logs
    sample_every: int = 10_000             # steps between sample grids (PNG in RUN/samples); 0 = never
    sample_classes: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4, 5, 6, 7])
    sample_per_class: int = 4              # grid columns
    sample_seed: int = 0                   # first seed of the grid; seeds are fixed across the run
    sample_cfg_scale: float = 1.0          # classifier-free guidance scale of the grid

    def __post_init__(self) -> None:
        check_choice("log.tracker", self.tracker, ("tensorboard", "wandb", "none"), error=ConfigError)


@dataclass
class ExperimentConfig:
    name: str = "run"                      # run folder name under output_dir
    output_dir: str = "runs"
    model: ModelSection = field(default_factory=ModelSection)
    transport: TransportConfig = field(default_factory=TransportConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)  # for sample grids and sample.py defaults
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    def model_config(self) -> ModelConfig:
        """The preset, with the input shape taken from the data section, then the explicit overrides."""
        latent = self.data.kind == "latents"
        derived: dict[str, Any] = {
            "input_size": self.data.resolution // LATENT_DOWNSAMPLE if latent else self.data.resolution,
            "in_channels": LATENT_CHANNELS if latent else self.data.channels,
        }
        if self.data.kind in EXPORTERS:
            derived["num_classes"] = DIGIT_CLASSES
        return model_config(self.model.preset, **{**derived, **self.model.overrides})


# ----------------------------------------------------------------------------------------------------------
# Loading, overriding, saving.

def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Read a YAML config (or start from the defaults) and apply ``key=value`` overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. train.lr=2e-4")
        _set_dotted(raw, key.strip(), value.strip())
    return from_dict(raw)


def from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    cfg = _build(ExperimentConfig, raw, prefix="")
    _check_model(cfg)
    return cfg


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Plain dict of the config; the model section is written fully resolved (every field explicit)."""
    out = dataclasses.asdict(cfg)
    resolved = dataclasses.asdict(cfg.model_config())
    out["model"] = {"preset": cfg.model.preset, **resolved}
    return out


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    from vit5_sit.utils import atomic_write_text

    atomic_write_text(Path(path), yaml.safe_dump(to_dict(cfg), sort_keys=False))


def _set_dotted(raw: dict[str, Any], key: str, value: str) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key}: {part} is not a section")
    node[parts[-1]] = _parse_scalar(value)


def _parse_scalar(text: str) -> Any:
    """YAML scalar parsing, plus floats like 2e-4 that YAML 1.1 reads as strings."""
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a section (mapping), got {raw!r}")
    if cls is ModelSection:
        return _build_model(raw, prefix)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(_unknown(prefix + str(key), names, prefix))
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, prefix + key + ".")
        else:
            kwargs[key] = _coerce(prefix + key, value, hint)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {e}") from None


def _build_model(raw: dict[str, Any], prefix: str) -> ModelSection:
    raw = dict(raw)
    preset = raw.pop("preset", ModelSection.preset)
    overrides = dict(raw.pop("overrides", None) or {})
    overrides.update(raw)
    if preset not in PRESETS:
        close = difflib.get_close_matches(str(preset), PRESETS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"{prefix}preset={preset!r}: unknown preset.{hint} See `python -m vit5_sit.models`.")
    hints = typing.get_type_hints(ModelConfig)
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    coerced = {}
    for key, value in overrides.items():
        if key not in names:
            raise ConfigError(_unknown(prefix + str(key), ["preset", *names], prefix))
        coerced[key] = _coerce(prefix + key, value, hints[key])
    return ModelSection(preset=preset, overrides=coerced)


def _check_model(cfg: ExperimentConfig) -> None:
    try:
        mcfg = cfg.model_config()
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model ({cfg.model.preset} with {cfg.model.overrides}): {e}") from None
    try:
        check_guidance(cfg.log.sample_cfg_scale, mcfg.class_dropout_prob)
    except GuidanceError as e:
        raise ConfigError(f"log.sample_cfg_scale: {e}") from None


def _unknown(key: str, valid: list[str], prefix: str) -> str:
    leaf = key[len(prefix):]
    close = difflib.get_close_matches(leaf, valid, n=1)
    hint = f" Did you mean {prefix}{close[0]}?" if close else ""
    return f"unknown config key {key!r}.{hint} Valid keys here: {', '.join(prefix + v for v in valid)}"


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Check a value against a field's type hint, converting the lossless cases (int -> float, '1e-4')."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}={value!r}: bad value")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [_parse_scalar(v.strip()) for v in value.strip("[]()").split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}={value!r}: expected a list, e.g. {key}=[0,1,2]")
        item = args[0] if args else Any
        out = [_coerce(key, v, item) for v in value]
        return tuple(out) if origin is tuple else out
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r}: expected true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}={value!r}: expected an integer")
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}={value!r}: expected a number")
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}={value!r}: expected a string")
    if isinstance(hint, type) and not isinstance(value, hint):
        raise ConfigError(f"{key}={value!r}: expected {hint.__name__}")
    return value


def _positive(key: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{key}={value}: must be a positive integer")
