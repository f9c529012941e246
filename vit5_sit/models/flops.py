"""The size of a model: parameters (on the meta device) and analytic forward FLOPs per image."""

from __future__ import annotations

import torch
from torch import nn

from vit5_sit.models.config import ModelConfig
from vit5_sit.models.denoiser import Denoiser
from vit5_sit.models.layers import TIMESTEP_FREQ_DIM
from vit5_sit.models.presets import model_config


def count_params(model: nn.Module | ModelConfig | str, trainable_only: bool = False) -> int:
    """Parameters of a model, a config or a preset name (built on the meta device: instant, no memory).

    Frozen parameters (the sin-cos pos_embed) count unless trainable_only, as in the official numbers.
    """
    if not isinstance(model, nn.Module):
        cfg = model_config(model) if isinstance(model, str) else model
        with torch.device("meta"):
            model = Denoiser(cfg)
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def count_flops(cfg: ModelConfig | str, input_size: int | None = None) -> int:
    """Forward FLOPs for one image, analytically: one multiply-add counts as one FLOP (the fvcore convention
    behind DiT's and SiT's GFLOPs tables). Matmuls, the attention products and the patch convolution count;
    norms, activations, softmax and RoPE (elementwise) do not. input_size: height = width of x (None = the
    training size). Registers add tokens to every block."""
    if isinstance(cfg, str):
        cfg = model_config(cfg)
    size = cfg.input_size if input_size is None else input_size
    D, p = cfg.hidden_size, cfg.patch_size
    if size < 1 or size % p:
        raise ValueError(f"input_size={size}: must be a positive multiple of the patch size {p}")
    n_patch = (size // p) ** 2
    T = n_patch + cfg.num_registers
    mlp = 2 * D * int(D * cfg.mlp_ratio) if cfg.mlp == "gelu" else 3 * D * cfg.swiglu_hidden
    per_block = T * (3 * D * D + D * D + mlp) + 2 * T * T * D + 6 * D * D  # qkv, proj, mlp; QK^T, AV; adaLN
    embed = n_patch * cfg.in_channels * p * p * D + TIMESTEP_FREQ_DIM * D + D * D
    final = 2 * D * D + n_patch * D * p * p * cfg.out_channels
    return cfg.depth * per_block + embed + final
