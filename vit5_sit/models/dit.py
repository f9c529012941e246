"""Compatibility module: the names that `vit5_sit.models.dit` held before the split, re-exported.

The model now lives in modules with one job each; import from them (or from `vit5_sit.models`):

    config.py     ModelConfig and its checks
    positions.py  sin-cos tables, 2D RoPE angles, tables and rotation
    layers.py     norms, embedders, attention, MLPs, the block, the final layer
    denoiser.py   the model class `Denoiser` (`DiT` is its former name, kept as an alias)
    flops.py      count_params, count_flops
    presets.py    SIZES, SiT(), ViT5(), PRESETS, model_config, create_model
"""

from vit5_sit.models.config import MLPS, NORMS, POS_EMBEDS, ModelConfig
from vit5_sit.models.denoiser import INIT_STD, Denoiser, DiT
from vit5_sit.models.flops import count_flops, count_params
from vit5_sit.models.layers import (
    NORM_EPS,
    TIMESTEP_FREQ_DIM,
    TIMESTEP_MAX_PERIOD,
    Attention,
    DiTBlock,
    FinalLayer,
    LabelEmbedder,
    Mlp,
    PatchEmbed,
    RMSNorm,
    SwiGLU,
    TimestepEmbedder,
    make_norm,
    modulate,
    norm_rotate,
    rms_norm,
)
from vit5_sit.models.positions import SINCOS_BASE, Rope, apply_rope, rope_angles_2d, rope_tables, sincos_pos_embed_2d
from vit5_sit.models.presets import PATCH_SIZES, PRESETS, SIZES, VIT5, SiT, ViT5, create_model, model_config

__all__ = [
    "INIT_STD", "MLPS", "NORMS", "NORM_EPS", "PATCH_SIZES", "POS_EMBEDS", "PRESETS", "SINCOS_BASE", "SIZES",
    "TIMESTEP_FREQ_DIM", "TIMESTEP_MAX_PERIOD", "VIT5", "Attention", "Denoiser", "DiT", "DiTBlock", "FinalLayer",
    "LabelEmbedder", "Mlp", "ModelConfig", "PatchEmbed", "RMSNorm", "Rope", "SiT", "SwiGLU", "TimestepEmbedder",
    "ViT5", "apply_rope", "count_flops", "count_params", "create_model", "make_norm", "model_config", "modulate",
    "norm_rotate", "rms_norm", "rope_angles_2d", "rope_tables", "sincos_pos_embed_2d",
]
