"""The denoiser: shapes, adaLN-Zero, the official SiT model and loader, RoPE, switches, sizes, resolution.

All models are tiny (the T presets at 8x8 inputs, or depth 2 / width 64); the sizes of the big presets are
counted on the meta device.
"""

import argparse
import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from vit5_sit.models import (
    PRESET_FAMILIES,
    PRESETS,
    Denoiser,
    ModelConfig,
    count_flops,
    count_params,
    create_model,
    infer_official_config,
    load_official_state_dict,
    model_config,
)
from vit5_sit.models.layers import RMSNorm
from vit5_sit.models.positions import Rope, apply_rope, rope_angles_2d, rope_tables, sincos_pos_embed_2d

TINY = dict(input_size=8, in_channels=4, depth=2, hidden_size=64, num_heads=4, num_classes=10)


def tiny(name: str = "ViT5-T/2", **overrides) -> Denoiser:
    torch.manual_seed(0)
    return create_model(name, **{**TINY, **overrides})


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Replace every trainable weight (zero-initialised gates and output layer included) by a random one."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            fan_in = p[0].numel() if p.ndim >= 2 and "embedding" not in name and "register" not in name else 4
            p.copy_(torch.randn(p.shape, generator=gen) * fan_in ** -0.5)
    return model


def inputs(model: Denoiser, batch: int = 2, size: int | None = None, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    cfg = model.cfg
    size = size or cfg.input_size
    x = torch.randn(batch, cfg.in_channels, size, size, generator=gen)
    t = torch.rand(batch, generator=gen)
    y = torch.randint(0, cfg.num_classes + 1, (batch,), generator=gen)  # includes the null label
    return x, t, y


def run(model: Denoiser, *args) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(*args)


def copy_shared(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Load the parameters both models have (same name and shape) from src into dst."""
    theirs = src.state_dict()
    dst.load_state_dict({k: v for k, v in theirs.items() if k in dst.state_dict()}, strict=False)
    return dst


# ----------------------------------------------------------------------------------------------------------
# Shapes and adaLN-Zero.

FAMILIES = [
    ("SiT-T/2", {}),
    ("SiT-T/4", {"learn_sigma": False}),
    ("ViT5-T/2", {}),
    ("ViT5-T/4", {"mlp": "swiglu", "pos_embed": "learned"}),
    ("ViT5-T/2", {"pos_embed": "none", "num_registers": 3, "class_dropout_prob": 0.0}),
]


@pytest.mark.parametrize("name,overrides", FAMILIES)
def test_shapes_and_zero_output_at_init(name, overrides):
    model = create_model(name, input_size=8, num_classes=10, **overrides)
    x, t, y = inputs(model)
    if model.cfg.class_dropout_prob == 0:
        y = y.clamp(max=9)  # no null row without label dropout
    out = run(model, x, t, y)
    assert out.shape == x.shape
    assert torch.equal(out, torch.zeros_like(out))  # adaLN-Zero: the output layer starts at zero
    out = model.train()(x, t, y)  # label dropout path
    assert out.shape == x.shape
    assert model.final_layer.linear.out_features == model.patch_size ** 2 * 4 * (1 + model.cfg.learn_sigma)


def test_scalar_t_and_bad_input_shape():
    model = randomize(tiny())
    x, t, y = inputs(model)
    assert torch.allclose(run(model, x, t[0], y), run(model, x, t[0].expand(2), y))
    with pytest.raises(ValueError, match="divisible by patch_size=2"):
        run(model, torch.randn(2, 4, 7, 8), t, y)
    with pytest.raises(ValueError, match="expected 4 channels"):
        run(model, torch.randn(2, 3, 8, 8), t, y)


def test_the_model_never_drops_labels_and_names_its_null_label():
    """Label dropout lives in the training objective: the forward is the same in train and eval mode."""
    model = randomize(tiny(class_dropout_prob=0.5))
    assert model.null_label == model.cfg.null_label == 10 == model.y_embedder.embedding_table.num_embeddings - 1
    labels = torch.arange(11)
    assert torch.equal(model.y_embedder(labels), model.y_embedder.embedding_table.weight)
    x, t, y = inputs(model, batch=16)
    assert torch.equal(model.train()(x, t, y), run(model, x, t, y))


def test_hidden_states_of_chosen_blocks_on_request():
    model = randomize(tiny(num_registers=4))
    x, t, y = inputs(model)
    out, hidden = model.eval()(x, t, y, return_hidden=(1, 2))
    assert torch.equal(out, model(x, t, y))
    assert sorted(hidden) == [1, 2] and hidden[1].shape == (2, 16, 64)  # patch tokens, registers excluded
    assert not torch.equal(hidden[1], hidden[2])
    with pytest.raises(ValueError, match="block numbers run from 1 to 2"):
        model(x, t, y, return_hidden=(3,))


# ----------------------------------------------------------------------------------------------------------
# The vanilla preset is the official SiT: an independent, plain re-implementation of the official code.

def ref_sincos_2d(embed_dim: int, grid_size: int) -> np.ndarray:
    """MAE / DiT get_2d_sincos_pos_embed, with numpy."""
    grid_h = grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h))  # w goes first
    grid = grid.reshape(2, 1, grid_size, grid_size)

    def one_d(dim, pos):
        omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    return np.concatenate([one_d(embed_dim // 2, grid[0]), one_d(embed_dim // 2, grid[1])], axis=1)


class RefAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        attn = ((q * (C // self.heads) ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class RefMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class RefBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = RefAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = RefMlp(dim, 4 * dim)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x, c):
        s1, sc1, g1, s2, sc2, g2 = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + g1[:, None] * self.attn(self.norm1(x) * (1 + sc1[:, None]) + s1[:, None])
        return x + g2[:, None] * self.mlp(self.norm2(x) * (1 + sc2[:, None]) + s2[:, None])


class RefSiT(nn.Module):
    """The official SiT model (models.py of willisma/SiT), written out plainly."""

    def __init__(self, input_size=8, patch=2, channels=4, dim=192, depth=6, heads=3, classes=10):
        super().__init__()
        self.p, self.c, self.grid = patch, channels, input_size // patch
        self.x_embedder = nn.Module()
        self.x_embedder.proj = nn.Conv2d(channels, dim, patch, patch)
        self.t_embedder = nn.Module()
        self.t_embedder.mlp = nn.Sequential(nn.Linear(256, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.y_embedder = nn.Module()
        self.y_embedder.embedding_table = nn.Embedding(classes + 1, dim)
        self.pos_embed = nn.Parameter(torch.from_numpy(ref_sincos_2d(dim, self.grid)).float()[None],
                                      requires_grad=False)
        self.blocks = nn.ModuleList([RefBlock(dim, heads) for _ in range(depth)])
        self.final_layer = nn.Module()
        self.final_layer.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_layer.linear = nn.Linear(dim, patch * patch * 2 * channels)
        self.final_layer.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x, t, y):
        x = self.x_embedder.proj(x).flatten(2).transpose(1, 2) + self.pos_embed
        half = 128
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        c = self.t_embedder.mlp(torch.cat([torch.cos(args), torch.sin(args)], -1))
        c = c + self.y_embedder.embedding_table(y)
        for block in self.blocks:
            x = block(x, c)
        shift, scale = self.final_layer.adaLN_modulation(c).chunk(2, dim=1)
        x = self.final_layer.linear(self.final_layer.norm_final(x) * (1 + scale[:, None]) + shift[:, None])
        n, h, p, c = x.shape[0], self.grid, self.p, 2 * self.c
        x = torch.einsum("nhwpqc->nchpwq", x.reshape(n, h, h, p, p, c)).reshape(n, c, h * p, h * p)
        return x[:, : self.c]


def ref_and_ours(seed: int = 0):
    ref = randomize(RefSiT(), seed)
    ours = create_model("SiT-T/2", input_size=8, num_classes=10)
    return ref, ours


def test_vanilla_preset_is_the_official_model():
    ref, ours = ref_and_ours()
    theirs, mine = ref.state_dict(), ours.state_dict()
    assert list(theirs) == list(mine) and all(theirs[k].shape == mine[k].shape for k in theirs)
    assert torch.allclose(mine["pos_embed"], theirs["pos_embed"], atol=1e-6)  # DiT's sin-cos table
    assert not ours.pos_embed.requires_grad
    # The official initialisation: the same tensors start at zero, the rest do not.
    fresh = RefSiT().state_dict()
    assert {k for k, v in mine.items() if not v.any()} == {
        k for k, v in fresh.items() if k.endswith(".bias") or "adaLN" in k or k.startswith("final_layer")}
    assert ours.y_embedder.embedding_table.weight.std().item() == pytest.approx(0.02, rel=0.1)

    ours.load_state_dict(theirs, strict=True)
    x, t, y = inputs(ours)
    expected = run(ref, x, t, y)
    assert expected.abs().mean() > 0.1  # a non-trivial model
    assert torch.allclose(run(ours, x, t, y), expected, atol=1e-5, rtol=0)


def test_official_state_dict_round_trip(tmp_path):
    ref, ours = ref_and_ours()
    path = tmp_path / "SiT-T-2.pt"
    torch.save(ref.state_dict(), path)
    load_official_state_dict(ours, path)
    x, t, y = inputs(ours)
    assert torch.allclose(run(ours, x, t, y), run(ref, x, t, y), atol=1e-5, rtol=0)
    assert infer_official_config(ref.state_dict()) == ours.cfg

    # A training checkpoint of the official code: the ema entry is preferred over model.
    other = randomize(RefSiT(), seed=5).state_dict()
    ckpt = tmp_path / "0100000.pt"
    torch.save({"model": other, "ema": ref.state_dict(), "opt": {"state": {}, "param_groups": []},
                "args": argparse.Namespace(model="SiT-T/2", image_size=64)}, ckpt)
    fresh = create_model("SiT-T/2", input_size=8, num_classes=10)
    load_official_state_dict(fresh, ckpt)
    key = "blocks.0.attn.qkv.weight"
    assert torch.equal(fresh.state_dict()[key], ref.state_dict()[key])


def test_loader_errors(tmp_path):
    ref, _ = ref_and_ours()
    path = tmp_path / "sit.pt"
    torch.save(ref.state_dict(), path)
    no_sigma = create_model("SiT-T/2", input_size=8, num_classes=10, learn_sigma=False)
    with pytest.raises(ValueError, match=r"this file has learn_sigma=True; pass learn_sigma=True") as e:
        load_official_state_dict(no_sigma, path)
    assert "final_layer.linear.weight: file (32, 192) vs model (16, 192)" in str(e.value)

    vit5 = create_model("ViT5-T/2", input_size=8, num_classes=10)
    with pytest.raises(ValueError, match=r"pass num_registers=0.*missing keys: .*register_tokens") as e:
        load_official_state_dict(vit5, path)
    assert "unexpected keys: blocks.0.attn.qkv.bias" in str(e.value)

    bigger = create_model("SiT-T/2", input_size=16, num_classes=10)
    with pytest.raises(ValueError, match="this file has input_size=8; pass input_size=8"):
        load_official_state_dict(bigger, path)

    with pytest.raises(FileNotFoundError, match="nope.pt: no such checkpoint file"):
        load_official_state_dict(vit5, tmp_path / "nope.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="garbage.pt: cannot read it as a PyTorch checkpoint"):
        load_official_state_dict(vit5, garbage)
    torch.save({"step": torch.tensor(3), "note": "x"}, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match="not a state dict"):
        load_official_state_dict(vit5, tmp_path / "odd.pt")


# ----------------------------------------------------------------------------------------------------------
# RoPE.

def rope_at(rope: Rope, i: int) -> Rope:
    return Rope(*(table[i] for table in rope))


def test_rope_preserves_norms():
    model = tiny()
    rope = model.rope_tables(4, 4, torch.device("cpu"))
    x = torch.randn(2, 4, rope.cos.shape[0], model.cfg.head_dim)
    assert torch.allclose(apply_rope(x, rope).norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert not torch.allclose(apply_rope(x, rope), x)


def test_rope_real_form_under_compile_matches_the_complex_form(monkeypatch):
    rope = tiny().rope_tables(4, 4, torch.device("cpu"))
    x = torch.randn(2, 4, rope.cos.shape[0], 16)
    eager = apply_rope(x, rope)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert torch.allclose(apply_rope(x, rope), eager, atol=1e-6)


def test_rope_dot_product_depends_only_on_the_offset():
    model = tiny()
    n, hd = 4, model.cfg.head_dim
    rope = model.rope_tables(n, n, torch.device("cpu"))
    q, k = torch.randn(hd), torch.randn(hd)

    def score(a, b):  # a, b: (row, col) on the 4x4 grid, tokens row-major
        i, j = a[0] * n + a[1], b[0] * n + b[1]
        return torch.dot(apply_rope(q, rope_at(rope, i)), apply_rope(k, rope_at(rope, j)))

    base = score((0, 0), (1, 2))
    assert torch.allclose(score((2, 1), (3, 3)), base, atol=1e-5)  # same offset (1, 2)
    assert torch.allclose(score((1, 0), (2, 2)), base, atol=1e-5)
    assert not torch.allclose(score((0, 0), (2, 1)), base, atol=1e-3)  # offset (2, 1)
    assert not torch.allclose(score((1, 2), (0, 0)), base, atol=1e-3)  # offset (-1, -2)


def test_registers_rotate_differently_from_patches():
    model = tiny()  # 4 registers on a 2x2 grid at base 100; patches at base 10000
    n, hd, T = 4, model.cfg.head_dim, 16
    cos, sin, _ = model.rope_tables(n, n, torch.device("cpu"))
    assert cos.shape == (T + 4, hd // 2)
    # Register 3 sits at (1, 1) of its grid, patch 5 at (1, 1) of the patch grid: same position, other base.
    assert not torch.allclose(cos[T + 3], cos[5])
    expected = rope_tables(rope_angles_2d(hd, torch.tensor([1.0]), torch.tensor([1.0]), 100.0), "cpu")
    assert torch.allclose(cos[T + 3], expected.cos[0]) and torch.allclose(sin[T + 3], expected.sin[0])
    assert not torch.allclose(sin[T + 1:T + 4], torch.zeros_like(sin[T + 1:T + 4]))
    # register_rope_base=None: registers are not rotated.
    plain = tiny(register_rope_base=None)
    cos, sin, _ = plain.rope_tables(n, n, torch.device("cpu"))
    assert torch.equal(cos[T:], torch.ones_like(cos[T:])) and torch.equal(sin[T:], torch.zeros_like(sin[T:]))


def flip_patches(x: torch.Tensor, p: int) -> torch.Tensor:
    """Mirror the grid of p x p patches left-right, keeping the content of each patch."""
    B, C, H, W = x.shape
    return x.reshape(B, C, H, W // p, p).flip(3).reshape(B, C, H, W)


def mirror_column_rotations(model: Denoiser) -> Denoiser:
    """The same model with the second channel of every column rotary pair of q and k negated.

    Reflecting a rotary pair turns a rotation by +a into one by -a, so this model sees a left-right offset
    of -d exactly as the original sees +d.
    """
    mirrored = copy.deepcopy(model)
    hd, D = model.cfg.head_dim, model.cfg.hidden_size
    sign = torch.ones(hd)
    sign[hd // 2 + 1::2] = -1  # pairs (2j, 2j + 1) with j >= hd/4 turn with the column
    sign = torch.cat([sign.repeat(model.cfg.num_heads).repeat(2), torch.ones(D)])  # q, k; not v
    with torch.no_grad():
        for block in mirrored.blocks:
            block.attn.qkv.weight.mul_(sign[:, None])
            if block.attn.qkv.bias is not None:
                block.attn.qkv.bias.mul_(sign)
    return mirrored


@pytest.mark.parametrize("qk_norm", [True, False])
def test_rope_alone_cannot_tell_a_flipped_image(qk_norm):
    """The paper's flip argument. With RoPE and no absolute embedding, attention sees only relative
    offsets, and a patch-level flip negates the column offsets. The same weights with their column rotary
    pairs reflected (`mirror_column_rotations`) undo exactly that: mirrored(flip(x)) == flip(model(x)), a
    pure permutation of the output tokens. So the flipped image is processed exactly like the original, up
    to a fixed reflection of the weights. (Note: the *unmirrored* model is not exactly flip-equivariant;
    the sin part of a rotation changes sign with the offset.) With the absolute embedding added back the
    same construction fails: the tokens carry where they are."""
    p = 2
    rope_only = randomize(tiny(pos_embed="none", num_registers=0, qk_norm=qk_norm, qkv_bias=not qk_norm))
    x, t, y = inputs(rope_only)
    out = run(rope_only, x, t, y)
    assert out.abs().mean() > 0.1
    flipped = run(mirror_column_rotations(rope_only), flip_patches(x, p), t, y)
    assert torch.allclose(flipped, flip_patches(out, p), atol=1e-5, rtol=0)
    assert (run(rope_only, flip_patches(x, p), t, y) - flip_patches(out, p)).abs().max() > 1e-3

    with_ape = randomize(tiny(pos_embed="sincos", num_registers=0, qk_norm=qk_norm))
    out = run(with_ape, x, t, y)
    flipped = run(mirror_column_rotations(with_ape), flip_patches(x, p), t, y)
    assert (flipped - flip_patches(out, p)).abs().max() > 1e-2
    assert (run(with_ape, flip_patches(x, p), t, y) - flip_patches(out, p)).abs().max() > 1e-2


# ----------------------------------------------------------------------------------------------------------
# Every switch.

def keys(model: nn.Module) -> set[str]:
    return set(model.state_dict())


def outputs_differ(base: Denoiser, switched: Denoiser) -> bool:
    """Outputs of two models that share every parameter they have in common."""
    copy_shared(randomize(base), switched)
    x, t, y = inputs(base)
    return not torch.allclose(run(base, x, t, y), run(switched, x, t, y), atol=1e-4)


def test_qkv_bias_switch():
    assert "blocks.0.attn.qkv.bias" in keys(tiny("SiT-T/2"))
    assert "blocks.0.attn.qkv.bias" not in keys(tiny("SiT-T/2", qkv_bias=False))
    assert "blocks.0.attn.proj.bias" in keys(tiny("SiT-T/2", qkv_bias=False))


def test_rmsnorm_has_no_mean_subtraction():
    x = torch.randn(3, 16) + 5.0
    rms = RMSNorm(16)(x)
    assert torch.allclose(rms, x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt(), atol=1e-6)
    assert rms.mean(-1).abs().min() > 0.5  # the offset survives; LayerNorm would remove it
    assert torch.allclose(F.layer_norm(x, (16,), eps=1e-6).mean(-1), torch.zeros(3), atol=1e-5)
    assert RMSNorm(16)(x.bfloat16()).dtype == torch.bfloat16
    vanilla, rms_model = tiny("SiT-T/2"), tiny("SiT-T/2", norm="rmsnorm")
    assert keys(vanilla) == keys(rms_model)
    assert outputs_differ(vanilla, rms_model)


def test_qk_norm_switch():
    base, switched = tiny("SiT-T/2"), tiny("SiT-T/2", qk_norm=True)
    assert keys(switched) - keys(base) == {f"blocks.{i}.attn.{n}_norm.weight" for i in range(2) for n in "qk"}
    assert outputs_differ(base, switched)


def test_rope_and_register_rope_switches():
    base, switched = tiny("SiT-T/2"), tiny("SiT-T/2", rope=True)
    assert keys(base) == keys(switched) and outputs_differ(base, switched)
    base, switched = tiny(), tiny(register_rope_base=None)
    assert keys(base) == keys(switched) and outputs_differ(base, switched)
    base, switched = tiny(), tiny(register_rope_base=1000.0)
    assert outputs_differ(base, switched)


def test_registers_add_a_parameter_and_change_outputs():
    base, switched = tiny("SiT-T/2"), tiny("SiT-T/2", num_registers=4)
    assert keys(switched) - keys(base) == {"register_tokens"}
    assert switched.register_tokens.shape == (1, 4, 64) and switched.register_tokens.requires_grad
    assert outputs_differ(base, switched)


def test_layer_scale_adds_parameters():
    base, switched = tiny("SiT-T/2"), tiny("SiT-T/2", layer_scale_init=1e-4)
    assert keys(switched) - keys(base) == {f"blocks.{i}.gamma_{j}" for i in range(2) for j in (1, 2)}
    assert torch.equal(switched.blocks[0].gamma_1, torch.full((64,), 1e-4))
    assert outputs_differ(base, switched)


def test_swiglu_changes_the_mlp_keys():
    base, switched = tiny("SiT-T/2"), tiny("SiT-T/2", mlp="swiglu")
    mlp = lambda m: {k for k in keys(m) if ".mlp." in k and k.startswith("blocks.0.")}  # noqa: E731
    assert mlp(base) == {f"blocks.0.mlp.{n}.{w}" for n in ("fc1", "fc2") for w in ("weight", "bias")}
    assert mlp(switched) == {"blocks.0.mlp.w12.weight", "blocks.0.mlp.w3.weight"}
    swiglu_b2 = model_config("ViT5-B/2", mlp="swiglu")
    assert count_params("ViT5-B/2") == pytest.approx(count_params(swiglu_b2), rel=0.01)
    assert outputs_differ(base, switched)


def test_pos_embed_kinds():
    sincos, learned, none = (tiny("SiT-T/2", pos_embed=k) for k in ("sincos", "learned", "none"))
    assert not sincos.pos_embed.requires_grad
    assert learned.pos_embed.requires_grad
    assert torch.equal(learned.pos_embed, sincos.pos_embed)  # 'learned' starts from the sin-cos table
    assert none.pos_embed is None and "pos_embed" not in keys(none)
    assert count_params(learned, trainable_only=True) - count_params(sincos, trainable_only=True) == 16 * 64
    randomize(learned)
    learned.train()(*inputs(learned)).square().mean().backward()
    assert learned.pos_embed.grad is not None and learned.pos_embed.grad.abs().sum() > 0
    assert outputs_differ(sincos, none)


def test_learn_sigma_switch():
    assert tiny("SiT-T/2").final_layer.linear.out_features == 32
    assert tiny("SiT-T/2", learn_sigma=False).final_layer.linear.out_features == 16


def test_bad_config_values_name_the_value_and_the_choices():
    with pytest.raises(ValueError, match=r"norm='batchnorm'.*'layernorm', 'rmsnorm'"):
        model_config("ViT5-T/2", norm="batchnorm")
    with pytest.raises(ValueError, match=r"pos_embed='rope'.*'sincos', 'learned', 'none'"):
        ModelConfig(pos_embed="rope")
    with pytest.raises(ValueError, match=r"mlp='relu'.*'gelu', 'swiglu'"):
        ModelConfig(mlp="relu")
    with pytest.raises(ValueError, match="hidden_size=100 is not divisible by num_heads=16"):
        ModelConfig(hidden_size=100)
    with pytest.raises(ValueError, match=r"rope=True needs head_dim .* = 18\) divisible by 4"):
        ModelConfig(hidden_size=72, num_heads=4, rope=True)
    with pytest.raises(ValueError, match="input_size=30 is not divisible by patch_size=4"):
        model_config("SiT-T/4", input_size=30)
    with pytest.raises(ValueError, match=r"preset='ViT5-XXL/2': must be one of 'SiT-T/2', .* Did you mean 'ViT5-XL/2'"):
        model_config("ViT5-XXL/2")
    with pytest.raises(ValueError, match="unknown ModelConfig field.*'ropes'"):
        create_model("ViT5-T/2", ropes=False)
    with pytest.raises(ValueError, match="num_registers=-1"):
        ModelConfig(num_registers=-1)


def test_presets():
    sizes = ("T", "S", "B", "L", "XL")
    families = ("SiT", "ViT5", "ViT5G", "SiTRoPE")
    assert set(PRESET_FAMILIES) == set(families)  # each family has its words (model cards)
    assert set(PRESETS) == {f"{f}-{s}/{p}" for f in families for s in sizes for p in (2, 4, 8)}
    assert PRESETS["SiT-XL/2"] == ModelConfig()  # the defaults are the official SiT-XL/2
    vit5 = PRESETS["ViT5-XL/2"]
    assert (vit5.norm, vit5.qk_norm, vit5.qkv_bias, vit5.pos_embed, vit5.rope, vit5.num_registers,
            vit5.register_rope_base, vit5.layer_scale_init, vit5.mlp) == (
        "rmsnorm", True, False, "sincos", True, 4, 100.0, 1e-4, "gelu")
    tiny_cfg = PRESETS["ViT5-T/8"]
    assert (tiny_cfg.depth, tiny_cfg.hidden_size, tiny_cfg.num_heads, tiny_cfg.patch_size) == (6, 192, 3, 8)
    cfg = model_config("ViT5-B/2", rope=False)  # an ablation is one override; the registry is untouched
    assert not cfg.rope and PRESETS["ViT5-B/2"].rope
    for s in sizes:  # the generation preset: the paper's ViT-5 without LayerScale, nothing else changed
        for p in (2, 4, 8):
            assert PRESETS[f"ViT5G-{s}/{p}"] == dataclasses.replace(PRESETS[f"ViT5-{s}/{p}"], layer_scale_init=None)
            assert PRESETS[f"ViT5-{s}/{p}"].layer_scale_init == 1e-4  # the paper-faithful presets unchanged
            # SiT + 2D RoPE (#28): the vanilla block with RoPE on the patches, nothing else of ViT-5
            assert PRESETS[f"SiTRoPE-{s}/{p}"] == dataclasses.replace(PRESETS[f"SiT-{s}/{p}"], rope=True)


# ----------------------------------------------------------------------------------------------------------
# Sizes.

def test_parameter_counts_of_the_official_sizes():
    assert count_params("SiT-XL/2") == 675_129_632
    assert round(count_params("SiT-S/2") / 1e6, 1) == 33.0
    assert round(count_params("SiT-B/2") / 1e6, 1) == 130.5
    assert round(count_params("SiT-L/2") / 1e6, 1) == 458.1
    model = create_model("SiT-T/2")
    assert count_params(model) == count_params("SiT-T/2") == count_params(model.cfg)


def test_gflops_of_the_official_sizes():
    got = {s: count_flops(f"SiT-{s}/2") / 1e9 for s in ("S", "B", "L", "XL")}
    assert (round(got["S"], 2), round(got["B"], 2), round(got["L"], 2), round(got["XL"], 1)) == (
        6.06, 23.01, 80.70, 118.6)
    assert count_flops("SiT-XL/2", input_size=64) > 4 * count_flops("SiT-XL/2")
    for bad in (0, -4, 33):  # 0 once meant "the training size", -4 and 33 gave numbers
        with pytest.raises(ValueError, match=f"input_size={bad}: must be a positive multiple of the patch size 2"):
            count_flops("SiT-XL/2", input_size=bad)


def test_presets_listing_refuses_bad_sizes_and_marks_presets_that_do_not_fit(capsys):
    from vit5_sit.models.__main__ import main

    with pytest.raises(SystemExit):
        main(["--input-size", "0"])
    assert "argument --input-size: must be at least 1, got 0" in capsys.readouterr().err
    main(["--input-size", "36"])
    rows = {line.split()[0]: line.split()[-1] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["SiT-XL/8"] == "-" and float(rows["SiT-XL/4"]) > 0


@pytest.mark.parametrize("name,overrides", [("SiT-T/2", {}), ("ViT5-T/4", {"mlp": "swiglu"}),
                                            ("ViT5-T/2", {})])
def test_count_flops_matches_torch_flop_counter(name, overrides):
    model = tiny(name, **overrides)
    x, t, y = inputs(model, batch=1)
    # The math backend of scaled_dot_product_attention runs as matmuls, which the counter sees.
    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        model.eval()(x, t, y)
    assert counter.get_total_flops() == 2 * count_flops(model.cfg)  # the counter counts a multiply-add as 2


# ----------------------------------------------------------------------------------------------------------
# Other resolutions, caches, checkpointing.

@pytest.mark.parametrize("pos_embed", ["sincos", "learned", "none"])
def test_runs_at_another_resolution(pos_embed):
    model = randomize(tiny(pos_embed=pos_embed))  # trained grid 4x4
    x, t, y = inputs(model, size=16)
    out = run(model, x, t, y)
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert ("rope", 8, 8, torch.device("cpu")) in model._tables
    if pos_embed == "learned":
        model.train()(x, t, y).square().mean().backward()
        assert model.pos_embed.grad.abs().sum() > 0
    assert keys(model) == keys(tiny(pos_embed=pos_embed))  # nothing new in the state dict


def test_other_grids_keep_the_training_positions():
    model = tiny()
    pe8 = model.absolute_pos_embed(8, 8, torch.device("cpu"))[0].reshape(8, 8, -1)
    pe4 = model.pos_embed[0].reshape(4, 4, -1)
    assert torch.allclose(pe8[::2, ::2], pe4, atol=1e-6)  # positions 0, 0.5, 1, ...: even ones coincide
    assert torch.allclose(torch.from_numpy(ref_sincos_2d(64, 4)).float(), pe4.reshape(16, -1), atol=1e-6)
    cos8 = model.rope_tables(8, 8, torch.device("cpu")).cos
    cos4 = model.rope_tables(4, 4, torch.device("cpu")).cos
    assert torch.allclose(cos8[:64].reshape(8, 8, -1)[::2, ::2], cos4[:16].reshape(4, 4, -1), atol=1e-6)
    assert torch.equal(cos8[64:], cos4[16:])  # registers do not depend on the grid
    assert sincos_pos_embed_2d(64, 3, 5).shape == (15, 64)  # non-square grids too


def test_rope_tables_are_computed_once_per_grid():
    model = tiny()
    x, t, y = inputs(model)
    run(model, x, t, y)
    first = model.rope_tables(4, 4, x.device)
    run(model, x, t, y)
    assert len(model._tables) == 1 and model.rope_tables(4, 4, x.device)[0] is first[0]
    assert not any("rope" in k or "cos" in k for k in keys(model))
    assert not list(model.buffers())


def test_grad_checkpointing_gives_the_same_gradients():
    model = randomize(tiny())
    x, t, y = inputs(model)
    grads = []
    for enable in (False, True):
        model.zero_grad()
        model.set_grad_checkpointing(enable)
        model.eval()(x, t, y).square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def test_bf16_autocast_runs():
    model = randomize(tiny())
    x, t, y = inputs(model)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out = model.eval()(x, t, y)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), run(model, x, t, y), atol=0.1, rtol=0.1)


def test_old_import_paths_still_work():
    """`vit5_sit.models.dit` was one file before the split: every name it exported is the same object now,
    and `DiT` is the former name of `Denoiser`."""
    import vit5_sit.models as models
    from vit5_sit.models import config, denoiser, dit, flops, layers, positions, presets

    assert dit.DiT is dit.Denoiser is denoiser.Denoiser is models.DiT is models.Denoiser
    for module in (config, positions, layers, denoiser, flops, presets):
        for name in dir(module):
            if name in dit.__all__:
                assert getattr(dit, name) is getattr(module, name), name
    for name in ("ModelConfig", "PRESETS", "SIZES", "Rope", "RMSNorm", "DiTBlock", "Attention", "norm_rotate",
                 "rms_norm", "modulate", "sincos_pos_embed_2d", "rope_angles_2d", "rope_tables", "apply_rope",
                 "count_params", "count_flops", "model_config", "create_model", "SiT", "ViT5"):
        assert name in dit.__all__ and hasattr(dit, name), name
    assert isinstance(dit.create_model("SiT-T/2", depth=1), dit.DiT)
