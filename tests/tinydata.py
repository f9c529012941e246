"""Tiny class-folder image datasets and the tiny training settings for tests (`from tinydata import image_folder`;
pytest puts tests/ on the path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

# A one-block ViT5-T/2 of width 32 that trains on 8x8 images in well under a second a step, a checkpoint every 2.
TINY_TRAIN = ["model.preset=ViT5-T/2", "model.depth=1", "model.hidden_size=32", "model.num_heads=2",
              "log.tracker=none", "log.sample_every=0", "data.num_workers=0", "train.ckpt_every=2"]


def reset_accelerate() -> None:
    """Forget accelerate's process-wide state, so the next in-process training starts as a fresh process would."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


def image_folder(root: Path, classes: int = 2, per_class: int = 4, size: int = 8, height: int | None = None,
                 prefix: str = "class", corrupt: bool = False) -> Path:
    """``root/<prefix><c>/<i>.png``: random RGB images (seeded, the same bytes on every call), ``size`` wide and
    ``height`` (default ``size``) high; ``corrupt`` adds ``<prefix>0/broken.png``, a PNG header and nothing else."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"{prefix}{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (height or size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    if corrupt:
        (root / f"{prefix}0" / "broken.png").write_bytes(b"\x89PNG not really")
    return root
