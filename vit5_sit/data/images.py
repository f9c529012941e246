"""Image-folder dataset with the ADM centre crop.

Layout (ImageNet style): ``root/<class_name>/**/<image>``; one subfolder per class, classes sorted by
name, images found recursively inside each class folder. Images are centre-cropped exactly like
guided-diffusion's ``center_crop_arr`` and returned as float tensors in [-1, 1].

Robustness: a file that cannot be decoded never crashes a run. ``verify=True`` opens every file's
header at construction and drops the bad ones; a file that still fails at load time (a truncated
JPEG passes a header check) is replaced by the next readable index, deterministically, and recorded
in ``dataset.skipped`` with a warning logged once per file. The record lives in the process that
loads the image: with DataLoader workers, only ``verify=True`` gives the main process a full count.

Reproducibility: ``__getitem__`` is a pure function of (index, epoch) when a ``seed`` is given: the
random flip comes from a generator seeded with (seed, epoch, index), so a resumed run that restores
its sampler position and calls ``set_epoch`` sees exactly the same batches.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image

from vit5_sit.utils import IMAGE_EXTENSIONS

log = logging.getLogger(__name__)

CHANNEL_MODES = {1: "L", 3: "RGB"}  # channels -> PIL mode the image is converted to


class SkippedFile(NamedTuple):
    path: str  # relative to the dataset root
    reason: str  # the exception, as "Type: message"
    stage: str  # 'scan' (verify=True at construction) or 'load' (failed in __getitem__)


def item_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A CPU generator seeded from (seed, epoch, index), independent of batch size and worker count."""
    state = np.random.SeedSequence([seed, epoch, index]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


def adm_center_crop(image: Image.Image, resolution: int) -> Image.Image:
    """guided-diffusion's ``center_crop_arr``: returns a ``resolution`` x ``resolution`` image.

    Halve with a BOX filter while the short side is at least twice the target (cheap anti-aliasing),
    resize with BICUBIC so the short side equals the target, then crop the centre.
    """
    while min(*image.size) >= 2 * resolution:
        image = image.resize(tuple(x // 2 for x in image.size), resample=Image.BOX)
    scale = resolution / min(*image.size)
    image = image.resize(tuple(round(x * scale) for x in image.size), resample=Image.BICUBIC)
    left = (image.size[0] - resolution) // 2
    top = (image.size[1] - resolution) // 2
    return image.crop((left, top, left + resolution, top + resolution))


def to_mode(image: Image.Image, channels: int) -> Image.Image:
    """Convert any PIL mode (L, LA, RGBA, P, CMYK, ...) to 1 or 3 channels."""
    if image.mode == "P":  # palette images may carry transparency; go through RGBA to avoid PIL's warning
        image = image.convert("RGBA")
    return image if image.mode == CHANNEL_MODES[channels] else image.convert(CHANNEL_MODES[channels])


def image_to_tensor(image: Image.Image) -> torch.Tensor:
    """uint8 PIL image -> float32 tensor (C, H, W) in [-1, 1]."""
    arr = np.asarray(image, dtype=np.float32)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous() / 127.5 - 1.0


def find_images(root: str | os.PathLike) -> tuple[list[str], list[tuple[str, int]]]:
    """Scan an ImageNet-style folder: (sorted class names, [(relative path, label)] sorted by path)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"image folder {str(root)!r} does not exist or is not a directory")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    samples: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        found = []
        for dirpath, dirnames, filenames in os.walk(root / name, followlinks=True):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for f in filenames:
                if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith("."):
                    found.append(os.path.relpath(os.path.join(dirpath, f), root))
        if not found:
            log.warning("class folder %s has no images; its label %d is kept", name, label)
        samples.extend((path, label) for path in sorted(found))
    if not samples:
        loose = [p.name for p in root.iterdir() if p.is_file() and p.name.lower().endswith(IMAGE_EXTENSIONS)]
        hint = f" ({len(loose)} images lie directly in the root, outside any class folder)" if loose else ""
        raise ValueError(
            f"no images found in {str(root)!r}{hint}: expected one subfolder per class, e.g. "
            f"{str(root / 'class_a' / 'img0.png')!r}, with {'/'.join(IMAGE_EXTENSIONS)} files inside"
        )
    return classes, samples


def verify_image(path: str | os.PathLike) -> str | None:
    """Cheap header check: None if PIL can identify the file, else the reason."""
    try:
        with Image.open(path) as image:
            image.verify()
    except Exception as e:  # PIL raises many types (OSError, SyntaxError, ValueError, ...)
        return f"{type(e).__name__}: {e}"
    return None


class ImageFolderDataset(torch.utils.data.Dataset):
    """Class-labelled images, ADM centre crop, optional seeded horizontal flip.

    Items are ``(image, label)``: image a float32 tensor (channels, resolution, resolution) in [-1, 1],
    label an int64 scalar tensor. Attributes: ``classes``, ``class_to_idx``, ``samples`` (relative
    path, label), ``skipped`` (list of ``SkippedFile``), ``num_classes``, ``sample_shape``.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        resolution: int,
        random_flip: bool = True,
        channels: int = 3,      # 1 = grayscale (MNIST), 3 = RGB; other modes are converted
        seed: int | None = None,  # None: flips from the global torch RNG; int: from (seed, epoch, index)
        verify: bool = False,   # open every file's header at construction and drop unreadable ones
    ):
        if channels not in CHANNEL_MODES:
            raise ValueError(f"channels must be 1 or 3, got {channels}")
        if resolution <= 0:
            raise ValueError(f"resolution must be positive, got {resolution}")
        self.root = Path(root)
        self.resolution = resolution
        self.random_flip = random_flip
        self.channels = channels
        self.seed = seed
        self.epoch = 0
        self.classes, samples = find_images(self.root)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.skipped: list[SkippedFile] = []
        if verify:
            kept = []
            for path, label in samples:
                reason = verify_image(self.root / path)
                if reason is None:
                    kept.append((path, label))
                else:
                    self._record(path, reason, "scan")
            if not kept:
                raise ValueError(f"none of the {len(samples)} images in {str(self.root)!r} could be read")
            samples = kept
        self.samples = samples
        self._bad: set[int] = set()  # indices that failed to load in this process

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.resolution, self.resolution)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    def set_epoch(self, epoch: int) -> None:
        """Select the flips of this epoch (only matters with a ``seed``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int) -> tuple[torch.Tensor, int]:
        """Decode and centre-crop one image, no flip; raises if the file is unreadable."""
        path, label = self.samples[index]
        with Image.open(self.root / path) as image:
            image.load()  # full decode while the file is open: truncated files fail here
            image = to_mode(image, self.channels)
        return image_to_tensor(adm_center_crop(image, self.resolution)), label

    def load_or_next(self, index: int) -> tuple[torch.Tensor, int]:
        """``load(index)``, or the first readable index after it (wrapping), recording failures."""
        n = len(self.samples)
        for offset in range(n):
            j = (index + offset) % n
            if j in self._bad:
                continue
            try:
                return self.load(j)
            except Exception as e:  # any decoder error: skip the file, never crash the run
                self._bad.add(j)
                self._record(self.samples[j][0], f"{type(e).__name__}: {e}", "load")
        raise RuntimeError(f"none of the {n} images in {str(self.root)!r} could be read; see the warnings")

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = self.load_or_next(index)
        if self.random_flip:
            g = None if self.seed is None else item_generator(self.seed, self.epoch, index)
            if torch.rand((), generator=g) < 0.5:
                image = image.flip(-1)
        return image, torch.tensor(label, dtype=torch.long)

    def _record(self, path: str, reason: str, stage: str) -> None:
        self.skipped.append(SkippedFile(path, reason, stage))
        log.warning("skipping unreadable image %s (%s)", self.root / path, reason)
