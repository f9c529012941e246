"""The digit classifier's network and its training, reading and use (torch); the command and its constants are
in `vit5_sit.demo.digit_classifier`, which imports this module only when a name of it is used (so that
``python -m vit5_sit.demo.digit_classifier --help`` answers before torch is imported)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vit5_sit.common.utils import atomic_write_file, atomic_write_text
from vit5_sit.demo.digit_recipe import (
    BATCH_SIZE,
    CLASSIFIER,
    EPOCHS,
    HELD_OUT_PER_CLASS,
    LR,
    MAX_SHIFT,
)


class DigitNet(nn.Module):
    """Three conv-ReLU-pool stages (32 -> 4 pixels) and a two-layer head: ~95K parameters."""

    def __init__(self, num_classes: int = 10):
        super().__init__()

        def stage(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]

        self.features = nn.Sequential(*stage(1, 16), *stage(16, 32), *stage(32, 64))  # (N, 64, 4, 4)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 16, 64), nn.ReLU(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, 1, 32, 32) in [0, 1] -> logits (N, 10)."""
        return self.head(self.features(x))


def mnist_32() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 digits as uint8 (N, 32, 32) (padded like `export_mnist`) and int64 labels."""
    from vit5_sit.data.digits import MNIST_PADDED_SIZE, MNIST_SIZE, load_mnist_arrays

    images, labels = load_mnist_arrays()
    pad = (MNIST_PADDED_SIZE - MNIST_SIZE) // 2
    return np.pad(images, ((0, 0), (pad, pad), (pad, pad))), labels


def _split(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    held = np.concatenate([np.flatnonzero(labels == c)[-HELD_OUT_PER_CLASS:] for c in range(10)])
    train = np.setdiff1d(np.arange(len(labels)), held)
    return train, np.sort(held)


def _to_input(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W) or (N, H, W, 3) -> float (N, 1, H, W) in [0, 1] (the first channel of RGB)."""
    x = torch.as_tensor(np.asarray(images))
    if x.ndim == 4:
        x = x[..., 0]
    return x.float().div(255).unsqueeze(1)


def _shift(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Translate each image by up to MAX_SHIFT pixels (zero fill)."""
    n = x.shape[0]
    padded = nn.functional.pad(x, (MAX_SHIFT,) * 4)
    dx, dy = (torch.randint(0, 2 * MAX_SHIFT + 1, (2, n), generator=gen))
    h, w = x.shape[-2:]
    return torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])


def train_classifier(out: str | Path = CLASSIFIER, seed: int = 0, epochs: int = EPOCHS) -> dict:
    """Train on the 4,500 training digits; write ``out/model.safetensors`` (fp16) and ``out/info.json``."""
    from vit5_sit.common.utils import save_safetensors

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    images, labels = mnist_32()
    train_idx, held_idx = _split(labels)
    x_all, y_all = _to_input(images), torch.as_tensor(labels)
    model = DigitNet()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, LR, total_steps=epochs * -(-len(train_idx) // BATCH_SIZE))
    for epoch in range(epochs):
        model.train()
        order = torch.as_tensor(train_idx)[torch.randperm(len(train_idx), generator=gen)]
        for lo in range(0, len(order), BATCH_SIZE):
            idx = order[lo:lo + BATCH_SIZE]
            loss = nn.functional.cross_entropy(model(_shift(x_all[idx], gen)), y_all[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        acc = _accuracy(model, x_all[held_idx], y_all[held_idx])
        print(f"epoch {epoch + 1}/{epochs}: loss {loss.item():.4f}, held-out accuracy {acc:.4f}", flush=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write_file(out / "model.safetensors") as tmp:  # never a half-written model
        save_safetensors({k: v.half().contiguous() for k, v in model.state_dict().items()}, tmp)
    info = {"seed": seed, "epochs": epochs, "train_images": len(train_idx), "held_out_images": len(held_idx),
            "held_out_accuracy": round(acc, 4), "command": "python -m vit5_sit.demo.digit_classifier train"}
    atomic_write_text(out / "info.json", json.dumps(info, indent=1) + "\n")
    return info


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return (model(x).argmax(1) == y).float().mean().item()


def load_classifier(folder: str | Path = CLASSIFIER) -> DigitNet:
    """The classifier in ``folder``; FileNotFoundError when it has none, ValueError (naming the file, the
    tensor and the fix) when its file is unreadable or its tensors are not the network's finite weights."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from vit5_sit.common.checks import first_line, state_dict_problem

    path = Path(folder) / "model.safetensors"
    fix = "train it again with python -m vit5_sit.demo.digit_classifier train"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no classifier; {fix}")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({first_line(e)}); {fix}") from None
    model = DigitNet()
    expected = model.state_dict()
    problem = state_dict_problem(state, expected)
    if problem:
        raise ValueError(f"{path}: {problem}; {fix}")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.eval()


@torch.no_grad()
def classify(images: np.ndarray, model: DigitNet | None = None) -> np.ndarray:
    """uint8 digits (N, 32, 32) or (N, 32, 32, 3), white on black -> predicted labels (N,)."""
    model = model or load_classifier()
    return model(_to_input(images)).argmax(1).numpy()
