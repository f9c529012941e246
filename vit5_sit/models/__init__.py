"""The denoiser (vanilla SiT and ViT-5 in one model class), its presets and the official SiT loader.

    from vit5_sit.models import create_model
    model = create_model("ViT5-B/2", rope=False)   # any preset, any field overridden

`python -m vit5_sit.models` lists the presets with their parameter counts and GFLOPs.
"""

from vit5_sit.models.dit import (
    PRESETS,
    DiT,
    ModelConfig,
    count_flops,
    count_params,
    create_model,
    model_config,
)
from vit5_sit.models.official import infer_official_config, load_official_state_dict, read_state_dict

__all__ = [
    "PRESETS",
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
