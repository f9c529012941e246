"""Class-conditional sampling of a trained model: image batches, PNG grids (mass sampling: see below).

Noise is seeded per sample (one generator per seed), so the image a seed gives does not depend on the
batch size or on the number of processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from vit5_sit.models import DiT
from vit5_sit.transport import (
    ClassifierFreeGuidance,
    SamplerConfig,
    StackedRandomGenerator,
    Transport,
    sample,
)
from vit5_sit.utils import atomic_write_bytes


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """(N, C, H, W) in [-1, 1] -> (N, H, W, 3) uint8; one-channel images are repeated to RGB."""
    x = ((x.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    return x.permute(0, 2, 3, 1).cpu().numpy()


@torch.no_grad()
def sample_images(model: DiT, transport: Transport, sampler: SamplerConfig, classes: Sequence[int],
                  seeds: Sequence[int], *,
                  cfg_scale: float = 1.0,                    # classifier-free guidance; 1 = none
                  guidance_interval: tuple[float, float] = (0.0, 1.0),  # guide only for t in this range
                  guide_channels: int | None = None,         # None = all; 3 = official SiT behaviour
                  vae=None,                                  # None (pixel model), a name/path, or a loaded VAE
                  image_size: int | None = None,             # model input size; None = trained size
                  batch_size: int = 64,
                  device: torch.device | str = "cpu",
                  ) -> np.ndarray:
    """Sample one image per (class, seed) pair; returns uint8 (N, H, W, 3)."""
    if len(classes) != len(seeds):
        raise ValueError(f"{len(classes)} classes but {len(seeds)} seeds: give one seed per image")
    device = torch.device(device)
    cfg = model.cfg
    size = image_size or cfg.input_size
    model = model.to(device).eval()
    net = model
    if cfg_scale != 1.0:
        net = ClassifierFreeGuidance(model, cfg_scale, null_class=cfg.num_classes, interval=guidance_interval,
                                     channels=guide_channels)
    if isinstance(vae, str | Path):
        from vit5_sit.data.vae import load_vae

        vae = load_vae(str(vae), device=device)
    out = []
    for lo in range(0, len(seeds), batch_size):
        batch_seeds = list(seeds[lo:lo + batch_size])
        rng = StackedRandomGenerator(batch_seeds, device)
        noise = rng.randn((cfg.in_channels, size, size))
        y = torch.as_tensor(list(classes[lo:lo + batch_size]), device=device, dtype=torch.long)
        x = sample(net, noise, y, transport, sampler, rng=rng).samples
        if vae is not None:
            from vit5_sit.data.vae import decode

            x = decode(vae, x)
        out.append(to_uint8(x))
    return np.concatenate(out)


def make_grid(images: np.ndarray, ncol: int, pad: int = 2) -> np.ndarray:
    """Tile (N, H, W, 3) uint8 images row-major into one image with ``pad`` white pixels between."""
    n, h, w, c = images.shape
    nrow = -(-n // ncol)
    grid = np.full((nrow * (h + pad) + pad, ncol * (w + pad) + pad, c), 255, dtype=np.uint8)
    for i, img in enumerate(images):
        r, col = divmod(i, ncol)
        grid[pad + r * (h + pad):pad + r * (h + pad) + h, pad + col * (w + pad):pad + col * (w + pad) + w] = img
    return grid


def save_grid(images: np.ndarray, path: str | Path, ncol: int, scale: int = 1) -> Path:
    """Write a PNG grid atomically; ``scale`` enlarges small images (nearest neighbour)."""
    import io

    from PIL import Image

    grid = make_grid(images, ncol)
    img = Image.fromarray(grid)
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)
