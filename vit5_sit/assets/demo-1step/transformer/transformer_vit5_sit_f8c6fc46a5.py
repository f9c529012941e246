# Vit5SitTransformer2DModel, written by vit5-sit 0.1.0 when this model folder was exported: every definition
# below is copied from the vit5_sit package's source (the module named above each group), so that
# diffusers loads the folder without vit5-sit: DiffusionPipeline.from_pretrained(folder,
# trust_remote_code=True). Not edited by hand: export the folder again to update it.
from __future__ import annotations
from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin, SchedulerMixin
from torch import nn
import dataclasses
import torch
import math
import torch.nn.functional as F
from typing import NamedTuple
from torch.utils.checkpoint import checkpoint
import contextlib
import inspect
from diffusers.configuration_utils import register_to_config
import difflib
from dataclasses import dataclass
from pathlib import Path
import json


# ---- from vit5_sit.models.layers ------------------------------------------------------------------------------


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, T, D) by a strided convolution (`x_embedder.proj`, as timm's PatchEmbed)."""

    def __init__(self, patch_size: int, in_channels: int, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, hidden_size, kernel_size=patch_size, stride=patch_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


TIMESTEP_FREQ_DIM = 256         # sinusoidal frequencies of the timestep embedding (official SiT)


TIMESTEP_MAX_PERIOD = 10000.0


class TimestepEmbedder(nn.Module):
    """t (B,) in [0, 1] -> (B, D): 256 sinusoidal frequencies laid out [cos, sin], then Linear-SiLU-Linear.

    SiT feeds the raw t in [0, 1] (no x1000 as in DiT); the frequencies are the official ones.
    """

    def __init__(self, hidden_size: int, freq_dim: int = TIMESTEP_FREQ_DIM) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))

    @staticmethod
    def timestep_embedding(t: torch.Tensor, dim: int,
                           max_period: float = TIMESTEP_MAX_PERIOD) -> torch.Tensor:
        half = dim // 2
        steps = torch.arange(half, dtype=torch.float32, device=t.device)
        freqs = torch.exp(-math.log(max_period) * steps / half)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        return emb

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        t_freq = self.timestep_embedding(t, self.freq_dim)  # (B, 256)
        return self.mlp(t_freq.to(self.mlp[0].weight.dtype))


class GuidanceEmbedder(nn.Module):
    """iMF's guidance inputs (B, 3) = (scale w, low, high) -> (B, D): one timestep embedder each, for 1 - 1/w
    (0 without guidance, as the official code) and the two ends of the interval where w acts, summed. The last
    layer of each starts at zero, so a model starts neutral: its output is that of the model without the input."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.scale, self.low, self.high = (TimestepEmbedder(hidden_size) for _ in range(3))

    def forward(self, guidance: torch.Tensor) -> torch.Tensor:
        w, low, high = guidance.float().unbind(1)
        return self.scale(1 - 1 / w) + self.low(low) + self.high(high)  # (B, D)


class LabelEmbedder(nn.Module):
    """Class ids -> (B, D). With class_dropout_prob > 0 the table has a null row, id ``null_label``
    (= num_classes), the unconditional label of classifier-free guidance. Labels are not dropped here: the
    training objective replaces them by the null label (vit5_sit.train.objective), the one place that does."""

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden_size)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels)


NORM_EPS = 1e-6                 # LayerNorm / RMSNorm epsilon (official DiT/SiT and ViT-5)


_FORWARD_AD = [0]  # > 0 while `forward_ad_ops()` is active (nesting depth)


def forward_ad_active() -> bool:
    return _FORWARD_AD[0] > 0


def rms_norm(x: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, in x's dtype (callers pass float32).

    The plain differentiable form: what torch.compile fuses, and the reference `norm_rotate` matches."""
    if x.is_cuda:
        return F.rms_norm(x, (x.shape[-1],), eps=eps)  # a fused kernel
    # On the CPU F.rms_norm runs as pow, mean, add, rsqrt, mul; one vector_norm reduction is faster.
    return x * torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.shape[-1] + eps)


