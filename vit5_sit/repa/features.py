"""What every REPA encoder shares: its error, the patch-feature grid resampling and the input resizing.

Kept apart so that `repa.encoders` (which loads the project's MNIST classifier) and `repa.classifier` (which
uses them) import it, not each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["EncoderError", "features_on_grid", "resize_images"]


class EncoderError(ValueError):
    """An encoder that cannot be loaded; the message names the key or file to fix."""


def features_on_grid(feats: torch.Tensor, grid: int) -> torch.Tensor:
    """Patch features (B, N, D) of a square n x n grid -> (B, grid * grid, D) (bilinear, antialiased)."""
    B, N, D = feats.shape
    n = int(round(N ** 0.5))
    if n * n != N:
        raise EncoderError(f"the encoder gives {N} patch tokens, not a square grid")
    if n == grid:
        return feats
    x = feats.transpose(1, 2).reshape(B, D, n, n)
    x = F.interpolate(x, size=(grid, grid), mode="bilinear", align_corners=False, antialias=grid < n)
    return x.flatten(2).transpose(1, 2)


def resize_images(images: torch.Tensor, resolution: int, channels: int) -> torch.Tensor:
    if images.shape[1] != channels:
        if images.shape[1] != 1:
            raise EncoderError(f"images with {images.shape[1]} channels for an encoder of {channels}")
        images = images.expand(-1, channels, -1, -1)
    if images.shape[-1] != resolution or images.shape[-2] != resolution:
        images = F.interpolate(images, size=(resolution, resolution), mode="bicubic", align_corners=False)
    return images
