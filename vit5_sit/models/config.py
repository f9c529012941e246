"""`ModelConfig`: the denoiser's hyper-parameters, one field per ViT-5 switch, and their checks.

The defaults are the official SiT-XL/2; `vit5_sit.models.presets` names the sizes of both families.
"""

from __future__ import annotations

from dataclasses import dataclass

from vit5_sit.common.utils import check_choice

NORMS = ("layernorm", "rmsnorm")
POS_EMBEDS = ("sincos", "learned", "none")
MLPS = ("gelu", "swiglu")


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
    dmf_depth: int = 0                      # MeanFlow models: DMF's decoupled conditioning; 0 = off (the interval
                                            # embedder, in every block); k = the first k blocks see the time t, the
                                            # rest and the final layer the interval's end t + d, through the one
                                            # time embedder (no interval embedder: at d = 0 the flow model)

    def __post_init__(self) -> None:
        for name in ("input_size", "in_channels", "patch_size", "hidden_size", "depth", "num_heads",
                     "num_classes"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("num_registers", self.num_registers, minimum=0)
        _check_int("dmf_depth", self.dmf_depth, minimum=0)
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
        if self.dmf_depth and not self.mean_flow:
            raise ValueError(f"dmf_depth={self.dmf_depth} is DMF's split of a MeanFlow model's conditioning: it "
                             "needs mean_flow=True (train.objective=meanflow), or dmf_depth=0")
        if self.dmf_depth >= self.depth:
            raise ValueError(f"dmf_depth={self.dmf_depth} with depth={self.depth}: the first dmf_depth blocks see "
                             f"t and the rest t + d, so it must be in [1, {self.depth - 1}] (DMF: about 2/3 of the "
                             "depth), or 0 for the interval embedder in every block")
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


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: must be an integer")
    if value < minimum:
        raise ValueError(f"{name}={value!r}: must be >= {minimum}")


def _check_float(name: str, value: object, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}={value!r}: must be a number")
    if positive and not value > 0:
        raise ValueError(f"{name}={value!r}: must be > 0")
