"""The fused ViT-5 ops (RMSNorm, QK-norm + RoPE with a hand-written backward) equal the previous, plain
implementation: outputs and gradients to 1e-5 in float32, for every switch that reaches them.

`previous_*` below is a frozen copy of the math the model ran before the fused ops (RMSNorm through one
vector_norm, QK-norm and RoPE of q and k stacked, RoPE as one complex product), driven by the same modules'
parameters, so the two implementations see identical weights.
"""

import pytest
import torch
import torch.nn.functional as F

from vit5_sit.models import Denoiser, create_model
from vit5_sit.models.layers import modulate, norm_rotate
from vit5_sit.models.positions import Rope

TINY = dict(input_size=8, in_channels=4, depth=2, hidden_size=64, num_heads=4, num_classes=10)
TOL = 1e-5


# ----------------------------------------------------------------------------------------------------------
# The previous implementation, frozen.

def previous_rms_norm(x, eps=1e-6):
    return x * torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.shape[-1] + eps)


def previous_norm(module, x):
    if isinstance(module, torch.nn.LayerNorm):
        return module(x)
    y = previous_rms_norm(x.float(), module.eps)
    if module.weight is not None:
        y = y * module.weight.float()
    return y.to(x.dtype)


def previous_apply_rope(x, rope: Rope):
    pairs = x.unflatten(-1, (-1, 2))
    rot = torch.complex(rope.cos, rope.sin)
    return torch.view_as_real(torch.view_as_complex(pairs) * rot).flatten(-2)


def previous_attention(attn, x, rope):
    B, T, D = x.shape
    qkv = attn.qkv(x).reshape(B, T, 3, attn.num_heads, attn.head_dim)
    if attn.q_norm is None and rope is None:
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    else:
        qk, v = qkv.split([2, 1], dim=2)
        qk = qk.float().permute(2, 0, 3, 1, 4)
        v = v.squeeze(2).transpose(1, 2)
        if attn.q_norm is not None:
            weight = torch.stack([attn.q_norm.weight, attn.k_norm.weight]).float()[:, None, None, None]
            qk = qk * (torch.rsqrt(qk.square().mean(-1, keepdim=True) + attn.q_norm.eps) * weight)
        if rope is not None:
            qk = previous_apply_rope(qk, rope)
        q, k = qk.to(v.dtype).unbind(0)
    x = F.scaled_dot_product_attention(q, k, v)
    return attn.proj(x.transpose(1, 2).reshape(B, T, D))


def previous_block(block, x, c, rope):
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaLN_modulation(c).chunk(6, dim=1)
    if block.gamma_1 is not None:
        gate_msa, gate_mlp = gate_msa * block.gamma_1, gate_mlp * block.gamma_2
    x = x + gate_msa.unsqueeze(1) * previous_attention(
        block.attn, modulate(previous_norm(block.norm1, x), shift_msa, scale_msa), rope)
    return x + gate_mlp.unsqueeze(1) * block.mlp(modulate(previous_norm(block.norm2, x), shift_mlp, scale_mlp))


def previous_forward(model: Denoiser, x, t, y):
    B, C, H, W = x.shape
    grid_h, grid_w = H // model.patch_size, W // model.patch_size
    T = grid_h * grid_w
    h = model.x_embedder(x)
    pos = model.absolute_pos_embed(grid_h, grid_w, x.device)
    if pos is not None:
        h = h + pos.to(h.dtype)
    if model.register_tokens is not None:
        h = torch.cat([h, model.register_tokens.expand(B, -1, -1).to(h.dtype)], dim=1)
    rope = model.rope_tables(grid_h, grid_w, x.device) if model.cfg.rope else None
    c = model.t_embedder(t) + model.y_embedder(y)
    for block in model.blocks:
        h = previous_block(block, h, c, rope)
    h = h[:, :T]
    shift, scale = model.final_layer.adaLN_modulation(c).chunk(2, dim=1)
    h = model.final_layer.linear(modulate(previous_norm(model.final_layer.norm_final, h), shift, scale))
    out = model.unpatchify(h, grid_h, grid_w)
    return out[:, :C] if model.learn_sigma else out


# ----------------------------------------------------------------------------------------------------------

def randomized(**overrides) -> Denoiser:
    """A tiny ViT-5 with every trainable weight random (gates, LayerScale and QK-norm weights included)."""
    torch.manual_seed(0)
    model = create_model("ViT5-T/2", **{**TINY, **overrides})
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight") or "gamma" in name:  # per-channel scales around 1
                p.copy_(1.0 + 0.5 * noise)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5)
    return model


def outputs_and_grads(model, forward, x, t, y):
    x = x.clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    out = forward(x, t, y)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.detach(), x.grad.clone(), grads


