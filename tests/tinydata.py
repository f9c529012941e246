"""Tiny class-folder image datasets for tests (`from tinydata import image_folder`; pytest puts tests/ on the path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


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
