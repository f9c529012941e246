"""REPA's alignment term: a projector MLP on one block's patch tokens, negative cosine similarity to a frozen
encoder's patch features of the clean image (Yu et al. 2024, "Representation Alignment for Generation")."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def build_projector(hidden_size: int, z_dim: int, width: int = 2048) -> nn.Sequential:
    """REPA's projector: Linear(hidden, width), SiLU, Linear(width, width), SiLU, Linear(width, z_dim)."""
    return nn.Sequential(nn.Linear(hidden_size, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(),
                         nn.Linear(width, z_dim))


def alignment_loss(projected: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-mean over samples and tokens of cos(projected, target); both (B, T, z_dim). -1 when aligned."""
    if projected.shape != target.shape:
        raise ValueError(f"REPA: projected tokens {tuple(projected.shape)} and encoder features "
                         f"{tuple(target.shape)} differ in shape")
    return -(F.normalize(projected, dim=-1) * F.normalize(target, dim=-1)).sum(-1).mean()


class Alignment:
    """(projected tokens (B, T, z_dim), clean data x1) -> the alignment loss (a scalar).

    The frozen ``encoder`` maps images in [-1, 1] to features on the model's ``grid`` x ``grid`` token
    grid. ``to_images`` turns the data into images first (latent training: the VAE decoder); None = the
    data are images.
    """

    def __init__(self, encoder: nn.Module, grid: int,
                 to_images: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.encoder, self.grid, self.to_images = encoder.eval().requires_grad_(False), grid, to_images

    def target(self, x1: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            images = x1 if self.to_images is None else self.to_images(x1)
            return self.encoder(images.float(), self.grid)

    def __call__(self, projected: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
        return alignment_loss(projected.float(), self.target(x1))