def inputs(batch: int = 3, size: int = 8):
    gen = torch.Generator().manual_seed(2)
    return (torch.randn(batch, 4, size, size, generator=gen), torch.rand(batch, generator=gen),
            torch.randint(0, 11, (batch,), generator=gen))


SWITCHES = [
    {},                                                  # the ViT-5 preset
    {"layer_scale_init": None},                          # the study's no-LayerScale arm
    {"qk_norm": False, "qkv_bias": True},                # RoPE without QK-norm
    {"rope": False},                                     # QK-norm without RoPE
    {"register_rope_base": None},                        # registers not rotated
    {"num_registers": 0, "mlp": "swiglu", "pos_embed": "learned"},
]


@pytest.mark.parametrize("overrides", SWITCHES)
def test_fused_model_equals_the_previous_implementation(overrides):
    model = randomized(**overrides).eval()
    x, t, y = inputs()
    out, gx, grads = outputs_and_grads(model, model, x, t, y)
    ref, rgx, rgrads = outputs_and_grads(model, lambda *a: previous_forward(model, *a), x, t, y)
    assert out.abs().max() > 0.1  # a real signal, not the zero output of adaLN-Zero
    torch.testing.assert_close(out, ref, rtol=TOL, atol=TOL)
    torch.testing.assert_close(gx, rgx, rtol=TOL, atol=TOL)
    assert grads.keys() == rgrads.keys() and any("q_norm" in k for k in grads) == model.cfg.qk_norm
    for name in grads:
        torch.testing.assert_close(grads[name], rgrads[name], rtol=TOL, atol=TOL, msg=name)


def test_fused_model_at_another_resolution_and_batch_one():
    model = randomized().eval()
    x, t, y = inputs(batch=1, size=12)  # a 6x6 grid: new RoPE and sin-cos tables
    out, gx, grads = outputs_and_grads(model, model, x, t, y)
    ref, rgx, rgrads = outputs_and_grads(model, lambda *a: previous_forward(model, *a), x, t, y)
    torch.testing.assert_close(out, ref, rtol=TOL, atol=TOL)
    torch.testing.assert_close(gx, rgx, rtol=TOL, atol=TOL)
    for name in grads:
        torch.testing.assert_close(grads[name], rgrads[name], rtol=TOL, atol=TOL, msg=name)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("rotated", [False, True])
def test_norm_rotate_fused_equals_the_plain_ops(weighted, rotated, monkeypatch):
    """The fused autograd function against the plain differentiable ops (the torch.compile path), with a
    strided input (a view of a qkv tensor, as in attention) and an expanded output gradient."""
    model = randomized()
    rope = model.rope_tables(2, 2, torch.device("cpu")) if rotated else None
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(2, rope.cos.shape[0] if rotated else 5, 3, 4, 16, generator=gen)
    weight = (1 + torch.randn(16, generator=gen)).requires_grad_(True) if weighted else None

    def run(plain: bool):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: plain)
        x = base.clone().requires_grad_(True)
        q = x.permute(2, 0, 3, 1, 4)[0]  # (B, H, T, hd), not contiguous
        out = norm_rotate(q, weight, rope)
        out.sum().backward()  # an expanded (stride-0) gradient
        grad_w = None if weight is None else weight.grad.clone()
        if weight is not None:
            weight.grad = None
        return out.detach(), x.grad, grad_w

    fused, plain = run(False), run(True)
    for a, b in zip(fused, plain):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


def test_qk_norm_modules_are_called():
    """q_norm and k_norm are the modules that normalise q and k (their forward runs, hooks see it)."""
    model = randomized()
    seen = []
    for block in model.blocks:
        block.attn.q_norm.register_forward_hook(lambda m, args, out: seen.append(("q", out.shape)))
        block.attn.k_norm.register_forward_hook(lambda m, args, out: seen.append(("k", out.shape)))
    x, t, y = inputs()
    model(x, t, y)
    assert [s[0] for s in seen] == ["q", "k"] * model.cfg.depth
    assert seen[0][1] == (3, 4, 16 + 4, 16)  # (B, H, T + registers, head_dim)


def test_fused_bf16_autocast_matches_the_previous_implementation():
    model = randomized().eval()
    x, t, y = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, gx, _ = outputs_and_grads(model, model, x, t, y)
        ref, rgx, _ = outputs_and_grads(model, lambda *a: previous_forward(model, *a), x, t, y)
    assert out.dtype == ref.dtype
    scale = ref.float().abs().max()
    assert (out.float() - ref.float()).abs().max() <= 0.05 * scale  # bf16 rounding, not a different function
    assert (gx.float() - rgx.float()).abs().max() <= 0.05 * rgx.float().abs().max()
