"""Load an official SiT checkpoint (`SiT-XL-2-256x256.pt`, or a training checkpoint of the official code).

The vanilla presets have the official module layout, so the file loads with strict=True. When it does not
fit, the error names the config fields that differ (read from the tensor shapes) and the mismatched keys.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import torch

from vit5_sit.models.config import ModelConfig
from vit5_sit.models.denoiser import Denoiser
from vit5_sit.models.presets import SIZES, model_config

_PREFIXES = ("module.", "_orig_mod.")  # DDP and torch.compile wrappers
_HEADS = {s["hidden_size"]: s["num_heads"] for s in SIZES.values()}  # num_heads of the preset sizes, by width
_MAX_LISTED = 8


class StateDictMismatch(ValueError):
    """A state dict that does not fit the model. `file_fields`: the config fields its shapes determine;
    `differing`: those the model has otherwise, {name: (file value, model value)}."""

    def __init__(self, message: str, file_fields: dict, differing: dict, details: list[str]):
        super().__init__(message)
        self.file_fields, self.differing, self.details = file_fields, differing, details


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The weights in an official SiT file: a raw (EMA) state dict, or a training checkpoint with `model` /
    `ema` entries (`ema` preferred). Read with weights_only=True; `.safetensors` files are read too."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            obj = load_file(str(path))
        else:
            # The official training checkpoints pickle their argparse.Namespace under "args".
            with torch.serialization.safe_globals([argparse.Namespace]):
                obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to read is reported the same way
        from vit5_sit.common.checks import first_line

        raise ValueError(f"{path}: cannot read it as a PyTorch checkpoint with weights_only=True "
                         f"({first_line(e)})") from None
    if isinstance(obj, dict):
        for entry in ("ema", "model"):
            if isinstance(obj.get(entry), dict):
                obj = obj[entry]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        keys = list(obj)[:_MAX_LISTED] if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(f"{path}: not a state dict (expected tensors, or a dict with 'ema' / 'model' "
                         f"entries; found {keys})")
    for prefix in _PREFIXES:
        if all(k.startswith(prefix) for k in obj):
            obj = {k[len(prefix):]: v for k, v in obj.items()}
    return obj


def file_config_fields(state: dict[str, torch.Tensor], class_dropout: bool = True) -> dict[str, object]:
    """The `ModelConfig` fields that the tensor shapes of a state dict determine (the ones it can)."""
    fields: dict[str, object] = {}
    w = state.get("x_embedder.proj.weight")
    if w is None or w.ndim != 4:
        return fields
    D, C, p = w.shape[0], w.shape[1], w.shape[2]
    fields.update(hidden_size=D, in_channels=C, patch_size=p)
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    fields["depth"] = len(blocks)
    out = state.get("final_layer.linear.weight")
    if out is not None and out.shape[0] in (p * p * C, 2 * p * p * C):
        fields["learn_sigma"] = out.shape[0] == 2 * p * p * C
    table = state.get("y_embedder.embedding_table.weight")
    if table is not None:
        fields["num_classes"] = table.shape[0] - int(class_dropout)
    pos = state.get("pos_embed")
    if pos is not None and pos.ndim == 3:
        side = round(pos.shape[1] ** 0.5)
        if side * side == pos.shape[1]:
            fields["input_size"] = side * p
    if "blocks.0.attn.qkv.weight" in state:
        fields["qkv_bias"] = "blocks.0.attn.qkv.bias" in state
        fields["qk_norm"] = "blocks.0.attn.q_norm.weight" in state
        fields["mlp"] = "swiglu" if "blocks.0.mlp.w12.weight" in state else "gelu"
    reg = state.get("register_tokens")
    fields["num_registers"] = reg.shape[1] if reg is not None else 0
    return fields


def infer_official_config(state: dict[str, torch.Tensor]) -> ModelConfig:
    """The vanilla config of an official-layout state dict (num_heads from the preset sizes, by width)."""
    fields = file_config_fields(state)
    if "hidden_size" not in fields or "blocks.0.attn.qkv.weight" not in state:
        raise ValueError("not an official SiT state dict (no x_embedder.proj.weight or "
                         "blocks.0.attn.qkv.weight)")
    heads = _HEADS.get(fields["hidden_size"])
    if heads is None:
        raise ValueError(f"hidden_size={fields['hidden_size']} is not a preset width "
                         f"({', '.join(map(str, _HEADS))}); num_heads cannot be inferred")
    keep = ("hidden_size", "in_channels", "patch_size", "depth", "learn_sigma", "num_classes", "input_size")
    return model_config("SiT-XL/2", num_heads=heads, **{k: fields[k] for k in keep if k in fields})


def state_dict_mismatch(expected: dict, state: dict) -> tuple[list[str], list[str], list[tuple]]:
    """(missing keys, unexpected keys, [(key, file shape, model shape)]) of a state dict against a model's."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [(k, state[k].shape, v.shape) for k, v in expected.items() if k in state and state[k].shape != v.shape]
    return missing, unexpected, wrong


def load_official_state_dict(model: Denoiser, path: str | os.PathLike) -> Denoiser:
    """Load an official SiT file into `model` strictly (see `read_state_dict`); returns the model.

    Raises FileNotFoundError for a missing file, ValueError for an unreadable one, one that does not fit
    the model's config (naming the fields to pass and the mismatched keys and shapes), or one holding tensors
    that are not finite floating-point numbers.
    """
    state = read_state_dict(path)
    missing, unexpected, wrong = state_dict_mismatch(model.state_dict(), state)
    shapes = [f"{k}: file {tuple(f)} vs model {tuple(m)}" for k, f, m in wrong]
    if missing or unexpected or shapes:
        cfg = model.cfg
        fields = file_config_fields(state, cfg.class_dropout_prob > 0)
        differing = {k: (v, getattr(cfg, k)) for k, v in fields.items() if getattr(cfg, k) != v}
        hints = [f"this file has {k}={v!r}; pass {k}={v!r} (the model has {m!r})" for k, (v, m) in differing.items()]
        details = [f"{len(missing)} missing keys: {listed(missing)}" if missing else "",
                   f"{len(unexpected)} unexpected keys: {listed(unexpected)}" if unexpected else "",
                   f"{len(shapes)} shape mismatches: {listed(shapes)}" if shapes else ""]
        details = [d for d in details if d]
        raise StateDictMismatch(f"{path}: does not fit the model. " + "; ".join(hints + details), fields,
                                differing, details)
    from vit5_sit.common.checks import tensors_problem

    problem = tensors_problem(state, model.state_dict())  # a dtype, NaN or inf that loading would hide
    if problem:
        raise ValueError(f"{path}: {problem}; download the file again")
    model.load_state_dict(state, strict=True)
    return model


def listed(items: list[str]) -> str:
    """The first few names, comma-separated, and how many more there are (for mismatch messages)."""
    more = f", ... ({len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else ""
    return ", ".join(items[:_MAX_LISTED]) + more
