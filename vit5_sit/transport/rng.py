"""Noise seeded per sample, so that a seed gives the same sample whatever the batch or process count."""

from __future__ import annotations

import numbers

import torch

SEED_LIMIT = 1 << 32  # sample seeds lie in [0, 2**32), like train.seed (they were once taken modulo 2**32)


class SeedError(ValueError):
    """A sample seed that is not a whole number in [0, 2**32); the message names it and the fix."""


def check_seeds(first, count: int = 1, name: str = "seed") -> int:
    """``first`` as an int, after checking that the seeds first .. first + count - 1 are valid sample seeds.

    Image i of a run has seed ``first + i``; every one must lie in [0, 2**32): a larger seed would repeat a
    smaller one's noise, a negative one that of 2**32 - |seed|. ``name`` is the setting as its user writes it
    (``--seed``, ``eval.sample_seed``); raises SeedError.
    """
    if isinstance(first, bool) or not isinstance(first, numbers.Integral):
        raise SeedError(f"{name}={first!r}: expected a whole number >= 0")
    first, last = int(first), int(first) + max(int(count), 1) - 1
    if count > SEED_LIMIT:
        raise SeedError(f"{count} images: more than the {SEED_LIMIT} distinct sample seeds (image i has seed "
                        f"{name} + i); draw at most {SEED_LIMIT} images per run")
    if first < 0 or last >= SEED_LIMIT:
        images = f" (image i has seed {name} + i, for {count} images)" if count > 1 else ""
        raise SeedError(f"{name}={first}: sample seeds must lie in [0, {SEED_LIMIT - 1}]{images}; choose {name} "
                        f"between 0 and {SEED_LIMIT - max(int(count), 1)}")
    return first


class StackedRandomGenerator:
    """One torch.Generator per sample (after edm2's StackedRandomGenerator).

    `randn(shape)` draws one tensor of `shape` (without the batch dim) from each generator and stacks
    them: (len(seeds), *shape). The same seed with the same dtype and device gives the same values.
    """

    def __init__(self, seeds, device="cpu"):
        self.device = torch.device(device)
        self.generators = [torch.Generator(self.device).manual_seed(check_seeds(s)) for s in seeds]

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
