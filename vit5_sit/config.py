"""The experiment config: one typed tree, read from YAML and dotted command-line overrides, validated here.

A config file has the sections of `ExperimentConfig`; any field can be overridden on the command line as
``section.field=value`` (``model.rope=false train.lr=2e-4``). The ``model`` section names a preset
(``model.preset=ViT5-S/2``) and overrides any field of it, so each ablation is one override. Unknown keys
and bad values are errors that name the key, the nearest valid one, and the expected type.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vit5_sit.common.checks import integer_problem, path_problem, shown
from vit5_sit.common.contract import GUIDANCE, SEED, STEPS, TOL, Range, above, at_least
from vit5_sit.common.utils import check_choice
from vit5_sit.data import DATASET_KINDS, DIGIT_CLASSES, EXPORTERS
from vit5_sit.models import PRESETS, ModelConfig, model_config
from vit5_sit.transport import (
    GuidanceError,
    MeanFlowConfig,
    SamplerConfig,
    TransportConfig,
    check_guidance,
    check_guidance_settings,
)

LATENT_DOWNSAMPLE = 8  # spatial downsampling of the Stable Diffusion VAE
LATENT_CHANNELS = 4    # its latent channels
OBJECTIVES = ("flow", "meanflow")
# Autoguidance (issue #52, docs/sampling.md): a run keeps the checkpoint nearest this share of its training as its
# guide, a bad version of the model itself (Karras et al. 2024). 2/9: step 800 of the demo's 3,600, which guided the
# demo better than step 400 at every weight measured (docs/study/guidance/demo.md; one model, one training seed).
GUIDE_AT = 2 / 9


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
        check_choice("data.channels", self.channels, (1, 3), error=ConfigError)
        if not str(self.path).strip():
            raise ConfigError("data.path is empty: name the image root, latent cache or MNIST export folder")


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
    guide_at: float | None = GUIDE_AT      # autoguidance: the checkpoint nearest this share of max_steps is kept
                                           # as the run's guide (keep_last never deletes it; sample.py --guide
                                           # auto); None = none kept
    max_nonfinite: int = 5                 # consecutive non-finite losses that stop the run
    objective: str = "flow"                # 'flow' (flow matching, SiT) | 'meanflow' (MeanFlow: average
                                           # velocities for 1-step sampling; settings in the meanflow section)
    init_from: str | None = None           # start from a trained flow model's weights (a run, checkpoint or
                                           # model folder, or an official SiT .pt file): with objective=meanflow
                                           # it converts a flow model into a one-step model (read at step 0 only)

    def __post_init__(self) -> None:
        check_choice("train.mixed_precision", self.mixed_precision, ("no", "bf16", "fp16"), error=ConfigError)
        check_choice("train.objective", self.objective, OBJECTIVES, error=ConfigError)
        if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from.strip()):
            raise ConfigError(f"train.init_from={self.init_from!r}: give the path of a flow run, checkpoint or model "
                              "folder, or of an official SiT .pt file (or leave it unset to start from scratch)")

    def guide_step(self) -> int | None:
        """The checkpoint kept as the run's autoguidance guide: the multiple of ckpt_every nearest
        guide_at * max_steps (at least one ckpt_every); None if guide_at is None or that is the last step."""
        if self.guide_at is None:
            return None
        step = max(1, round(self.guide_at * self.max_steps / self.ckpt_every)) * self.ckpt_every
        return step if step < self.max_steps else None


@dataclass
class LogConfig:
    tracker: str = "tensorboard"           # 'tensorboard', 'wandb' or 'none'
    project: str = "vit5-sit"              # tracker project name
    every: int = 100                       # steps between tracker logs
    sample_every: int = 10_000             # steps between sample grids (PNG in RUN/samples); 0 = never
    sample_classes: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4, 5, 6, 7])
    sample_per_class: int = 4              # grid columns
    sample_seed: int = 0                   # first seed of the grid; seeds are fixed across the run
    sample_cfg_scale: float = 1.0          # guidance scale of the grid; the model's default in sample.py
    sample_guidance_interval: list[float] = field(default_factory=lambda: [0.0, 1.0])  # ... and its interval in t
    sample_at_start: bool = False          # also a grid at step 0 (pure noise: costs time, shows nothing)

    def __post_init__(self) -> None:
        check_choice("log.tracker", self.tracker, ("tensorboard", "wandb", "none"), error=ConfigError)
        if not self.sample_classes:
            raise ConfigError("log.sample_classes=[]: name at least one class id for the grid rows, e.g. [0,1]")
        try:
            check_guidance_settings(1.0, self.sample_guidance_interval, interval_name="log.sample_guidance_interval")
        except GuidanceError as e:
            raise ConfigError(str(e)) from None
        self.sample_guidance_interval = [float(v) for v in self.sample_guidance_interval]


@dataclass
class RepaConfig:
    """REPA (representation alignment, Yu et al. 2024): align one block's patch tokens with a frozen encoder."""

    weight: float = 0.0                    # weight of the alignment term (REPA: 0.5); 0 = off
    depth: int = 8                         # 1-based block whose output is aligned (REPA: 8 of 28 for XL)
    encoder: str = ""                      # 'timm:MODEL_NAME' or a path to the project's own encoder .safetensors
    encoder_weights: str = ""              # timm: local weights file (.safetensors/.pth); '' = the hub (online)
    encoder_resolution: int = 0            # pixels the encoder sees; 0 = its own default
    projector_dim: int = 2048              # hidden width of the projector MLP (REPA: 2048)

    def __post_init__(self) -> None:
        if self.weight > 0 and not self.encoder:
            raise ConfigError("repa.weight > 0 needs repa.encoder: 'timm:MODEL_NAME' (e.g. "
                              "timm:vit_small_patch14_dinov2.lvd142m) or the path of an encoder .safetensors "
                              "made by `python -m vit5_sit.repa.classifier`")

    @property
    def enabled(self) -> bool:
        return self.weight > 0


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
    repa: RepaConfig = field(default_factory=RepaConfig)
    meanflow: MeanFlowConfig = field(default_factory=MeanFlowConfig)  # used with train.objective=meanflow

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
        if self.train.objective == "meanflow":
            derived["mean_flow"] = True  # the interval input: one switch, train.objective, for every preset
            if self.meanflow.imf:
                derived["guidance_input"] = True  # iMF: guidance scale and interval inputs (meanflow.variant)
        return model_config(self.model.preset, **{**derived, **self.model.overrides})


