"""The denoiser (vanilla SiT and ViT-5 in one model class), its presets and the official SiT loader.

config.py (ModelConfig), positions.py (sin-cos, RoPE), layers.py, denoiser.py (`Denoiser`; `DiT` is an
alias), flops.py (count_params, count_flops), presets.py (PRESETS, model_config, create_model),
official.py (official SiT files); dit.py re-exports the names it held before the split.

    from vit5_sit.models import create_model
    model = create_model("ViT5-B/2", rope=False)   # any preset, any field overridden

`python -m vit5_sit.models` lists the presets with their parameter counts and GFLOPs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vit5_sit.common.lazy import lazy_exports

# The names below are imported from their modules on first use (PEP 562), so that importing this package, as
# `python -m vit5_sit.models --help` does, costs nothing until a model is needed (the modules import torch).
_EXPORTS = {
    "ModelConfig": "config",
    "Denoiser": "denoiser", "DiT": "denoiser",
    "count_flops": "flops", "count_params": "flops",
    "infer_official_config": "official", "load_official_state_dict": "official", "read_state_dict": "official",
    "PRESETS": "presets", "PRESET_FAMILIES": "presets", "create_model": "presets", "model_config": "presets",
}

if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from vit5_sit.models.config import ModelConfig
    from vit5_sit.models.denoiser import Denoiser, DiT
    from vit5_sit.models.flops import count_flops, count_params
    from vit5_sit.models.official import infer_official_config, load_official_state_dict, read_state_dict
    from vit5_sit.models.presets import PRESET_FAMILIES, PRESETS, create_model, model_config


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = [
    "PRESET_FAMILIES",
    "PRESETS",
    "Denoiser",
    "DiT",
    "ModelConfig",
    "count_flops",
    "count_params",
    "create_model",
    "infer_official_config",
    "load_official_state_dict",
    "model_config",
    "read_state_dict",
]
