"""Noise seeded per sample, so that a seed gives the same sample whatever the batch or process count."""

from __future__ import annotations

import torch


class StackedRandomGenerator:
    """One torch.Generator per sample (after edm2's StackedRandomGenerator).

    `randn(shape)` draws one tensor of `shape` (without the batch dim) from each generator and stacks
    them: (len(seeds), *shape). The same seed with the same dtype and device gives the same values.
    """

    def __init__(self, seeds, device="cpu"):
        self.device = torch.device(device)
        self.generators = [torch.Generator(self.device).manual_seed(int(s) % (1 << 32)) for s in seeds]

    def __len__(self) -> int:
        return len(self.generators)

    def randn(self, shape, dtype=torch.float32) -> torch.Tensor:
        shape = tuple(shape)
        return torch.stack(
            [torch.randn(shape, generator=g, dtype=dtype, device=self.device) for g in self.generators]
        )

    def randn_like(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != len(self.generators):
            raise ValueError(
                f"StackedRandomGenerator has {len(self.generators)} seeds but the batch has "
                f"{x.shape[0]} samples: make one generator per batch from that batch's seeds"
            )
        return self.randn(x.shape[1:], dtype=x.dtype).to(x.device)

    def rademacher_like(self, x: torch.Tensor) -> torch.Tensor:
        """Random signs +-1, like x (for Hutchinson's trace estimator)."""
        return torch.where(self.randn_like(x) >= 0, 1.0, -1.0).to(x.dtype)
