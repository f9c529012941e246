"""The REPA classifier's network, its training and its file (torch); the command and its constants are in
`vit5_sit.repa.classifier`, which imports this module only when one of its names is used (so that
``python -m vit5_sit.repa.classifier --help`` answers before torch is imported)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vit5_sit.models import ModelConfig, create_model, model_config
from vit5_sit.models.layers import rms_norm
from vit5_sit.repa.classifier_recipe import DEFAULT_OVERRIDES, DEFAULT_PRESET, FORMAT, HELD_OUT_EVERY


class Classifier(nn.Module):
    """ViT-5 trunk (constant conditioning) + linear head on the mean patch token."""

    def __init__(self, cfg: ModelConfig, num_classes: int, channels: int) -> None:
        super().__init__()
        self.trunk = create_model(cfg)
        self.head = nn.Linear(cfg.hidden_size, num_classes)
        self.num_classes, self.channels = num_classes, channels

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) in [-1, 1] -> (B, T, D): the last block's patch tokens, RMS-normalised."""
        B, depth = images.shape[0], self.trunk.cfg.depth
        t = torch.ones(B, device=images.device)
        y = torch.zeros(B, dtype=torch.long, device=images.device)
        _, hidden = self.trunk(images, t, y, return_hidden=(depth,))
        return rms_norm(hidden[depth])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(1))  # (B, num_classes) logits

    def as_encoder(self, resolution: int = 0) -> nn.Module:
        return ClassifierEncoder(self, resolution or self.trunk.cfg.input_size)


class ClassifierEncoder(nn.Module):
    """REPA's view of a :class:`Classifier`: ``(images, grid) -> (B, grid * grid, D)``."""

    def __init__(self, classifier: Classifier, resolution: int) -> None:
        super().__init__()
        self.classifier, self.resolution = classifier, resolution
        self.z_dim = classifier.trunk.cfg.hidden_size

    def forward(self, images: torch.Tensor, grid: int) -> torch.Tensor:
        from vit5_sit.repa.features import features_on_grid, resize_images

        x = resize_images(images, self.resolution, self.classifier.channels)
        return features_on_grid(self.classifier.features(x), grid)


def save_classifier(model: Classifier, path: str | Path, **info) -> Path:
    from vit5_sit.common.utils import save_safetensors

    meta = {"format": FORMAT, "model_config": json.dumps(dataclasses.asdict(model.trunk.cfg)),
            "num_classes": str(model.num_classes), "channels": str(model.channels),
            **{k: json.dumps(v) for k, v in info.items()}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_safetensors({k: v.contiguous() for k, v in model.state_dict().items()}, tmp, metadata=meta)
    tmp.replace(path)
    return path


def load_classifier(path: str | Path) -> Classifier:
    """A classifier file written by :func:`save_classifier` (or this module's CLI)."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    from vit5_sit.common.checks import first_line, state_dict_problem
    from vit5_sit.repa.features import EncoderError

    key, make = f"repa.encoder={path}", "make one with `python -m vit5_sit.repa.classifier`"
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise EncoderError(f"{key}: not a safetensors file ({first_line(e)}); give timm:MODEL_NAME or an encoder "
                           f".safetensors file: {make}") from None
    if meta.get("format") != FORMAT:
        raise EncoderError(f"{key}: not an encoder file of this project (no {FORMAT!r} metadata); {make}")
    try:
        cfg = ModelConfig(**json.loads(meta["model_config"]))
        model = Classifier(cfg, int(meta["num_classes"]), int(meta["channels"]))
    except (KeyError, TypeError, ValueError) as e:
        raise EncoderError(f"{key}: damaged metadata ({first_line(e)}); {make} again") from None
    expected = model.state_dict()
    problem = state_dict_problem(state, expected)
    if problem:
        raise EncoderError(f"{key}: {problem}; {make} again")
    model.load_state_dict(state, strict=True)
    return model.eval()


# ----------------------------------------------------------------------------------------------------------
# Training (the CLI).

def _split(dataset) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
    x, y = torch.stack(xs), torch.as_tensor(ys)
    test = torch.arange(len(y)) % HELD_OUT_EVERY == 0
    return x[~test], y[~test], x[test], y[test]


@torch.no_grad()
def accuracy(model: Classifier, x: torch.Tensor, y: torch.Tensor, batch: int = 250) -> float:
    model.eval()
    hits = sum(int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum()) for i in range(0, len(y), batch))
    return hits / len(y)


def train_classifier(dataset, steps: int, batch_size: int, lr: float, seed: int, log=print,
                     preset: str = DEFAULT_PRESET, **overrides) -> tuple[Classifier, dict]:
    """Train on all but every 10th item of ``dataset``; returns the model and its test accuracy."""
    x_train, y_train, x_test, y_test = _split(dataset)
    C, H = x_train.shape[1], x_train.shape[-1]
    cfg = model_config(preset, **{**DEFAULT_OVERRIDES, "input_size": H, "in_channels": C, **overrides})
    torch.manual_seed(seed)
    model = Classifier(cfg, int(y_train.max()) + 1, C)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        model.train()
        idx = torch.randint(len(y_train), (batch_size,), generator=g)
        for group in opt.param_groups:  # linear warm-up, cosine decay
            group["lr"] = lr * min(1.0, step / 50) * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * step / steps)).item())
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps:
            log(f"step {step} loss={loss.item():.4f} ({time.perf_counter() - t0:.0f} s)")
    info = {"test_accuracy": accuracy(model, x_test, y_test), "train_steps": steps, "seed": seed,
            "test_images": len(y_test)}
    return model.eval(), info
