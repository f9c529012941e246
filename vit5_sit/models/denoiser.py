"""The denoiser: SiT's DiT-style transformer with every ViT-5 component a switch in `ModelConfig`.

One model class, `Denoiser`, serves both families. With the vanilla settings it *is* the official SiT model
(same modules, same state-dict keys, same initialisation, same outputs); the ViT-5 settings change only
the components listed in docs/DESIGN.md section 3, each by one `ModelConfig` field:

    field               vanilla SiT        ViT-5
    norm                'layernorm'        'rmsnorm'
    qk_norm             False              True
    qkv_bias            True               False
    pos_embed / rope    'sincos' / False   'sincos' / True   (absolute embedding *and* 2D RoPE)
    num_registers       0                  4                 (own 2D RoPE, base register_rope_base=100)
    layer_scale_init    None               1e-4
    mlp                 'gelu'             'gelu'            ('swiglu' stays available for the ablation)

The ViT-5 presets keep SiT's frozen sin-cos table as their absolute embedding, so the two families differ
only in the rows above (ViT-5's classifier learns its table: `pos_embed='learned'`, which starts from the
sin-cos values).

`model(x, t, y)`: x (B, C, H, W) image or latent, t (B,) floats in [0, 1] (0 = noise, 1 = data, the SiT
convention), y (B,) class ids, where id `num_classes` is the null label (unconditional). Returns the
prediction, (B, C, H, W); with learn_sigma the second half of the output channels is dropped.

The model runs at grid sizes other than the training one (another resolution): sin-cos tables and RoPE
tables are recomputed for the new grid, a learned absolute embedding is interpolated. In all three the
positions of the new grid are rescaled to span the training grid, as the official ViT-5 RoPE does and as
interpolating a learned table does, so a token keeps the relative location it had in training.

The size registry `PRESETS` is in `vit5_sit.models.presets`; its keys are the CLI's model choices. The
layers are in `vit5_sit.models.layers`, the position tables in `vit5_sit.models.positions`.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vit5_sit.models.config import ModelConfig
from vit5_sit.models.layers import (
    DiTBlock,
    FinalLayer,
    GuidanceEmbedder,
    LabelEmbedder,
    PatchEmbed,
    SwiGLU,
    TimestepEmbedder,
    forward_ad_ops,
)
from vit5_sit.models.positions import Rope, grid_positions, rope_angles_2d, rope_tables, sincos_pos_embed_2d

INIT_STD = 0.02                 # N(0, 0.02) for the label table, timestep MLP and register tokens
# x-prediction (`ModelConfig.x_prediction`): U = (x_hat - x_t) / max(1 - t, X_PRED_MIN_GAP). The floor keeps the
# division finite at the data end t -> 1; a sampler's last step (ending at t = 1) starts at t <= 0.95 for up to
# 20 steps, where the floor never acts and the sample is x_hat itself.
X_PRED_MIN_GAP = 0.05


class Denoiser(nn.Module):
    """SiT's DiT-style denoiser; `ModelConfig` switches each ViT-5 component (see the module docstring).

    Absolute position (`pos_embed`): 'sincos' is the official frozen 2D sin-cos table (a Parameter with
    requires_grad=False, in the state dict); 'learned' starts from the same table and trains; 'none' has
    none. ViT-5 keeps the absolute embedding *and* adds RoPE: RoPE gives relative position, the absolute
    embedding stops the model from being blind to a patch-level flip of the image (with relative position
    only, a flipped image is processed like the original up to a fixed reflection of rotary channels).

    Registers: `num_registers` learnable tokens appended after the patches and discarded at the output.
    They absorb the high-norm "artefact" attention that otherwise lands on background patches. With RoPE
    they get their own 2D rotation (row-major on a ceil(sqrt(n)) grid, 2x2 for 4) at a different frequency
    base: un-rotated registers are most similar to patches with small rotation angles, which biases
    attention by position; `register_rope_base=None` leaves them un-rotated (that ablation).

    RoPE and sin-cos tables are cached per (grid, device) in a plain dict, not in the state dict.
    `forward(..., return_hidden=(k, ...))` also returns the patch tokens after block k (1-based; registers
    excluded), for representation alignment (REPA); without it nothing is kept.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = dataclasses.replace(cfg)
        self.in_channels, self.out_channels = cfg.in_channels, cfg.out_channels
        self.patch_size, self.num_classes, self.learn_sigma = cfg.patch_size, cfg.num_classes, cfg.learn_sigma
        D, n = cfg.hidden_size, cfg.grid_size

        self.x_embedder = PatchEmbed(cfg.patch_size, cfg.in_channels, D)
        self.t_embedder = TimestepEmbedder(D)
        # MeanFlow: the interval length t - r of the average velocity gets its own embedder, summed into the
        # conditioning (the paper's ImageNet choice, (t, t - r)): at interval 0 the model is a flow model. With
        # DMF's split (cfg.dmf_depth) there is none: the later blocks see the interval's end through t_embedder.
        self.interval_embedder = TimestepEmbedder(D) if cfg.mean_flow and not cfg.dmf_depth else None
        # iMF: the guidance scale and its interval as inputs (one-step models guided at sampling time, one pass).
        self.guidance_embedder = GuidanceEmbedder(D) if cfg.guidance_input else None
        self.y_embedder = LabelEmbedder(cfg.num_classes, D, cfg.class_dropout_prob)
        if cfg.pos_embed != "none":
            self.pos_embed = nn.Parameter(torch.zeros(1, n * n, D), requires_grad=cfg.pos_embed == "learned")
        else:
            self.pos_embed = None
        if cfg.num_registers:
            self.register_tokens = nn.Parameter(torch.zeros(1, cfg.num_registers, D))
        else:
            self.register_tokens = None
        self.blocks = nn.ModuleList([DiTBlock(cfg) for _ in range(cfg.depth)])
        self.final_layer = FinalLayer(cfg)
        self.grad_checkpointing = False
        self._tables: dict[tuple, object] = {}  # (kind, grid_h, grid_w, device) -> cached position tables
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """The official SiT/DiT initialisation, plus N(0, 0.02) register tokens (ViT-5's choice)."""
        def _basic_init(module: nn.Module) -> None:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        self.apply(_basic_init)
        # Xavier bounds of the SwiGLU gate and value halves as two separate (hidden, D) matrices.
        for block in self.blocks:
            if isinstance(block.mlp, SwiGLU):
                h = block.mlp.hidden
                nn.init.xavier_uniform_(block.mlp.w12.weight[:h])
                nn.init.xavier_uniform_(block.mlp.w12.weight[h:])

        if self.pos_embed is not None:  # 'sincos' (frozen) and 'learned' both start from the sin-cos table
            n = self.cfg.grid_size
            with torch.no_grad():
                self.pos_embed.copy_(sincos_pos_embed_2d(self.cfg.hidden_size, n, n).float().unsqueeze(0))
        if self.register_tokens is not None:
            nn.init.trunc_normal_(self.register_tokens, std=INIT_STD)

        # Patch embedding initialised like nn.Linear (instead of nn.Conv2d).
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.zeros_(self.x_embedder.proj.bias)

        nn.init.normal_(self.y_embedder.embedding_table.weight, std=INIT_STD)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=INIT_STD)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=INIT_STD)
        if self.interval_embedder is not None:
            nn.init.normal_(self.interval_embedder.mlp[0].weight, std=INIT_STD)
            nn.init.normal_(self.interval_embedder.mlp[2].weight, std=INIT_STD)
        if self.guidance_embedder is not None:  # neutral at the start: the last layers zero
            for embedder in (self.guidance_embedder.scale, self.guidance_embedder.low, self.guidance_embedder.high):
                nn.init.normal_(embedder.mlp[0].weight, std=INIT_STD)
                nn.init.zeros_(embedder.mlp[2].weight)
                nn.init.zeros_(embedder.mlp[2].bias)

        # adaLN-Zero: every block starts as the identity, the output as zero. A non-zero gate_init starts the
        # gates (chunks 2 and 5 of shift, scale, gate, shift, scale, gate) there instead: with LayerScale, the
        # branch then starts at lambda * gate_init rather than at a product of two zeros.
        D = self.cfg.hidden_size
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
            if self.cfg.gate_init:
                with torch.no_grad():
                    block.adaLN_modulation[-1].bias[2 * D:3 * D] = self.cfg.gate_init
                    block.adaLN_modulation[-1].bias[5 * D:6 * D] = self.cfg.gate_init
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.final_layer.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass (torch.utils.checkpoint, non-reentrant): less memory."""
        self.grad_checkpointing = bool(enable)

    # Position tables --------------------------------------------------------------------------------------

    def _cached(self, key: tuple, make):
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = make()
        return table

    def absolute_pos_embed(self, grid_h: int, grid_w: int, device: torch.device) -> torch.Tensor | None:
        """(1, grid_h * grid_w, D) absolute embedding for a grid, or None for pos_embed='none'."""
        n = self.cfg.grid_size
        if self.pos_embed is None or (grid_h, grid_w) == (n, n):
            return self.pos_embed
        if self.cfg.pos_embed == "learned":  # interpolate the trained table (differentiable, not cached)
            D = self.cfg.hidden_size
            table = self.pos_embed.reshape(1, n, n, D).permute(0, 3, 1, 2)
            table = F.interpolate(table.float(), size=(grid_h, grid_w), mode="bicubic", align_corners=False)
            return table.permute(0, 2, 3, 1).reshape(1, grid_h * grid_w, D).to(self.pos_embed.dtype)
        return self._cached(
            ("sincos", grid_h, grid_w, device),
            lambda: sincos_pos_embed_2d(self.cfg.hidden_size, grid_h, grid_w, n, n).float()[None].to(device))

    def rope_tables(self, grid_h: int, grid_w: int, device: torch.device) -> Rope:
        """RoPE tables of the patch tokens then the registers, (grid_h * grid_w + num_registers, hd / 2)."""
        return self._cached(("rope", grid_h, grid_w, device),
                            lambda: self._make_rope_tables(grid_h, grid_w, device))

    def _make_rope_tables(self, grid_h: int, grid_w: int, device: torch.device) -> Rope:
        cfg, n = self.cfg, self.cfg.grid_size
        rows = grid_positions(grid_h, n)[:, None].expand(grid_h, grid_w).reshape(-1)
        cols = grid_positions(grid_w, n)[None, :].expand(grid_h, grid_w).reshape(-1)
        angles = [rope_angles_2d(cfg.head_dim, rows, cols, cfg.rope_base)]
        if cfg.num_registers:
            side = math.ceil(math.sqrt(cfg.num_registers))
            idx = torch.arange(cfg.num_registers, dtype=torch.float64)
            if cfg.register_rope_base is None:  # registers not rotated (angle 0)
                angles.append(torch.zeros(cfg.num_registers, cfg.head_dim // 2, dtype=torch.float64))
            else:
                angles.append(rope_angles_2d(cfg.head_dim, idx // side, idx % side, cfg.register_rope_base))
        return rope_tables(torch.cat(angles), device)

    # Forward ----------------------------------------------------------------------------------------------

    def unpatchify(self, x: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
        """(B, T, p * p * C_out) -> (B, C_out, grid_h * p, grid_w * p)."""
        p, c = self.patch_size, self.out_channels
        x = x.reshape(x.shape[0], grid_h, grid_w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, grid_h * p, grid_w * p)

    @property
    def null_label(self) -> int:
        """The unconditional (classifier-free guidance) label id."""
        return self.cfg.null_label

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, return_hidden: tuple[int, ...] = (),
                interval: torch.Tensor | None = None, guidance: torch.Tensor | None = None):
        """x (B, C, H, W), t (B,) in [0, 1] (0 = noise, 1 = data), y (B,) long -> (B, C, H, W).

        return_hidden: block numbers k (1-based); then returns ``(out, {k: (B, T, D) patch tokens after
        block k})``.
        interval: MeanFlow models (``cfg.mean_flow``) only: (B,) lengths d >= 0 of the time interval [t, t + d]
        whose average velocity the model predicts (`vit5_sit.transport.meanflow`); None = 0, the instantaneous
        velocity. It enters through ``interval_embedder``, summed into every block's conditioning, or with
        ``cfg.dmf_depth`` = k (DMF's decoupled conditioning) as the interval's end t + d: blocks 1..k are
        conditioned on t, the later blocks and the final layer on t + d, both through ``t_embedder``.
        guidance: iMF models (``cfg.guidance_input``) only: (B, 3) = (scale w, low, high), the guidance the
        prediction has, acting for t in [low, high] (`vit5_sit.transport.meanflow.guidance_inputs`); None = no
        guidance (1, 0, 1).
        With ``cfg.x_prediction`` the network's output is the data point x_hat and the returned velocity is
        (x_hat - x) / max(1 - t, X_PRED_MIN_GAP).
        """
        B, C, H, W = x.shape
        p = self.patch_size
        x_in = x
        if C != self.in_channels or H % p or W % p:
            raise ValueError(f"input of shape {tuple(x.shape)}: expected {self.in_channels} channels and a "
                             f"height and width divisible by patch_size={p}")
        if t.ndim == 0:
            t = t.expand(B)
        if any(not 1 <= k <= len(self.blocks) for k in return_hidden):
            raise ValueError(f"return_hidden={tuple(return_hidden)}: block numbers run from 1 to {len(self.blocks)}")
        grid_h, grid_w = H // p, W // p
        T = grid_h * grid_w

        x = self.x_embedder(x)                                    # (B, T, D)
        pos = self.absolute_pos_embed(grid_h, grid_w, x.device)
        if pos is not None:
            x = x + pos.to(x.dtype)                               # (B, T, D)
        if self.register_tokens is not None:
            x = torch.cat([x, self.register_tokens.expand(B, -1, -1).to(x.dtype)], dim=1)  # (B, T + R, D)
        rope = self.rope_tables(grid_h, grid_w, x.device) if self.cfg.rope else None  # (T + R, hd / 2)
        c_y = self.y_embedder(y)                                  # (B, D)
        c = self.t_embedder(t) + c_y                              # (B, D)
        c_end = None  # DMF (cfg.dmf_depth): the conditioning of the blocks after the first dmf_depth
        if self.cfg.mean_flow:
            if interval is None:
                interval = torch.zeros_like(t)
            elif interval.ndim == 0:
                interval = interval.expand(B)
            if self.interval_embedder is not None:
                c = c + self.interval_embedder(interval)          # (B, D)
            else:  # DMF: the decoder sees the interval's end, as the encoder sees its start
                c_end = self.t_embedder(t + interval) + c_y       # (B, D)
        elif interval is not None:
            raise ValueError("interval= is for MeanFlow models (ModelConfig.mean_flow=True); this model predicts "
                             "the instantaneous velocity only")
        if self.guidance_embedder is not None:
            if guidance is None:
                guidance = torch.tensor([[1.0, 0.0, 1.0]], device=x.device).expand(B, 3)  # no guidance
            elif guidance.shape != (B, 3):
                raise ValueError(f"guidance of shape {tuple(guidance.shape)}: expected ({B}, 3), a (scale, low, "
                                 "high) row per sample")
            c_g = self.guidance_embedder(guidance)                # (B, D)
            c = c + c_g
            c_end = None if c_end is None else c_end + c_g
        elif guidance is not None:
            raise ValueError("guidance= is for iMF models (ModelConfig.guidance_input=True, meanflow.variant=imf); "
                             "guide this model with classifier-free guidance (two passes) instead")

        hidden = {}
        for k, block in enumerate(self.blocks, start=1):
            c_k = c_end if c_end is not None and k > self.cfg.dmf_depth else c
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, c_k, rope, use_reentrant=False)
            else:
                x = block(x, c_k, rope)                           # (B, T + R, D)
            if k in return_hidden:
                hidden[k] = x[:, :T]                              # (B, T, D): patch tokens only
        x = x[:, :T]                                              # (B, T, D): registers dropped
        x = self.final_layer(x, c if c_end is None else c_end)    # (B, T, p * p * C_out)
        x = self.unpatchify(x, grid_h, grid_w)                    # (B, C_out, H, W)
        if self.learn_sigma:
            x = x[:, :C]                                          # (B, C, H, W): the sigma half dropped
        if self.cfg.x_prediction:  # the output is the data point x_hat; the model's answer stays a velocity
            x = (x - x_in) / (1 - t).clamp_min(X_PRED_MIN_GAP).to(x.dtype).view(B, 1, 1, 1)
        return (x, hidden) if return_hidden else x


    def jvp(self, primals: tuple[torch.Tensor, torch.Tensor, torch.Tensor], tangents: tuple, y: torch.Tensor,
            guidance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward-mode JVP of the output in (x, t, interval) for labels y (and iMF's guidance inputs, held
        fixed): returns (output, d output) for the tangents (dx, dt, d interval); through `torch.func.jvp` with
        the plain ops (`forward_ad_ops`)."""
        kw = {} if guidance is None else {"guidance": guidance}
        with forward_ad_ops():
            return torch.func.jvp(lambda x, t, d: self(x, t, y, interval=d, **kw), primals, tangents)


DiT = Denoiser  # the former name (the official code's): old imports keep working
