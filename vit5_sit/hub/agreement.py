"""One source of truth per model folder: the files that state the model agree, and its weights fit it.

A model folder states its model in three places: ``config.yaml`` (the run's whole config: vit5-sit's loaders
build the model from it), ``transformer/config.json`` (the `ModelConfig` fields diffusers builds the model from)
and the weights, whose safetensors metadata records the `ModelConfig` fields they were written for
(`weights_metadata`). The second and the third are derived from the first when the folder is written
(`vit5_sit.hub.api.write_model_folder`); ``scheduler/scheduler_config.json`` (the transport and sampler sections)
and ``model_index.json``'s ``guidance_scale`` and ``guidance_interval`` (``log.sample_cfg_scale``,
``log.sample_guidance_interval``) are derived the same way.

Both doors check before they build, so that a folder edited by hand or mixed from two exports is refused rather
than loaded as two different models:
- vit5-sit's loaders (`check_folder`, from `vit5_sit.hub.model_files`): config.yaml against each derived file;
- diffusers (`check_transformer_files` and `check_loaded`, from
  `vit5_sit.hub.components.Vit5SitTransformer2DModel.from_pretrained`, which `vit5_sit.hub.remote_code` copies
  into the folder with this module's definitions): config.json against the weights' record.
Both refuse weights that do not fit the model (missing or unexpected keys, other shapes, `fit_problem`) and weights
holding NaN or inf. Each refusal is one `ModelLoadError` naming the file, the field, both values and the fix.
Weights written before the record existed have none: then only their keys, shapes and values are checked.

The definitions used by the diffusers door need only the standard library, torch and safetensors.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from vit5_sit.common.checks import ModelLoadError
from vit5_sit.models.config import ModelConfig

if TYPE_CHECKING:
    from vit5_sit.config import ExperimentConfig

MODEL_CONFIG_KEY = "vit5_sit_model_config"  # safetensors metadata: the ModelConfig fields of the weights (JSON)
REEXPORT = ("the files of one model folder must agree (a file edited by hand, or files of two exports): export "
            "the folder again with vit5-sit (python -m vit5_sit.demo export SOURCE --out FOLDER), or download it "
            "again")
WEIGHTS_FIX = ("use an earlier checkpoint, or export the model folder again from a good one "
               "(python -m vit5_sit.demo export RUN --out FOLDER)")
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"  # diffusers' name of a component's weights
HUB_ARGS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision", "subfolder")
LISTED = 3  # keys named in a message; the rest are counted


def weights_metadata(model: ModelConfig) -> dict[str, str]:
    """The safetensors metadata of a model folder's weights: the `ModelConfig` they were written for."""
    return {"format": "pt", MODEL_CONFIG_KEY: json.dumps(dataclasses.asdict(model), sort_keys=True)}


def _json_value(value: object) -> object:
    return json.loads(json.dumps(value))  # as a JSON file holds it: tuples become lists


def effective_fields(fields: dict, config_class=ModelConfig) -> dict:
    """The fields a loader builds ``config_class`` from, given a config file's values: the class's defaults for
    the fields it leaves out (as diffusers takes them), its values for the others; keys the class does not know
    and diffusers' own (``_class_name``, ...) are left out (diffusers ignores them)."""
    out = {}
    for f in dataclasses.fields(config_class):
        if f.name in fields:
            out[f.name] = fields[f.name]
        else:
            out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return _json_value(out)


def disagreement(first: dict, second: dict, first_name: str, second_name: str) -> str | None:
    """The first field on which two statements of one config differ, as ``config.json has depth=4 but the record
    in diffusion_pytorch_model.safetensors has depth=6``; None when they agree. A field only one names differs too."""
    a, b = _json_value(first), _json_value(second)
    for key in [*a, *(k for k in b if k not in a)]:
        if key not in b:
            return f"{first_name} has {key}={a[key]!r}, a field {second_name} does not have"
        if key not in a:
            return f"{second_name} has {key}={b[key]!r}, a field {first_name} does not have"
        if a[key] != b[key]:
            return f"{first_name} has {key}={a[key]!r} but {second_name} has {key}={b[key]!r}"
    return None


