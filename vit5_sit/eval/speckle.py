"""Background speckle of digit images: the share of background pixels that are not black.

The measure of issue #51: a background pixel is farther than ``margin`` pixels (Euclidean) from every stroke pixel
(>= ``stroke``); speckle is the share of background pixels at or above ``level`` (of 255). The real digits score
about 0.01%, a flow model at 6 steps about 0.15%; a one-step model whose output keeps part of its starting noise,
percents. Images as `sample.py` writes them: uint8 (N, H, W) or (N, H, W, C) (the first channel is read).
"""

from __future__ import annotations

import numpy as np
import torch

STROKE = 128   # a pixel at or above this is part of a stroke
MARGIN = 2     # pixels within this distance of a stroke are its anti-aliased edge, not background
LEVEL = 16     # a background pixel at or above this counts as speckle


def background_mask(gray: np.ndarray, stroke: int = STROKE, margin: int = MARGIN) -> np.ndarray:
    """(N, H, W) bool: pixels farther than ``margin`` from every pixel >= ``stroke``."""
    strokes = torch.from_numpy(np.ascontiguousarray(gray >= stroke)).float()[:, None]  # (N, 1, H, W)
    r = int(margin)
    offsets = torch.arange(-r, r + 1, dtype=torch.float32)
    disk = ((offsets[:, None] ** 2 + offsets[None, :] ** 2) <= margin ** 2).float()[None, None]  # (1, 1, k, k)
    near = torch.nn.functional.conv2d(strokes, disk, padding=r)[:, 0] > 0
    return ~near.numpy()


def speckle_share(images: np.ndarray, stroke: int = STROKE, margin: int = MARGIN, level: int = LEVEL) -> float:
    """Share of background pixels (`background_mask`) at or above ``level``, over all images."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise ValueError(f"speckle_share: expected uint8 images (N, H, W) or (N, H, W, C), got {images.dtype} "
                         f"{images.shape}")
    gray = images[..., 0] if images.ndim == 4 else images
    background = background_mask(gray, stroke, margin)
    count = int(background.sum())
    return float((gray[background] >= level).sum() / count) if count else 0.0
