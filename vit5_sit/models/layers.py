"""The denoiser's layers: norms (with the fused RMSNorm + RoPE), embedders, attention, MLPs, the adaLN-Zero
block and the final layer. Module and parameter names are the official SiT ones (state-dict keys)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from vit5_sit.models.config import ModelConfig
from vit5_sit.models.positions import Rope, apply_rope

NORM_EPS = 1e-6                 # LayerNorm / RMSNorm epsilon (official DiT/SiT and ViT-5)
TIMESTEP_FREQ_DIM = 256         # sinusoidal frequencies of the timestep embedding (official SiT)
TIMESTEP_MAX_PERIOD = 10000.0


_FORWARD_AD = [0]  # > 0 while `forward_ad_ops()` is active (nesting depth)


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


def forward_ad_active() -> bool:
    return _FORWARD_AD[0] > 0


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: x (B, T, D) scaled and shifted per sample by (B, D) vectors from the conditioning."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def rms_norm(x: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, in x's dtype (callers pass float32).

    The plain differentiable form: what torch.compile fuses, and the reference `norm_rotate` matches."""
    if x.is_cuda:
        return F.rms_norm(x, (x.shape[-1],), eps=eps)  # a fused kernel
    # On the CPU F.rms_norm runs as pow, mean, add, rsqrt, mul; one vector_norm reduction is faster.
    return x * torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.shape[-1] + eps)


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


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, T, D) by a strided convolution (`x_embedder.proj`, as timm's PatchEmbed)."""

    def __init__(self, patch_size: int, in_channels: int, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, hidden_size, kernel_size=patch_size, stride=patch_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


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