def recorded_fields(metadata: dict | None, weights: str | Path) -> dict | None:
    """The `ModelConfig` fields the weights' metadata records (`weights_metadata`), the defaults of fields added
    since; None for weights written before the record existed."""
    text = (metadata or {}).get(MODEL_CONFIG_KEY)
    if text is None:
        return None
    try:
        fields = json.loads(text)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        raise ModelLoadError(f"{weights}: the record of the model config in its metadata ({MODEL_CONFIG_KEY}) is "
                             f"damaged; {REEXPORT}")
    # A field `ModelConfig` gained after the weights were written is absent from their record: it held the
    # default then (as a config.json without it does, `effective_fields`). Fields the class does not know stay.
    return {**{k: v for k, v in effective_fields({}).items() if k not in fields}, **fields}


def read_header(weights: str | Path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """(metadata, {key: shape}) of a safetensors file, without reading its tensors; unreadable = one line."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), "pt") as f:
            return f.metadata() or {}, {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"{weights}: not a readable safetensors file ({first}); {WEIGHTS_FIX}") from None


def _listed(keys: list) -> str:
    more = f" and {len(keys) - LISTED} more" if len(keys) > LISTED else ""
    return ", ".join(str(k) for k in keys[:LISTED]) + more


def fit_problem(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> str | None:
    """Why weights of these keys and shapes (``found``) do not fit the model that has ``expected``, or None."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    wrong = [f"{k} {tuple(found[k])} (the model's: {tuple(v)})" for k, v in expected.items()
             if k in found and tuple(found[k]) != tuple(v)]
    parts = [f"missing keys: {_listed(missing)}" if missing else "",
             f"unexpected keys: {_listed(unexpected)}" if unexpected else "",
             f"wrong shapes: {_listed(wrong)}" if wrong else ""]
    return "; ".join(p for p in parts if p) or None


def expected_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The state dict's keys and shapes of the denoiser ``model`` describes (built on the meta device: no memory)."""
    from vit5_sit.models.denoiser import Denoiser

    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in Denoiser(model).state_dict().items()}


def nonfinite_problem(state: dict[str, torch.Tensor]) -> str | None:
    """Which floating-point tensors hold NaN or inf (they sample black or noise images without any error)."""
    bad = [k for k, t in state.items()
           if t.is_floating_point() and t.device.type != "meta" and not bool(torch.isfinite(t).all())]
    if not bad:
        return None
    return f"{len(bad)} tensor(s) hold NaN or inf ({_listed(bad)}): the model would sample black or noise images"


# ----------------------------------------------------------------------------------------------------------
# diffusers' door: the transformer's loading (copied into the folder's transformer/transformer_vit5_sit.py).

def transformer_files(path: str | Path, kwargs: dict) -> tuple[Path, Path] | None:
    """(config.json, weights) of the transformer that diffusers' ``from_pretrained(path, **kwargs)`` loads, a
    local folder or a Hub repo (resolved as diffusers resolves them); None where they are no plain files there
    (a DDUF archive, pickled weights, a file missing: diffusers' own loading then says what it says)."""
    if kwargs.get("dduf_entries") or kwargs.get("use_safetensors") is False:
        return None
    from diffusers.utils import _get_model_file

    variant = kwargs.get("variant")
    name = WEIGHTS_NAME.replace(".safetensors", f".{variant}.safetensors") if variant else WEIGHTS_NAME
    args = {k: kwargs[k] for k in HUB_ARGS if k in kwargs}
    try:
        return (Path(_get_model_file(path, weights_name="config.json", **args)),
                Path(_get_model_file(path, weights_name=name, **args)))
    except (OSError, ValueError):  # EnvironmentError: not there
        return None


def check_transformer_files(config: dict, weights: str | Path, where: str) -> None:
    """Before diffusers builds the model: config.json's fields (``config``, as read) against the record in the
    weights' metadata, and the weights' keys and shapes against the model those fields build."""
    metadata, shapes = read_header(weights)
    fields = effective_fields(config)
    recorded = recorded_fields(metadata, weights)
    if recorded is not None:
        problem = disagreement(fields, recorded, "config.json", f"the record in {Path(weights).name}")
        if problem:
            raise ModelLoadError(f"{where}: {problem}; {REEXPORT}")
    try:
        model = ModelConfig(**fields)
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"{where}: config.json: {e}; {REEXPORT}") from None
    problem = fit_problem(expected_shapes(model), shapes)
    if problem:
        raise ModelLoadError(f"{where}: the weights do not fit the model of config.json: {problem}; {WEIGHTS_FIX}")