# ----------------------------------------------------------------------------------------------------------
# Loading, overriding, saving.

def read_yaml_file(path: str | Path, kind: str = "config file", fix: str = "give a YAML file") -> Any:
    """One YAML file of the project (a config, a study file), read the one way: a missing file, a folder, a pipe,
    a path too long for the OS, bad YAML, bytes that are not UTF-8, a huge integer and a key given twice in one
    mapping (PyYAML keeps the last silently) are each a ConfigError naming the file; an empty file is {}."""
    path = Path(path)
    problem = path_problem(str(path))
    if problem:
        raise ConfigError(f"{kind} {shown(path)}: {problem}")
    if not path.is_file():  # a FIFO would block the read forever
        what = "is a folder" if path.is_dir() else "is not a regular file" if path.exists() else "not found"
        raise ConfigError(f"{kind} {path}: {what}; {fix}")
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (not UTF-8)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"{path}: unreadable value: {e}") from None
    except OSError as e:  # unreadable (permissions, an I/O error)
        raise ConfigError(f"{kind} {path}: cannot be read: {e.strerror or e}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Read a YAML config (or start from the defaults) and apply ``key=value`` overrides."""
    layers = [] if path is None else _read_config_file(Path(path), ())
    raw: dict[str, Any] = {}
    for layer in layers:
        raw = _merged(raw, copy.deepcopy(layer))  # the layers stay as read: the overrides go into raw
    return from_dict(_implied_sampler(_overridden(raw, overrides), [*layers, _override_layer(overrides)]))


def with_overrides(cfg: ExperimentConfig, overrides: list[str] | tuple[str, ...]) -> ExperimentConfig:
    """``cfg`` with ``key=value`` overrides applied, checked as `load_config` checks a file's (a built config
    gets the same errors as the file it could have been saved to)."""
    if not overrides:
        return cfg
    base = to_dict(cfg)
    for key, source in (("mean_flow", "train.objective="), ("guidance_input", "meanflow.variant=")):
        if any(str(o).startswith(source) for o in overrides):  # derived from the setting being changed: the
            base["model"].pop(key, None)                       # override decides it (written out to be complete)
    return from_dict(_implied_sampler(_overridden(base, overrides), [to_dict(cfg), _override_layer(overrides)]))


# The sampler that each objective implies, when the objective is set after (in a later file or on the command line)
# the sampler section it would contradict: `train.objective=meanflow` on a flow config samples as MeanFlow does.
OBJECTIVE_SAMPLERS: dict[str, dict[str, Any]] = {
    "flow": {},  # SamplerConfig's defaults: the ODE, Euler, 50 steps
    "meanflow": {"mode": "meanflow", "method": "euler", "steps": 1},
}


def _implied_sampler(raw: dict[str, Any], layers: list[dict[str, Any]]) -> dict[str, Any]:
    """``raw`` with the sampler section that its objective implies, when the objective was set in a later layer
    (``layers``: the base files, the file, the command line) than the ``sampler.mode`` it contradicts. The sampler
    keys given in the objective's layer or later are kept; those of earlier layers were another objective's.
    A contradiction within one layer (or a sampler set after the objective) is left to `_check_meanflow`."""
    objective = _get(raw, "train", "objective", "flow")
    mode = _get(raw, "sampler", "mode", SamplerConfig.mode)
    if objective not in OBJECTIVE_SAMPLERS or not isinstance(mode, str) or \
            (mode == "meanflow") == (objective == "meanflow"):
        return raw
    set_objective = max((i for i, layer in enumerate(layers) if _has(layer, "train", "objective")), default=-1)
    set_mode = max((i for i, layer in enumerate(layers) if _has(layer, "sampler", "mode")), default=-1)
    if set_objective <= set_mode:
        return raw
    later: dict[str, Any] = {}
    for layer in layers[set_objective:]:
        section = layer.get("sampler")
        later.update(section if isinstance(section, dict) else {})
    return {**raw, "sampler": {**OBJECTIVE_SAMPLERS[objective], **later}}


def _get(raw: dict[str, Any], section: str, key: str, default: Any) -> Any:
    node = raw.get(section)
    return node.get(key, default) if isinstance(node, dict) else default


def _has(raw: dict[str, Any], section: str, key: str) -> bool:
    node = raw.get(section)
    return isinstance(node, dict) and key in node


def _override_layer(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The sections that ``section.key=value`` overrides set, as a mapping (for `_implied_sampler`; the
    overrides themselves are applied and checked by `_overridden`)."""
    layer: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, leaf = key.strip().partition(".")
        if sep and dot and leaf and "." not in leaf and isinstance(layer.setdefault(section, {}), dict):
            layer[section][leaf] = _parse_scalar(value.strip())
    return layer


def _overridden(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {shown(item, quote=True)}: expected key=value, e.g. train.lr=2e-4")
        if key.strip() == "base":
            raise ConfigError(f"override {shown(item, quote=True)}: base: is read from a config file, not the command "
                              "line; give that file as --config (overrides apply on top of it)")
        _set_dotted(raw, key.strip(), value.strip())
    return raw


MAX_BASE_DEPTH = 8  # how many `base:` files one config may stack


def _read_config_file(path: Path, chain: tuple[Path, ...]) -> list[dict[str, Any]]:
    """One config file as its layers: its ``base:`` file's (a path relative to this file) first, then this file's
    own mapping, to be merged over them section by section; bases may stack, up to MAX_BASE_DEPTH, and never
    loop."""
    if chain:
        raw = read_yaml_file(path, f"{chain[-1]}: base file", f"fix the base: key of {chain[-1]}")
    else:
        raw = read_yaml_file(path, "config file", "give a YAML file (configs/...)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    if "base" not in raw:
        return [raw]
    base = raw.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: base: expected the path of another config file (relative to this one, e.g. "
                          f"base: sit.yaml), got {shown(base, quote=True)}")
    base_path = path.parent / base
    problem = path_problem(str(base_path))
    if problem:
        raise ConfigError(f"{path}: base: {shown(base, quote=True)}: {problem}")
    if base_path.resolve() in [p.resolve() for p in (*chain, path)]:
        loop = " -> ".join(str(p) for p in (*chain, path, base_path))
        raise ConfigError(f"{path}: base: {base} makes a loop ({loop}); a config cannot include itself")
    if len(chain) + 1 > MAX_BASE_DEPTH:
        raise ConfigError(f"{path}: base: more than {MAX_BASE_DEPTH} config files stacked; flatten the chain")
    return [*_read_config_file(base_path, (*chain, path)), raw]


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: a section present in both is merged key by key, any other value replaces."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    cfg = _build(ExperimentConfig, raw, prefix="")
    _check_model(cfg)
    _check_consistency(cfg)
    return cfg


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Plain dict of the config; the model section is written fully resolved (every field explicit)."""
    out = dataclasses.asdict(cfg)
    resolved = dataclasses.asdict(cfg.model_config())
    out["model"] = {"preset": cfg.model.preset, **resolved}
    return out


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    from vit5_sit.common.utils import atomic_write_text

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
    except (yaml.YAMLError, ValueError):  # ValueError: an integer of more than 4300 digits
        return text
    if isinstance(value, str) and value.isascii():  # float('٣') is 3.0: digits of other scripts stay text
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a section (mapping), "
                          f"got {shown(raw, quote=True)}")
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
            _check_range(prefix + key, kwargs[key])
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
    check_choice(f"{prefix}preset", preset, PRESETS, error=ConfigError)
    hints = typing.get_type_hints(ModelConfig)
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    coerced = {}
    for key, value in overrides.items():
        if key not in names:
            raise ConfigError(_unknown(prefix + str(key), ["preset", *names], prefix))
        coerced[key] = _coerce(prefix + key, value, hints[key])
        _check_range(prefix + key, coerced[key])
    return ModelSection(preset=preset, overrides=coerced)


def _resolution_problem(cfg: ExperimentConfig) -> str:
    """The data.resolution the model cannot patchify, named as the value the user set, with the valid step."""
    from vit5_sit.models.presets import PRESETS

    patch = cfg.model.overrides.get("patch_size", PRESETS[cfg.model.preset].patch_size)
    res = cfg.data.resolution
    if cfg.data.kind == "latents":
        step = patch * LATENT_DOWNSAMPLE
        why = f"its latents ({res} // {LATENT_DOWNSAMPLE} = {res // LATENT_DOWNSAMPLE} per side) are not"
    else:
        step, why = patch, "it is not"
    near = sorted({max(step, res // step * step), (res // step + 1) * step})
    return (f"data.resolution={res}: {why} divisible by the model's patch_size={patch}; choose a multiple of "
            f"{step} (e.g. {' or '.join(map(str, near))})")


def _check_model(cfg: ExperimentConfig) -> None:
    try:
        mcfg = cfg.model_config()
    except (ValueError, TypeError) as e:
        if "input_size=" in str(e) and "input_size" not in cfg.model.overrides:  # it comes from the data
            raise ConfigError(_resolution_problem(cfg)) from None
        raise ConfigError(f"model ({cfg.model.preset} with {cfg.model.overrides}): {e}") from None
    try:
        check_guidance(cfg.log.sample_cfg_scale, mcfg.class_dropout_prob)
    except GuidanceError as e:
        raise ConfigError(f"log.sample_cfg_scale: {e}") from None
    if cfg.repa.enabled and cfg.repa.depth > mcfg.depth:
        raise ConfigError(f"repa.depth={cfg.repa.depth}: the model has {mcfg.depth} blocks; choose 1-{mcfg.depth}")


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
        raise ConfigError(errors[0] if errors else f"{key}={shown(value, quote=True)}: bad value")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [_parse_scalar(v.strip()) for v in value.strip("[]()").split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}={shown(value, quote=True)}: expected a list, e.g. {key}=[0,1,2]")
        item = args[0] if args else Any
        out = [_coerce(key, v, item) for v in value]
        return tuple(out) if origin is tuple else out
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={shown(value, quote=True)}: expected true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # its size: _check_range (the key's own range first, then MAX_INTEGER)
        if isinstance(value, str) and value.isascii():  # '1e3' as YAML 1.1 reads it, e.g. inside a list
            try:
                value = float(value)
            except ValueError:
                pass
        problem = integer_problem(value)  # a float: a whole number (1e3 -> 1000), not 1.5, nan or 1e30
        if problem:
            raise ConfigError(f"{key}={shown(value, quote=True)}: {problem}")
        return int(value)
    if hint is float:
        number = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer beyond any float
                raise ConfigError(f"{key}={shown(value)}: must be a finite number") from None
        elif isinstance(value, str) and value.isascii():
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"{key}={shown(value, quote=True)}: expected a number")
        if not math.isfinite(number):
            raise ConfigError(f"{key}={shown(value)}: must be a finite number")
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}={shown(value, quote=True)}: expected a string")
    if isinstance(hint, type) and not isinstance(value, hint):
        raise ConfigError(f"{key}={shown(value, quote=True)}: expected {hint.__name__}")
    return value


# ----------------------------------------------------------------------------------------------------------
# Ranges: every numeric setting has one, checked when the config is read (finite, sign, bounds; integer-ness
# comes from the field's type). A test checks that no numeric field of any section is missing here. `Range` and
# the bounds shared with the CLIs' flags (steps, tolerances, guidance, seeds) are vit5_sit.common.contract's.

def _at_least(lo: float, why: str = "") -> Range:
    return at_least(lo, why)


def _above(lo: float, why: str = "") -> Range:
    return above(lo, why)


_SEED = SEED
_UNIT = Range(0.0, 1.0, hi_open=True)

RANGES: dict[str, Range] = {
    "data.resolution": _at_least(1),
    "data.channels": _at_least(1),
    "data.num_workers": _at_least(0, "0 loads in the training process"),
    "train.global_batch_size": _at_least(1),
    "train.grad_accum": _at_least(1),
    "train.max_steps": _at_least(1),
    "train.lr": _above(0, "a negative or zero learning rate does not descend"),
    "train.weight_decay": _at_least(0, "negative decay grows the weights"),
    "train.beta1": _UNIT,
    "train.beta2": _UNIT,
    "train.warmup_steps": _at_least(0, "0 = constant lr; a negative warm-up gives a negative lr"),
    "train.grad_clip": _above(0, "0 freezes the weights and a negative norm flips the gradients; "
                                 "none = no clipping"),
    "train.ema_decay": Range(0.0, 1.0, hi_open=True, why="SiT uses 0.9999"),
    "train.seed": _SEED,
    "train.ckpt_every": _at_least(1),
    "train.keep_last": _at_least(0, "0 keeps all"),
    "train.guide_at": Range(0.0, 1.0, lo_open=True, hi_open=True,
                            why="a share of train.max_steps; null = no guide kept"),
    "train.max_nonfinite": _at_least(1),
    "log.every": _at_least(1, "steps between tracker logs"),
    "log.sample_every": _at_least(0, "0 = never"),
    "log.sample_classes": _at_least(0, "class ids"),
    "log.sample_per_class": _at_least(1, "grid columns"),
    "log.sample_seed": _SEED,
    "log.sample_cfg_scale": GUIDANCE,
    "log.sample_guidance_interval": Range(0.0, 1.0, why="t: 0 = noise, 1 = data"),
    "transport.logit_normal_mean": Range(),
    "transport.logit_normal_std": _above(0),
    "transport.train_eps": Range(0.0, 0.5, hi_open=True, why="none = SiT's rule"),
    "transport.sample_eps": Range(0.0, 0.5, hi_open=True, why="none = SiT's rule"),
    "sampler.steps": STEPS,
    "sampler.atol": TOL,
    "sampler.shift": _above(0, "SD3's time shift of grid=shift; 1 = the uniform grid"),
    "sampler.rtol": TOL,
    "sampler.diffusion_norm": _at_least(0),
    "sampler.last_step_size": Range(0.0, 1.0, lo_open=True, hi_open=True),
    "model.input_size": _at_least(1),
    "model.in_channels": _at_least(1),
    "model.patch_size": _at_least(1),
    "model.hidden_size": _at_least(1),
    "model.depth": _at_least(1),
    "model.num_heads": _at_least(1),
    "model.mlp_ratio": _above(0),
    "model.num_classes": _at_least(1),
    "model.class_dropout_prob": _UNIT,
    "model.rope_base": _above(0),
    "model.num_registers": _at_least(0),
    "model.dmf_depth": _at_least(0, "0 = off; k < model.depth with train.objective=meanflow"),
    "model.register_rope_base": _above(0, "none = registers not rotated"),
    "model.layer_scale_init": _at_least(0, "none = off"),
    "model.gate_init": Range(why="0 = adaLN-Zero"),
    "repa.weight": _at_least(0, "0 turns REPA off; REPA uses 0.5"),
    "repa.depth": _at_least(1, "1-based block number"),
    "repa.encoder_resolution": _at_least(0, "0 = the encoder's own"),
    "repa.projector_dim": _at_least(1),
    "meanflow.ratio": Range(0.0, 1.0, why="share of the batch with an interval d > 0; the paper uses 0.25"),
    "meanflow.time_mean": Range(-10.0, 10.0),
    "meanflow.time_std": Range(0.0, 10.0, lo_open=True),
    "meanflow.adaptive_p": Range(0.0, 4.0, why="the paper uses 1; 0 = plain L2"),
    "meanflow.adaptive_c": _above(0),
    "meanflow.guidance_scale": Range(0.0, 100.0, why="guidance trained in; 1 = none"),
    "meanflow.guidance_mix": Range(0.0, 1.0, hi_open=True, why="the paper's kappa"),
    "meanflow.guidance_interval": Range(0.0, 1.0, why="t: 0 = noise, 1 = data"),
    "meanflow.guidance_range": Range(1.0, 100.0, why="iMF's training guidance scales; 1 = none"),
}


def _check_range(key: str, value: Any) -> None:
    for v in value if isinstance(value, list | tuple) else [value]:
        if key in RANGES:
            RANGES[key].check(key, v, ConfigError)
        if isinstance(v, int) and not isinstance(v, bool) and (problem := integer_problem(v)):
            raise ConfigError(f"{key}={shown(v)}: {problem}")


def _check_consistency(cfg: ExperimentConfig) -> None:
    """Settings that are each in range but do not fit together."""
    tc = cfg.train
    if tc.global_batch_size % tc.grad_accum:
        raise ConfigError(f"train.global_batch_size={tc.global_batch_size} is not divisible by "
                          f"train.grad_accum={tc.grad_accum}; choose a multiple of it")
    mcfg = cfg.model_config()
    _check_meanflow(cfg, mcfg)
    if mcfg.layer_scale_init == 0 and mcfg.gate_init == 0:
        raise ConfigError("model.layer_scale_init=0 with model.gate_init=0: each branch is a product of two zeros "
                          "and neither factor ever gets a gradient; use model.layer_scale_init=none (off) or a "
                          "positive value")
    for key in ("name", "output_dir"):
        value = str(getattr(cfg, key))
        if not value.strip():
            fix = "name=my-run" if key == "name" else "output_dir=. for the current folder"
            raise ConfigError(f"{key} is empty: the run folder would be the parent folder itself; set {fix}")
    for key, value in (("name", cfg.name), ("output_dir", cfg.output_dir), ("data.path", cfg.data.path),
                       ("data.vae", cfg.data.vae), ("repa.encoder", cfg.repa.encoder),
                       ("repa.encoder_weights", cfg.repa.encoder_weights),
                       ("output_dir/name", str(Path(cfg.output_dir) / cfg.name))):
        problem = path_problem(value)
        if problem:
            raise ConfigError(f"{key}: {problem}")
    name = Path(cfg.name)
    if name.is_absolute() or any(part in ("..", ".") for part in Path(cfg.name).parts) or cfg.name in (".", ".."):
        raise ConfigError(f"name={shown(cfg.name, quote=True)}: must be a folder name under output_dir (no '..', "
                          "'.' or absolute path); put the location in output_dir=...")


# The settings that each objective never reads, and what it reads instead: set to anything but their default,
# they are refused (they would be silently ignored). A section name stands for every key of it.
OBJECTIVE_IGNORES: dict[str, tuple[tuple[str, ...], str]] = {
    "flow": (("meanflow",), "the meanflow section is read only by train.objective=meanflow"),
    "meanflow": (("transport.time_dist", "transport.logit_normal_mean", "transport.logit_normal_std",
                  "transport.train_eps", "transport.sample_eps"),
                 "MeanFlow draws its times from meanflow.time_mean and meanflow.time_std, over all of [0, 1], and "
                 "samples with its own steps"),
}


def _objective_settings(cfg: ExperimentConfig, table: dict[str, tuple[tuple[str, ...], str]]
                        ) -> list[tuple[str, Any, Any]]:
    """(key, value, default) of every setting that ``table`` lists for the config's objective."""
    out = []
    for name in table[cfg.train.objective][0]:
        section, _, leaf = name.partition(".")
        node = getattr(cfg, section)
        default = type(node)()
        for f in dataclasses.fields(node):
            if not leaf or f.name == leaf:
                out.append((f"{section}.{f.name}", getattr(node, f.name), getattr(default, f.name)))
    return out


def _check_meanflow(cfg: ExperimentConfig, mcfg: ModelConfig) -> None:
    """train.objective=meanflow and everything it needs; a MeanFlow model and its sampler go together."""
    meanflow = cfg.train.objective == "meanflow"
    if mcfg.mean_flow != meanflow:
        raise ConfigError(f"model.mean_flow={mcfg.mean_flow} with train.objective={cfg.train.objective}: the interval "
                          "input follows from the objective; drop model.mean_flow and set train.objective")
    if mcfg.x_prediction and not meanflow:
        raise ConfigError(f"model.x_prediction=true with train.objective={cfg.train.objective}: x-prediction is an "
                          "output of MeanFlow models here (their average velocity from the predicted data point); "
                          "set train.objective=meanflow or drop model.x_prediction")
    imf = meanflow and cfg.meanflow.imf
    if mcfg.guidance_input != imf:
        raise ConfigError(f"model.guidance_input={mcfg.guidance_input} with meanflow.variant={cfg.meanflow.variant}: "
                          "the guidance inputs follow from the variant; drop model.guidance_input and set "
                          "train.objective=meanflow meanflow.variant=imf")
    if imf and mcfg.class_dropout_prob == 0:
        raise ConfigError("meanflow.variant=imf builds its guided target from the unconditional field, which needs "
                          "the null label: set model.class_dropout_prob > 0 (SiT: 0.1)")
    if (cfg.sampler.mode == "meanflow") != meanflow:
        fix = ("sampler.mode=meanflow sampler.method=euler sampler.steps=1 (or drop the sampler.* settings given "
               "with the objective: it implies them)" if meanflow
               else "sampler.mode=ode or sde, or train.objective=meanflow")
        raise ConfigError(f"sampler.mode={cfg.sampler.mode} with train.objective={cfg.train.objective}: a MeanFlow "
                          f"model samples with its own steps and a flow model with an ODE/SDE; use {fix}")
    ignored = [f"{key}={shown(value)}" for key, value, default in _objective_settings(cfg, OBJECTIVE_IGNORES)
               if value != default]
    if ignored:
        them = "it" if len(ignored) == 1 else "them"
        raise ConfigError(f"{', '.join(ignored)}: no effect with train.objective={cfg.train.objective} "
                          f"({OBJECTIVE_IGNORES[cfg.train.objective][1]}); drop {them} or choose the other objective")
    if not meanflow:
        return
    tc = cfg.transport
    if tc.path != "linear" or tc.prediction != "velocity":
        raise ConfigError(f"train.objective=meanflow needs transport.path=linear and transport.prediction=velocity "
                          f"(the MeanFlow identity is written for them), got {tc.path} / {tc.prediction}")
    if cfg.meanflow.guided and mcfg.class_dropout_prob == 0:
        raise ConfigError(f"meanflow.guidance_scale={cfg.meanflow.guidance_scale:g} trains guidance in, which needs "
                          "the null label: set model.class_dropout_prob > 0 (SiT: 0.1) or meanflow.guidance_scale=1")


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"key {key!r} is given twice in one section (lines {seen[key]} and "
                              f"{key_node.start_mark.line + 1}); keep one")
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)