# ---- from vit5_sit.models.positions ---------------------------------------------------------------------------


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate each channel pair (2j, 2j + 1) of x (..., T, head_dim), float32, by its angle.

    Eager: one complex multiplication (a single kernel forward and backward, ~3x faster on the CPU than
    the real form). Under torch.compile: the real form, which the compiler fuses.
    """
    pairs = x.unflatten(-1, (-1, 2))  # (..., T, head_dim / 2, 2)
    if torch.compiler.is_compiling():
        x1, x2 = pairs.unbind(-1)
        return torch.stack([x1 * rope.cos - x2 * rope.sin, x2 * rope.cos + x1 * rope.sin], -1).flatten(-2)
    rot = rope.rot if rope.rot is not None else torch.complex(rope.cos, rope.sin)
    return torch.view_as_real(torch.view_as_complex(pairs) * rot).flatten(-2)


# ---- from vit5_sit.models.layers ------------------------------------------------------------------------------


class _NormRotate(torch.autograd.Function):
    """y = rotate(rms_norm(x) * weight) in float32, returned in x's dtype, with a hand-written backward.

    Autograd through the plain ops saves several float32 tensors and runs ~10 elementwise kernels in the
    backward pass (most of ViT-5's extra cost over LayerNorm on a CPU); here the backward is
    dx = r * (g' - x_hat * mean(g' * x_hat)) with g' = weight * rotate^-1(g), from the saved x_hat and r.
    weight broadcasts against x (None: no weight); rot (T, C/2) complex rotates channel pairs (None: none).
    """

    @staticmethod
    def forward(ctx, x, weight, rot, eps):
        xf = x.float()
        r = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        x_hat = xf * r
        y = x_hat if weight is None else x_hat * weight.float()
        if rot is not None:
            y = torch.view_as_real(torch.view_as_complex(y.unflatten(-1, (-1, 2))) * rot).flatten(-2)
        ctx.save_for_backward(x_hat, r, weight, rot)
        ctx.dtypes = x.dtype, None if weight is None else weight.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x_hat, r, weight, rot = ctx.saved_tensors
        g = grad.float()
        if rot is not None:  # the inverse rotation: multiply by the conjugate
            pairs = g.unflatten(-1, (-1, 2))
            if pairs.stride(-1) != 1 or any(st % 2 for st in pairs.stride()[:-1]):  # e.g. an expanded grad
                pairs = pairs.contiguous()
            g = torch.view_as_real(torch.view_as_complex(pairs) * rot.conj()).flatten(-2)
        grad_weight = None
        if weight is not None:
            if ctx.needs_input_grad[1]:
                grad_weight = (g * x_hat).sum_to_size(weight.shape).to(ctx.dtypes[1])
            g = g * weight.float()
        mean = torch.linalg.vecdot(g, x_hat, dim=-1).unsqueeze_(-1).div_(x_hat.shape[-1])
        grad_x = torch.addcmul(g, x_hat, mean, value=-1).mul_(r)
        return grad_x.to(ctx.dtypes[0]), grad_weight, None, None


def norm_rotate(x: torch.Tensor, weight: torch.Tensor | None = None, rope: Rope | None = None,
                eps: float = NORM_EPS) -> torch.Tensor:
    """RMSNorm of x over its last dimension in float32, times weight (broadcast; None = 1), then RoPE
    (None = none); the result in x's dtype. One call for a pre-norm and for QK-norm + RoPE of q and k.

    Eager on the CPU: one fused autograd function (`_NormRotate`). On CUDA and under torch.compile: the plain
    differentiable ops (CUDA's fused rms_norm kernel; the compiler fuses the rest, and has no complex code
    generation for the eager rotation)."""
    if x.is_cuda or torch.compiler.is_compiling() or forward_ad_active():
        y = rms_norm(x.float(), eps)
        if weight is not None:
            y = y * weight.float()
        return (y if rope is None else apply_rope(y, rope)).to(x.dtype)
    rot = None
    if rope is not None:
        rot = rope.rot if rope.rot is not None else torch.complex(rope.cos, rope.sin)
    return _NormRotate.apply(x, weight, rot, eps)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 (ViT-5). It drops LayerNorm's re-centring: only the rescaling matters
    for transformers, and dropping the mean is slightly cheaper and slightly better (ViT-5, as in LLMs).

    Pre-norms in a DiT block have no affine weight (`affine=False`): adaLN supplies scale and shift. The
    QK-norm uses `affine=True`, a learnable per-channel weight (init 1), as the official ViT-5 does.
    """

    def __init__(self, dim: int, eps: float = NORM_EPS, affine: bool = False) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        """x (..., dim) -> normalised (and, given `Rope` tables, rotated) x, in x's dtype."""
        return norm_rotate(x, self.weight, rope, self.eps)


