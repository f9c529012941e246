"""Presets: the size registry whose keys are the CLI's model choices (`SiT-{T,S,B,L,XL}/{2,4,8}`,
`ViT5-...`, `ViT5G-...`, `SiTRoPE-...`), and the factories `model_config` and `create_model`. Any field can be
overridden.

`ViT5-*` is ViT-5 as its paper specifies it (LayerScale 1e-4 included); `ViT5G-*` is the generation preset our
multi-seed MNIST study supports (docs/study/README.md): the same components without LayerScale, whose small
factor multiplies onto adaLN-Zero's zero-initialised gate and delays learning. `SiTRoPE-*` is the vanilla SiT
block with 2D RoPE on the patches and nothing else of ViT-5: the generation study (issue #28) found it ahead of
`ViT5G-*` unguided and level with it guided at 3,600 steps over 3 seeds. All stay one flag away."""

from __future__ import annotations

import dataclasses

from vit5_sit.common.utils import check_choice
from vit5_sit.models.config import ModelConfig
from vit5_sit.models.denoiser import Denoiser

SIZES = {  # depth, width, heads (shared by both families); T is a tiny size for CPU demos and tests
    "T": dict(depth=6, hidden_size=192, num_heads=3),
    "S": dict(depth=12, hidden_size=384, num_heads=6),
    "B": dict(depth=12, hidden_size=768, num_heads=12),
    "L": dict(depth=24, hidden_size=1024, num_heads=16),
    "XL": dict(depth=28, hidden_size=1152, num_heads=16),
}
PATCH_SIZES = (2, 4, 8)
VIT5 = dict(  # the ViT-5 components; everything else as the official SiT
    norm="rmsnorm", qk_norm=True, qkv_bias=False, pos_embed="sincos", rope=True, rope_base=10000.0,
    num_registers=4, register_rope_base=100.0, layer_scale_init=1e-4, mlp="gelu",
)

VIT5G = {**VIT5, "layer_scale_init": None}  # the generation preset: ViT-5 without LayerScale
SIT_ROPE = dict(rope=True)  # the vanilla SiT block with ViT-5's 2D RoPE, nothing else


def SiT(size: str, patch_size: int) -> ModelConfig:
    """The official SiT model (vanilla ViT backbone)."""
    return ModelConfig(patch_size=patch_size, **SIZES[size])


def ViT5(size: str, patch_size: int) -> ModelConfig:
    """SiT with all ViT-5 components on, at the same size."""
    return ModelConfig(patch_size=patch_size, **SIZES[size], **VIT5)


def ViT5G(size: str, patch_size: int) -> ModelConfig:
    """ViT-5 for generation in adaLN-Zero blocks: every ViT-5 component but LayerScale (docs/study)."""
    return ModelConfig(patch_size=patch_size, **SIZES[size], **VIT5G)


def SiTRoPE(size: str, patch_size: int) -> ModelConfig:
    """The official SiT model with 2D RoPE on the patch tokens (the generation study's `sit-rope` arm)."""
    return ModelConfig(patch_size=patch_size, **SIZES[size], **SIT_ROPE)


PRESET_FAMILIES = {  # preset family (the name before "-") -> what it is, in words (model cards)
    "SiT": "SiT (vanilla ViT)", "ViT5": "ViT-5", "ViT5G": "ViT-5", "SiTRoPE": "SiT (vanilla ViT) with 2D RoPE",
}

PRESETS: dict[str, ModelConfig] = {
    **{f"SiT-{s}/{p}": SiT(s, p) for s in SIZES for p in PATCH_SIZES},
    **{f"ViT5-{s}/{p}": ViT5(s, p) for s in SIZES for p in PATCH_SIZES},
    **{f"ViT5G-{s}/{p}": ViT5G(s, p) for s in SIZES for p in PATCH_SIZES},
    **{f"SiTRoPE-{s}/{p}": SiTRoPE(s, p) for s in SIZES for p in PATCH_SIZES},
}


def model_config(name: str, **overrides) -> ModelConfig:
    """A preset's config (a copy) with any fields overridden, e.g. model_config('ViT5-B/2', rope=False)."""
    check_choice("preset", name, PRESETS)
    return _replace(PRESETS[name], overrides)


def create_model(name_or_config: str | ModelConfig, **overrides) -> Denoiser:
    """A freshly initialised `Denoiser` from a preset name or a config, with optional field overrides."""
    if isinstance(name_or_config, str):
        return Denoiser(model_config(name_or_config, **overrides))
    return Denoiser(_replace(name_or_config, overrides))


def _replace(cfg: ModelConfig, overrides: dict) -> ModelConfig:
    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = [k for k in overrides if k not in fields]
    if unknown:
        raise ValueError(f"unknown ModelConfig field(s) {', '.join(map(repr, unknown))}; fields are: "
                         f"{', '.join(fields)}")
    return dataclasses.replace(cfg, **overrides)