def check_loaded(model: torch.nn.Module, built: ModelConfig, weights: str | Path | None, where: str) -> None:
    """After diffusers loaded the model: the config it was built with (keyword overrides included) against the
    weights' record, and no NaN or inf in what was loaded."""
    if weights is not None:
        recorded = recorded_fields(read_header(weights)[0], weights)
        if recorded is not None:
            problem = disagreement(dataclasses.asdict(built), recorded, "the model built",
                                   f"the record in {Path(weights).name}")
            if problem:
                raise ModelLoadError(f"{where}: {problem}; load it without overriding its config, or {REEXPORT}")
    problem = nonfinite_problem(model.state_dict())
    if problem:
        raise ModelLoadError(f"{where}: {problem}; {WEIGHTS_FIX}")


# ----------------------------------------------------------------------------------------------------------
# vit5-sit's door: config.yaml against every file derived from it.

def read_json(path: Path) -> dict:
    """A JSON object file of a model folder; not readable, not JSON or not an object = one line."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                             f"{REEXPORT}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got a {type(data).__name__}; {REEXPORT}")
    return data


def check_record(weights: str | Path, cfg: ExperimentConfig, where: str | Path) -> None:
    """The model config recorded in the weights' metadata (if any) against config.yaml's (``cfg``): the weights'
    own statement of what they are, checked wherever a folder's weights are read (a load, an export)."""
    recorded = recorded_fields(read_header(weights)[0], weights)
    if recorded is not None:
        problem = disagreement(recorded, dataclasses.asdict(cfg.model_config()), f"the record in "
                               f"{Path(weights).name}", "config.yaml")
        if problem:
            raise ModelLoadError(f"{where}: {problem}; {REEXPORT}")


def check_folder(folder: str | Path, cfg: ExperimentConfig, weights: str | Path | None = None) -> None:
    """A model folder's derived files against its config.yaml (``cfg``): transformer/config.json and the weights'
    record (the `ModelConfig`), scheduler/scheduler_config.json (the transport and sampler sections) and
    model_index.json's guidance_scale and guidance_interval (log.sample_cfg_scale, log.sample_guidance_interval).
    Files the folder lacks (older layouts, checkpoint folders) are not checked."""
    from vit5_sit.transport.samplers import SamplerConfig
    from vit5_sit.transport.transport import TransportConfig

    folder = Path(folder)
    model = dataclasses.asdict(cfg.model_config())
    checks = []  # (file, what it states, what config.yaml states)
    transformer = folder / "transformer" / "config.json"
    if transformer.is_file():
        checks.append((transformer, effective_fields(read_json(transformer)), model))
    if weights is not None:
        check_record(weights, cfg, folder)
    scheduler = folder / "scheduler" / "scheduler_config.json"
    if scheduler.is_file():
        stated = read_json(scheduler)
        checks.append((scheduler, {**effective_fields(stated, TransportConfig),
                                   **effective_fields(stated, SamplerConfig)},
                       {**dataclasses.asdict(cfg.transport), **dataclasses.asdict(cfg.sampler)}))
    index = folder / "model_index.json"
    if index.is_file():
        stated = read_json(index)
        if "guidance_scale" in stated:
            checks.append((index, {"guidance_scale": stated["guidance_scale"]},
                           {"guidance_scale": float(cfg.log.sample_cfg_scale)}))
        if "guidance_interval" in stated:  # folders written before it have none: (0, 1)
            checks.append((index, {"guidance_interval": stated["guidance_interval"]},
                           {"guidance_interval": [float(v) for v in cfg.log.sample_guidance_interval]}))
        if "trained_guidance" in stated:  # folders written before it have none
            from vit5_sit.transport.guidance import trained_guidance

            checks.append((index, {"trained_guidance": stated["trained_guidance"]},
                           {"trained_guidance": trained_guidance(cfg)}))
    for path, stated, ours in checks:
        problem = disagreement(stated, ours, path.name if path.parent == folder else
                               f"{path.parent.name}/{path.name}", "config.yaml")
        if problem:
            raise ModelLoadError(f"{folder}: {problem}; {REEXPORT}")