def make_norm(kind: str, dim: int) -> nn.Module:
    """The pre-norm of a block (and of the final layer): no affine parameters in either kind."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, elementwise_affine=False, eps=NORM_EPS)
    return RMSNorm(dim)


class Attention(nn.Module):
    """Multi-head self-attention through `F.scaled_dot_product_attention`.

    Switches: `qkv_bias` (ViT-5 drops it: with bias-free RMSNorms everywhere, attention relies on the
    weighted projections, and QK-norm works better without an additive bias); `qk_norm` (RMSNorm with a
    learnable per-channel weight over each head's q and k, before RoPE: it bounds the attention logits and
    removes the loss spikes of large models; `q_norm` and `k_norm` hold the weights, as in ViT-5's code);
    RoPE, applied when the caller passes `Rope` tables. With QK-norm, `q_norm` and `k_norm` each normalise,
    weight and rotate in one fused call (`norm_rotate`) in float32; q and k then go back to the compute
    dtype.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.qkv_bias)
        self.q_norm = RMSNorm(cfg.head_dim, affine=True) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, affine=True) if cfg.qk_norm else None
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def project(self, x: torch.Tensor, rope: Rope | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> q, k, v, each (B, H, T, hd): what enters the softmax (QK-norm and RoPE applied).
        The one place q and k are made: `forward` and the attention statistics (vit5_sit.eval.attention)."""
        B, T, _ = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim)  # (B, T, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, hd), views of qkv (no copy)
        if self.q_norm is not None:  # each one fused call: RMSNorm, weight and RoPE (None: no rotation)
            q, k = self.q_norm(q, rope), self.k_norm(k, rope)
        elif rope is not None:
            q, k = apply_rope(q.float(), rope).to(v.dtype), apply_rope(k.float(), rope).to(v.dtype)
        return q, k, v

    def forward(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.project(x, rope)
        if forward_ad_active():  # the math form: fused kernels have no forward-mode rule
            attn = torch.softmax((q @ k.transpose(-2, -1)) * self.head_dim ** -0.5, dim=-1)  # (B, H, T, T)
            x = attn.to(v.dtype) @ v
        else:
            x = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, hd), laid out (B, T, H, hd) in memory
        x = x.transpose(1, 2).reshape(B, T, D)  # a view for SDPA's output layout
        return self.proj(x)


class Mlp(nn.Module):
    """The official MLP: fc1, GELU (tanh approximation), fc2 (timm `Mlp` keys)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwiGLU(nn.Module):
    """Gated MLP, silu(x W1) * (x W2), then W3, bias-free as in ViT-5's code (W1, W2 fused as `w12`).

    Kept for the ablation only: LayerScale already acts as a static per-channel gate, and together with a
    gated MLP it over-gates (activations become too sparse), which hurts small models in the paper.
    """

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.w12 = nn.Linear(dim, 2 * hidden, bias=False)
        self.w3 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(a) * b)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: x (B, T, D) scaled and shifted per sample by (B, D) vectors from the conditioning."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTBlock(nn.Module):
    """Pre-norm transformer block with adaLN-Zero conditioning (shift, scale, gate per branch, zero-init).

    LayerScale (`layer_scale_init` not None): learnable per-channel λ on both branches, multiplying the
    adaLN-Zero gate. It scales each block's output like a static gate (ViT-5; CaiT). Both start at or near
    zero, so a ViT-5 block learns its residual branches later than a vanilla one (docs/DESIGN.md section 4).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.norm1 = make_norm(cfg.norm, D)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg.norm, D)
        if cfg.mlp == "gelu":
            self.mlp = Mlp(D, int(D * cfg.mlp_ratio))
        else:
            self.mlp = SwiGLU(D, cfg.swiglu_hidden)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 6 * D))
        if cfg.layer_scale_init is not None:
            self.gamma_1 = nn.Parameter(torch.full((D,), float(cfg.layer_scale_init)))
            self.gamma_2 = nn.Parameter(torch.full((D,), float(cfg.layer_scale_init)))
        else:
            self.gamma_1 = self.gamma_2 = None

    def forward(self, x: torch.Tensor, c: torch.Tensor,
                rope: Rope | None = None) -> torch.Tensor:
        mod = self.adaLN_modulation(c)  # (B, 6D)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.chunk(6, dim=1)
        if self.gamma_1 is not None:
            gate_msa, gate_mlp = gate_msa * self.gamma_1, gate_mlp * self.gamma_2  # (B, D)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa), rope)
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    """adaLN (shift, scale) then a linear map of each token to its patch of output channels (zero-init)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.norm_final = make_norm(cfg.norm, D)
        self.linear = nn.Linear(D, cfg.patch_size ** 2 * cfg.out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 2 * D))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


