"""The frozen encoders REPA aligns to: any timm model, or an encoder file made by this project.

Each is a module ``encoder(images, grid) -> (B, grid * grid, z_dim)``: images (B, C, H, W) in [-1, 1]
(one channel is repeated for RGB encoders), resized to the encoder's resolution; its patch features
(class token and registers dropped) are resized to the denoiser's token grid.

``repa.encoder``: ``timm:MODEL_NAME`` (weights from ``repa.encoder_weights``, or from the hub when it is
reachable; timm is optional and imported only here), or the path of a ``.safetensors`` file written by
``python -m vit5_sit.repa.classifier``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vit5_sit.common.checks import first_line, tensors_problem
from vit5_sit.repa.features import EncoderError, features_on_grid, resize_images

TIMM_PREFIX = "timm:"


class TimmEncoder(nn.Module):
    """A timm model's ``forward_features`` patch tokens, on inputs normalised as the model expects."""

    def __init__(self, model: nn.Module, resolution: int) -> None:
        super().__init__()
        from timm.data import resolve_model_data_config

        data = resolve_model_data_config(model)
        self.model, self.resolution = model, resolution
        self.prefix = int(getattr(model, "num_prefix_tokens", 0))
        self.z_dim = int(model.num_features)
        self.register_buffer("mean", torch.tensor(data["mean"]).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(data["std"]).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor, grid: int) -> torch.Tensor:
        x = resize_images(images, self.resolution, self.mean.shape[1])
        x = ((x + 1) / 2 - self.mean) / self.std
        feats = self.model.forward_features(x)
        if feats.ndim == 4:  # a convolutional trunk: (B, D, h, w)
            feats = feats.flatten(2).transpose(1, 2)
        return features_on_grid(feats[:, self.prefix:], grid)


def load_timm_encoder(name: str, weights: str = "", resolution: int = 0) -> TimmEncoder:
    """``timm.create_model(name)`` with weights from a local file, or from the hub when it is reachable."""
    key = f"repa.encoder={TIMM_PREFIX}{name}"
    try:
        import timm
    except ImportError:
        raise EncoderError(f"{key}: timm is not installed (pip install timm)") from None
    if not timm.is_model(name):
        raise EncoderError(f"{key}: timm has no such model; list them with timm.list_models('*dinov2*')")
    kwargs = {"num_classes": 0, **({"img_size": resolution} if resolution else {})}
    if not weights:
        from vit5_sit.data.vae import hub_offline_by_env, hub_reachable

        if hub_offline_by_env() or not hub_reachable():
            raise EncoderError(
                f"{key}: no weights file given and the hub is not reachable (offline). On a machine with "
                f"internet save them once: python -c \"import timm, safetensors.torch as s; "
                f"s.save_file(timm.create_model('{name}', pretrained=True).state_dict(), '{name}.safetensors')\", "
                f"copy the file here and set repa.encoder_weights=PATH/{name}.safetensors")
        return _timm(timm.create_model(name, pretrained=True, **kwargs), resolution)
    model = timm.create_model(name, pretrained=False, **kwargs)
    state = _read_weights(Path(weights), "repa.encoder_weights")
    expected = model.state_dict()
    problem = tensors_problem({k: v for k, v in state.items() if k in expected}, expected)
    if problem:
        raise EncoderError(f"repa.encoder_weights={weights}: {problem}; save {name}'s weights again (see the "
                           "README's REPA section)")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(("head.", "fc.", "classifier."))]
    if missing:
        raise EncoderError(f"repa.encoder_weights={weights}: not weights of {name} ({len(missing)} missing, "
                           f"e.g. {missing[0]}; {len(unexpected)} unexpected)")
    return _timm(model, resolution)


def _timm(model: nn.Module, resolution: int) -> TimmEncoder:
    if not resolution:
        from timm.data import resolve_model_data_config

        resolution = int(resolve_model_data_config(model)["input_size"][-1])
    return TimmEncoder(model.eval(), resolution)


def _read_weights(path: Path, key: str) -> dict[str, torch.Tensor]:
    """The tensors of a weights file (.safetensors, or a torch file read with weights_only=True); any file
    that cannot be read so is an EncoderError naming ``key``."""
    import pickle

    from safetensors import SafetensorError

    if not path.is_file():
        raise EncoderError(f"{key}={path}: no such file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        raise EncoderError(f"{key}={path}: not a weights file that can be read safely ({first_line(e)}); give "
                           "a .safetensors file of the model's state dict") from None
    state = state.get("state_dict", state.get("model", state)) if isinstance(state, dict) else state
    if not isinstance(state, dict):
        raise EncoderError(f"{key}={path}: holds a {type(state).__name__}, not a state dict of tensors")
    return state


def load_encoder(spec: str, weights: str = "", resolution: int = 0,
                 device: torch.device | str = "cpu") -> nn.Module:
    """The frozen encoder named by ``repa.encoder`` (see the module docstring), on ``device``."""
    if spec.startswith(TIMM_PREFIX):
        encoder = load_timm_encoder(spec[len(TIMM_PREFIX):], weights, resolution)
    else:
        from vit5_sit.repa.classifier import load_classifier

        path = Path(spec)
        if not path.is_file():
            raise EncoderError(f"repa.encoder={spec}: no such file; give timm:MODEL_NAME or an encoder .safetensors "
                               "made by `python -m vit5_sit.repa.classifier`")
        encoder = load_classifier(path).as_encoder(resolution)
    return encoder.to(device).eval().requires_grad_(False)
