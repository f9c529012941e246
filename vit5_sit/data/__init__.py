"""Data: image folders (ADM centre crop), offline digit datasets, the SD VAE, and the latent cache.

Every dataset here yields ``(x, label)`` with x float32 (C, H, W) and label an int64 scalar, and exposes
``num_classes``, ``classes``, ``sample_shape`` and ``set_epoch(epoch)``; with a ``seed``, item i of epoch e
is the same in every run (flips and posterior samples are seeded by (seed, e, i)). The training loop owns
the sampler and calls ``set_epoch`` before it builds each epoch's DataLoader iterator.

Importing this package imports neither torch (its names from images.py, latents.py and vae.py are imported on
first use) nor diffusers (only ``vae.load_vae`` and the encoder need it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from vit5_sit.common.lazy import lazy_exports
from vit5_sit.common.utils import check_choice

from .digits import MARKER as DIGITS_MARKER
from .digits import export_mnist, export_sklearn_digits, load_mnist_arrays, load_sklearn_digits_arrays

# The names of images.py, latents.py and vae.py (they import torch) are imported on first use (PEP 562), so that
# `python -m vit5_sit.data --help` and `import vit5_sit.config` do not wait for torch.
_LAZY = {
    **dict.fromkeys(("IMAGE_EXTENSIONS", "ImageFolderDataset", "SkippedFile", "UnreadableDataError",
                     "adm_center_crop", "find_images", "item_generator"), "images"),
    **dict.fromkeys(("LatentDataset", "encode_dataset"), "latents"),
    **dict.fromkeys(("DEFAULT_VAE", "SD_VAE_SCALING_FACTOR", "VAELoadError", "decode", "encode", "encode_moments",
                     "latent_scaling", "load_vae", "sample_latents"), "vae"),
}

if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from .images import (
        IMAGE_EXTENSIONS,
        ImageFolderDataset,
        SkippedFile,
        UnreadableDataError,
        adm_center_crop,
        find_images,
        item_generator,
    )
    from .latents import LatentDataset, encode_dataset
    from .vae import (
        DEFAULT_VAE,
        SD_VAE_SCALING_FACTOR,
        VAELoadError,
        decode,
        encode,
        encode_moments,
        latent_scaling,
        load_vae,
        sample_latents,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


DatasetKind = Literal["images", "latents", "mnist", "digits"]
DATASET_KINDS = ("images", "latents", "mnist", "digits")
DIGITS_RESOLUTION = 32  # default pixel size of the exported digit datasets
DIGIT_CLASSES = 10      # classes of both exported digit datasets (0-9)
EXPORTERS = {"mnist": export_mnist, "digits": export_sklearn_digits}  # the kinds exported into `path` first


def build_dataset(
    kind: DatasetKind,
    path: str | os.PathLike,
    resolution: int | None = None,     # pixels; required for 'images', checked against a latent cache
    channels: int | None = None,       # pixel channels; None: 3 for images, 1 for digits; unused for latents
    random_flip: bool = True,
    seed: int | None = None,           # None: flips (and posterior samples) from the global torch RNG
    verify: bool = False,              # 'images': header-check every file at construction
    limit_per_class: int | None = None,  # 'mnist'/'digits': export only the first N of each digit
    sample_posterior: bool = True,     # 'latents': False returns the posterior mean
) -> ImageFolderDataset | LatentDataset:
    """The dataset the training loop reads. 'mnist' and 'digits' export into ``path`` first (idempotent)."""
    from .images import ImageFolderDataset
    from .latents import LatentDataset

    check_choice("build_dataset: kind", kind, DATASET_KINDS)
    if kind == "latents":
        ds = LatentDataset(path, random_flip=random_flip, seed=seed, sample_posterior=sample_posterior)
        if resolution is not None and resolution != ds.resolution:
            raise ValueError(f"latent cache {str(path)!r} holds resolution {ds.resolution}, not {resolution}")
        return ds
    if kind in EXPORTERS:
        resolution = DIGITS_RESOLUTION if resolution is None else resolution
        if not (Path(path) / DIGITS_MARKER).is_file():  # the first use: say what the pause is
            print(f"exporting the {kind} digits to {path} at {resolution}x{resolution} (first use only)", flush=True)
        EXPORTERS[kind](path, resolution=resolution, limit_per_class=limit_per_class)
        channels = 1 if channels is None else channels
    else:  # 'images'
        if resolution is None:
            raise ValueError("build_dataset('images', ...) needs a resolution")
        channels = 3 if channels is None else channels
    return ImageFolderDataset(path, resolution, random_flip=random_flip, channels=channels, seed=seed,
                              verify=verify)


__all__ = [
    "DATASET_KINDS",
    "DEFAULT_VAE",
    "DIGIT_CLASSES",
    "EXPORTERS",
    "IMAGE_EXTENSIONS",
    "SD_VAE_SCALING_FACTOR",
    "ImageFolderDataset",
    "LatentDataset",
    "SkippedFile",
    "UnreadableDataError",
    "VAELoadError",
    "adm_center_crop",
    "build_dataset",
    "decode",
    "encode",
    "encode_dataset",
    "encode_moments",
    "export_mnist",
    "export_sklearn_digits",
    "find_images",
    "item_generator",
    "latent_scaling",
    "load_mnist_arrays",
    "load_sklearn_digits_arrays",
    "load_vae",
    "sample_latents",
]