# ---- from vit5_sit.models.positions ---------------------------------------------------------------------------


def grid_positions(n: int, train_n: int) -> torch.Tensor:
    """Positions 0..n-1 rescaled so an n-patch side spans the same range as the training side."""
    return torch.arange(n, dtype=torch.float64) * (train_n / n)


SINCOS_BASE = 10000.0           # frequency base of the absolute 2D sin-cos embedding (DiT/MAE)


def sincos_pos_embed_2d(dim: int, grid_h: int, grid_w: int, train_h: int | None = None,
                        train_w: int | None = None) -> torch.Tensor:
    """DiT/MAE 2D sin-cos embedding, (grid_h * grid_w, dim) float64, tokens row-major.

    As in the official code, the first half of the channels encodes the column and the second half the row;
    each half is [sin, cos] of the position times 1 / 10000^(i / (dim/4)).
    """
    rows = grid_positions(grid_h, train_h or grid_h)
    cols = grid_positions(grid_w, train_w or grid_w)
    omega = SINCOS_BASE ** -(torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))

    def embed_1d(pos: torch.Tensor) -> torch.Tensor:
        out = pos[:, None] * omega[None]
        return torch.cat([out.sin(), out.cos()], dim=1)  # (n, dim/2)

    emb_col = embed_1d(cols)[None, :, :].expand(grid_h, grid_w, dim // 2)
    emb_row = embed_1d(rows)[:, None, :].expand(grid_h, grid_w, dim // 2)
    return torch.cat([emb_col, emb_row], dim=-1).reshape(grid_h * grid_w, dim)


# ---- from vit5_sit.models.denoiser ----------------------------------------------------------------------------


INIT_STD = 0.02                 # N(0, 0.02) for the label table, timestep MLP and register tokens


# ---- from vit5_sit.models.positions ---------------------------------------------------------------------------


def rope_angles_2d(head_dim: int, rows: torch.Tensor, cols: torch.Tensor, base: float) -> torch.Tensor:
    """Axial 2D RoPE angles, (len(rows), head_dim / 2), one per channel pair (2j, 2j + 1): the first
    head_dim/4 pairs turn with the row position, the last head_dim/4 with the column, at frequencies
    base^(-4i / head_dim). This is the official ViT-5 layout (`VisionRotaryEmbedding(head_dim // 2)` on
    both axes, pairs interleaved)."""
    inv_freq = base ** -(torch.arange(head_dim // 4, dtype=torch.float64) * 4 / head_dim)
    return torch.cat([rows[:, None] * inv_freq, cols[:, None] * inv_freq], dim=1)


class Rope(NamedTuple):
    """RoPE tables for T tokens, float32 on the model's device: the cosines and sines of the angles,
    (T, head_dim / 2) each, and the same rotations as complex numbers cos + i sin (complex64; None when
    the tables were made inside torch.compile, which has no complex code generation)."""

    cos: torch.Tensor
    sin: torch.Tensor
    rot: torch.Tensor | None


def rope_tables(angles: torch.Tensor, device: torch.device | str) -> Rope:
    """The `Rope` tables of angles (T, head_dim / 2)."""
    cos, sin = angles.cos().to(device, torch.float32), angles.sin().to(device, torch.float32)
    return Rope(cos, sin, None if torch.compiler.is_compiling() else torch.complex(cos, sin))


# ---- from vit5_sit.models.denoiser ----------------------------------------------------------------------------


X_PRED_MIN_GAP = 0.05


# ---- from vit5_sit.models.layers ------------------------------------------------------------------------------


@contextlib.contextmanager
def forward_ad_ops() -> Iterator[None]:
    """Plain differentiable ops while a forward-mode JVP (``torch.func.jvp``) runs through the model.

    Two fast paths have no forward-mode rule: the fused RMSNorm + RoPE autograd function (`_NormRotate`, a
    hand-written backward only) and the CPU flash-attention kernel of ``F.scaled_dot_product_attention``.
    Inside this context `norm_rotate` takes the plain ops (those CUDA and torch.compile use) and `Attention`
    computes softmax(q k^T / sqrt(hd)) v explicitly: the same function, tested against finite differences
    (tests/test_meanflow.py). `Denoiser.jvp` enters it; nothing else needs to."""
    _FORWARD_AD[0] += 1
    try:
        yield
    finally:
        _FORWARD_AD[0] -= 1


# ---- from vit5_sit.models.denoiser ----------------------------------------------------------------------------


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
        # conditioning (the paper's ImageNet choice, (t, t - r)): at interval 0 the model is a flow model.
        self.interval_embedder = TimestepEmbedder(D) if cfg.mean_flow else None
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
        velocity.
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
        c = self.t_embedder(t) + self.y_embedder(y)               # (B, D)
        if self.interval_embedder is not None:
            if interval is None:
                interval = torch.zeros_like(t)
            elif interval.ndim == 0:
                interval = interval.expand(B)
            c = c + self.interval_embedder(interval)              # (B, D)
        elif interval is not None:
            raise ValueError("interval= is for MeanFlow models (ModelConfig.mean_flow=True); this model predicts "
                             "the instantaneous velocity only")
        if self.guidance_embedder is not None:
            if guidance is None:
                guidance = torch.tensor([[1.0, 0.0, 1.0]], device=x.device).expand(B, 3)  # no guidance
            elif guidance.shape != (B, 3):
                raise ValueError(f"guidance of shape {tuple(guidance.shape)}: expected ({B}, 3), a (scale, low, "
                                 "high) row per sample")
            c = c + self.guidance_embedder(guidance)              # (B, D)
        elif guidance is not None:
            raise ValueError("guidance= is for iMF models (ModelConfig.guidance_input=True, meanflow.variant=imf); "
                             "guide this model with classifier-free guidance (two passes) instead")

        hidden = {}
        for k, block in enumerate(self.blocks, start=1):
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, c, rope, use_reentrant=False)
            else:
                x = block(x, c, rope)                             # (B, T + R, D)
            if k in return_hidden:
                hidden[k] = x[:, :T]                              # (B, T, D): patch tokens only
        x = x[:, :T]                                              # (B, T, D): registers dropped
        x = self.final_layer(x, c)                                # (B, T, p * p * C_out)
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


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


def config_init(*config_classes):
    """Decorate an ``__init__(self, **fields)``: its signature becomes the fields of the dataclasses, with their
    defaults, and diffusers' `register_to_config` records them (what ConfigMixin writes to the config file and
    passes back on loading)."""
    params, seen = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)], set()
    for config_class in config_classes:
        for f in dataclasses.fields(config_class):
            if f.name in seen:
                raise TypeError(f"{config_class.__name__}.{f.name}: the name is also a field of another config "
                                "of the same component")
            seen.add(f.name)
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default))

    def decorate(init):
        init.__signature__ = inspect.Signature(params)
        return register_to_config(init)

    return decorate


# ---- from vit5_sit.models.config ------------------------------------------------------------------------------


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: must be an integer")
    if value < minimum:
        raise ValueError(f"{name}={value!r}: must be >= {minimum}")


# ---- from vit5_sit.common.utils -------------------------------------------------------------------------------


def check_choice(key: str, value: object, choices: Iterable, error: type[Exception] = ValueError) -> None:
    """Raise `error` naming `key`, the bad value, the valid choices and the nearest one, unless value is one.

    The one choice validator of the project: the config, the transport and the model options all use it.
    """
    choices = tuple(choices)
    if value in choices:
        return
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise error(f"{key}={value!r}: must be one of {', '.join(map(repr, choices))}.{hint}")


# ---- from vit5_sit.models.config ------------------------------------------------------------------------------


NORMS = ("layernorm", "rmsnorm")


POS_EMBEDS = ("sincos", "learned", "none")


MLPS = ("gelu", "swiglu")


def _check_float(name: str, value: object, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}={value!r}: must be a number")
    if positive and not value > 0:
        raise ValueError(f"{name}={value!r}: must be > 0")


@dataclass
class ModelConfig:
    """Hyper-parameters of `Denoiser`. The defaults are the official SiT-XL/2 (ImageNet 256, VAE latents)."""

    input_size: int = 32                    # training height = width of x (latents: image size / 8)
    in_channels: int = 4                    # channels of x (4 for SD-VAE latents)
    patch_size: int = 2
    hidden_size: int = 1152
    depth: int = 28
    num_heads: int = 16
    mlp_ratio: float = 4.0                  # GELU MLP hidden = mlp_ratio * hidden_size
    num_classes: int = 1000                 # label id num_classes is the null (unconditional) label
    class_dropout_prob: float = 0.1         # training label dropout for CFG; > 0 adds the null row
    learn_sigma: bool = True                # official SiT: 2C output channels, the second half dropped
    norm: str = "layernorm"                 # 'layernorm' | 'rmsnorm' (pre-norms and final norm)
    qk_norm: bool = False                   # RMSNorm over each head's q and k, before RoPE
    qkv_bias: bool = True
    pos_embed: str = "sincos"               # absolute embedding: 'sincos' (frozen) | 'learned' | 'none'
    rope: bool = False                      # 2D axial RoPE on the patch tokens
    rope_base: float = 10000.0              # RoPE frequency base of the patch tokens
    num_registers: int = 0                  # learnable tokens appended after the patches, dropped at output
    register_rope_base: float | None = 100.0  # RoPE base of the registers (2D grid); None = not rotated
    layer_scale_init: float | None = None   # LayerScale init value on both branches; None = off
    gate_init: float = 0.0                  # initial bias of the adaLN gates; 0 = adaLN-Zero (SiT, ViT-5)
    mlp: str = "gelu"                       # 'gelu' (tanh approx.) | 'swiglu' (params ~ the GELU MLP)
    mean_flow: bool = False                 # MeanFlow: a second timestep embedder for the interval length
                                            # (`interval_embedder`), summed into the adaLN conditioning
    guidance_input: bool = False            # iMF (MeanFlow models): the guidance scale and its interval are inputs
                                            # (`guidance_embedder`, starts neutral), summed into the conditioning
    x_prediction: bool = False              # MeanFlow models: the network outputs the data point its average
                                            # velocity reaches at t = 1 (pMF's x-prediction), U = (x - x_t) / (1 - t)

    def __post_init__(self) -> None:
        for name in ("input_size", "in_channels", "patch_size", "hidden_size", "depth", "num_heads",
                     "num_classes"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("num_registers", self.num_registers, minimum=0)
        check_choice("norm", self.norm, NORMS)
        check_choice("pos_embed", self.pos_embed, POS_EMBEDS)
        check_choice("mlp", self.mlp, MLPS)
        for name in ("qk_norm", "qkv_bias", "rope", "learn_sigma", "mean_flow", "guidance_input",
                     "x_prediction"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be True or False")
        if self.guidance_input and not self.mean_flow:
            raise ValueError("guidance_input=True is iMF's, a MeanFlow model's input: it needs mean_flow=True")
        if self.x_prediction and not self.mean_flow:
            raise ValueError("x_prediction=True is an output of MeanFlow models (their average velocity from the "
                             "predicted data point): it needs mean_flow=True (train.objective=meanflow)")
        _check_float("mlp_ratio", self.mlp_ratio, positive=True)
        _check_float("rope_base", self.rope_base, positive=True)
        _check_float("class_dropout_prob", self.class_dropout_prob)
        if not 0.0 <= self.class_dropout_prob < 1.0:
            raise ValueError(f"class_dropout_prob={self.class_dropout_prob!r}: must be in [0, 1)")
        if self.register_rope_base is not None:
            _check_float("register_rope_base", self.register_rope_base, positive=True)
        if self.layer_scale_init is not None:
            _check_float("layer_scale_init", self.layer_scale_init)
        _check_float("gate_init", self.gate_init)
        if self.input_size % self.patch_size:
            raise ValueError(f"input_size={self.input_size} is not divisible by patch_size={self.patch_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.rope and self.head_dim % 4:
            raise ValueError(f"rope=True needs head_dim (hidden_size / num_heads = {self.head_dim}) "
                             "divisible by 4: half the rotary pairs turn with the row, half with the column")
        if self.pos_embed == "sincos" and self.hidden_size % 4:
            raise ValueError(f"pos_embed='sincos' needs hidden_size divisible by 4, got {self.hidden_size}; "
                             "use pos_embed='learned' or 'none'")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def out_channels(self) -> int:
        """Channels of the final linear layer's output (2C with learn_sigma)."""
        return self.in_channels * 2 if self.learn_sigma else self.in_channels

    @property
    def null_label(self) -> int:
        """The null (unconditional) label id: ``num_classes``, the table's extra row. Training drops labels to
        it, classifier-free guidance and unconditional sampling pass it."""
        return self.num_classes

    @property
    def grid_size(self) -> int:
        """Patches per side at the training size."""
        return self.input_size // self.patch_size

    @property
    def swiglu_hidden(self) -> int:
        """SwiGLU hidden width: 2/3 of the GELU MLP's, rounded up to a multiple of 8, so params ~ equal."""
        return -(-int(2 * self.mlp_ratio * self.hidden_size / 3) // 8) * 8


# ---- from vit5_sit.hub.agreement ------------------------------------------------------------------------------


WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"  # diffusers' name of a component's weights


HUB_ARGS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision", "subfolder")


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


# ---- from vit5_sit.common.checks ------------------------------------------------------------------------------


class ModelLoadError(RuntimeError):
    """The path does not hold a model we can load; the message says what was expected (raised by
    `vit5_sit.hub.model_files` and `vit5_sit.hub.files`)."""


# ---- from vit5_sit.hub.agreement ------------------------------------------------------------------------------


WEIGHTS_FIX = ("use an earlier checkpoint, or export the model folder again from a good one "
               "(python -m vit5_sit.demo export RUN --out FOLDER)")


def read_header(weights: str | Path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """(metadata, {key: shape}) of a safetensors file, without reading its tensors; unreadable = one line."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), "pt") as f:
            return f.metadata() or {}, {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"{weights}: not a readable safetensors file ({first}); {WEIGHTS_FIX}") from None


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


MODEL_CONFIG_KEY = "vit5_sit_model_config"  # safetensors metadata: the ModelConfig fields of the weights (JSON)


REEXPORT = ("the files of one model folder must agree (a file edited by hand, or files of two exports): export "
            "the folder again with vit5-sit (python -m vit5_sit.demo export SOURCE --out FOLDER), or download it "
            "again")


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


LISTED = 3  # keys named in a message; the rest are counted


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
    pass  # (an import of vit5_sit: defined in this module)

    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in Denoiser(model).state_dict().items()}


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


def nonfinite_problem(state: dict[str, torch.Tensor]) -> str | None:
    """Which floating-point tensors hold NaN or inf (they sample black or noise images without any error)."""
    bad = [k for k, t in state.items()
           if t.is_floating_point() and t.device.type != "meta" and not bool(torch.isfinite(t).all())]
    if not bad:
        return None
    return f"{len(bad)} tensor(s) hold NaN or inf ({_listed(bad)}): the model would sample black or noise images"


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


# ---- from vit5_sit.hub.components -----------------------------------------------------------------------------


class Vit5SitTransformer2DModel(ModelMixin, ConfigMixin, Denoiser):
    """`Denoiser` as a diffusers model: the same modules, weights and ``forward(x, t, y)``; its config is the
    `ModelConfig` fields (``transformer/config.json``)."""

    config_name = "config.json"
    # Config values are read as model.config.x only: ModelMixin's fallback (model.x = the config's x) would
    # shadow modules of the same name (pos_embed is a config field and the position table).
    __getattr__ = torch.nn.Module.__getattr__

    @config_init(ModelConfig)
    def __init__(self, **fields) -> None:
        Denoiser.__init__(self, ModelConfig(**fields))  # nn.Module's __init__ through Denoiser's
        self._gradient_checkpointing_func = None         # what ModelMixin.__init__ sets

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """diffusers' loading, refusing a folder whose files state two models (`vit5_sit.hub.agreement`): before
        the model is built, config.json against the record in the weights' metadata and the weights' keys and
        shapes against the model; after, the config it was built with against that record, and NaN or inf."""
        where = str(Path(pretrained_model_name_or_path) / (kwargs.get("subfolder") or ""))
        files = transformer_files(pretrained_model_name_or_path, kwargs)
        if files is not None:
            check_transformer_files(read_json(files[0]), files[1], where)
        loaded = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True: (model, info)
        check_loaded(model, model.cfg, files[1] if files is not None else None, where)
        return loaded
