"""Image-folder dataset with the ADM centre crop.

Layout (ImageNet style): ``root/<class_name>/**/<image>``; one subfolder per class, classes sorted by
name, images found recursively inside each class folder. Images are centre-cropped exactly like
guided-diffusion's ``center_crop_arr`` and returned as float tensors in [-1, 1].

Robustness: a file that cannot be decoded never crashes a run. ``verify=True`` opens every file's
header at construction and drops the bad ones; a file that still fails at load time (a truncated
JPEG passes a header check) is replaced by the next readable index, deterministically, and recorded
in ``dataset.skipped`` with a warning logged once per file, whichever DataLoader worker meets it first
(workers share a small record folder); ``dataset.skipped_files()`` in the main process lists every file
skipped by any of them, for the end-of-run summary. A folder where no image can be read is one
``UnreadableDataError`` naming the first file and why.

Reproducibility: ``__getitem__`` is a pure function of (index, epoch) when a ``seed`` is given: the
random flip comes from a generator seeded with (seed, epoch, index), so a resumed run that restores
its sampler position and calls ``set_epoch`` sees exactly the same batches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image

from vit5_sit.common.utils import IMAGE_EXTENSIONS, walk_image_files

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


class UnreadableDataError(ValueError):
    """No image of a dataset can be read, or an image's mode has no defined conversion."""


SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # read as 0..65535 ('I': Pillow's 16-bit PNG mode)
# converted through this mode first
VIA_MODE = {"P": "RGBA", "PA": "RGBA", "La": "LA", "RGBa": "RGBA", "1": "L", "LAB": "RGB"}
REFUSED_MODES = {
    "F": "32-bit float pixels have no standard value range; save them as 8- or 16-bit PNG",
}


def to_mode(image: Image.Image, channels: int) -> Image.Image:
    """Convert a PIL image to 1 or 3 channels with its values kept: 'L' / 'RGB', or 'F' (0..255) for 16-bit.

    8-bit modes (1, L, LA, P, PA, RGB, RGBA, CMYK, YCbCr, HSV, ...) go through Pillow's conversion (alpha is
    dropped, as in ADM's ``convert("RGB")``; palettes through RGBA). 16-bit grayscale (I;16*, and I read as
    16-bit) is scaled by 255 / 65535 into a float image, so no value saturates (Pillow's own conversion clips
    them at 255). Modes without a defined conversion raise UnreadableDataError naming the mode.
    """
    mode = image.mode
    if mode in REFUSED_MODES:
        raise UnreadableDataError(f"image mode {mode!r} is not supported: {REFUSED_MODES[mode]}")
    if mode in SIXTEEN_BIT_MODES:
        arr = np.asarray(image).astype(np.float32)
        if arr.size and (arr.min() < 0 or arr.max() > 65535):
            raise UnreadableDataError(f"image mode {mode!r} with values {arr.min():g}..{arr.max():g}: only "
                                      "16-bit values (0..65535) are supported; save the image as 8- or 16-bit PNG")
        return Image.fromarray(arr * (255.0 / 65535.0), mode="F")
    target = CHANNEL_MODES[channels]
    try:
        if mode in VIA_MODE:
            image = image.convert(VIA_MODE[mode])
        return image if image.mode == target else image.convert(target)
    except (ValueError, ImportError, OSError) as e:  # ImportError: LAB needs Pillow's ImageCms (littlecms)
        raise UnreadableDataError(f"image mode {mode!r} is not supported: Pillow cannot convert it to "
                                  f"{target} ({e}); save the image as RGB or grayscale") from None


def image_to_tensor(image: Image.Image, channels: int | None = None) -> torch.Tensor:
    """8-bit PIL image (or 'F' in 0..255) -> float32 tensor (C, H, W) in [-1, 1]; gray repeated to ``channels``."""
    arr = np.array(image, dtype=np.float32)  # a copy: torch wants a writable array
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if channels is not None and arr.shape[2] == 1 and channels > 1:
        arr = np.repeat(arr, channels, axis=2)
    return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).contiguous() / 127.5 - 1.0


def to_rgb_uint8(image: Image.Image) -> np.ndarray:
    """Any supported PIL image -> uint8 (H, W, 3), converted like the training loader (16-bit scaled)."""
    image = to_mode(image, 3)
    arr = np.asarray(image, dtype=np.float32)
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8)


def find_images(root: str | os.PathLike) -> tuple[list[str], list[tuple[str, int]]]:
    """Scan an ImageNet-style folder: (sorted class names, [(relative path, label)] sorted by path)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"image folder {str(root)!r} does not exist or is not a directory")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    samples: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        found = [os.path.relpath(f, root) for f in walk_image_files(root / name, skip_hidden=True)]
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
                raise UnreadableDataError(_none_readable(self.root, len(samples), self.skipped))
            samples = kept
        self.samples = samples
        self._bad: set[int] = set()  # indices that failed to load in this process
        self._report_dir = _shared_report_dir(self)
        for rec in self.skipped:  # scan results: reported above, recorded for the summary
            _claim(self._report_dir, rec)

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
        return image_to_tensor(adm_center_crop(image, self.resolution), self.channels), label

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
        raise UnreadableDataError(_none_readable(self.root, n, self.skipped))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = self.load_or_next(index)
        if self.random_flip:
            g = None if self.seed is None else item_generator(self.seed, self.epoch, index)
            if torch.rand((), generator=g) < 0.5:
                image = image.flip(-1)
        return image, torch.tensor(label, dtype=torch.long)

    def _record(self, path: str, reason: str, stage: str) -> None:
        rec = SkippedFile(path, reason, stage)
        self.skipped.append(rec)
        report_dir = getattr(self, "_report_dir", None)  # None while scanning in __init__
        if report_dir is None or _claim(report_dir, rec):  # first time any process meets this file
            log.warning("skipping unreadable image %s (%s)", self.root / path, reason)

    def skipped_files(self) -> list[SkippedFile]:
        """Every file skipped so far by this dataset in any process (DataLoader workers included), by path."""
        found = {rec.path: rec for rec in self.skipped}
        if self._report_dir is not None and os.path.isdir(self._report_dir):
            for name in os.listdir(self._report_dir):
                try:
                    with open(os.path.join(self._report_dir, name), encoding="utf-8") as f:
                        rec = SkippedFile(*json.load(f))
                except (OSError, ValueError, TypeError):
                    continue  # a record being written right now
                found.setdefault(rec.path, rec)
        return sorted(found.values())


def _none_readable(root: Path, n: int, skipped: list[SkippedFile]) -> str:
    first = f" (first: {skipped[0].path}: {skipped[0].reason})" if skipped else ""
    return f"none of the {n} images in {str(root)!r} could be read{first}"


def _shared_report_dir(owner) -> str:
    """A folder where every process records the files it skipped, one file each: a file is reported once."""
    path = tempfile.mkdtemp(prefix="vit5-sit-skipped-")
    weakref.finalize(owner, _remove_if_owner, path, os.getpid())
    return path


def _remove_if_owner(path: str, pid: int) -> None:
    if os.getpid() == pid:  # not from a forked DataLoader worker
        shutil.rmtree(path, ignore_errors=True)


def _claim(report_dir: str, rec: SkippedFile) -> bool:
    """Record ``rec`` unless some process already did; True if this call recorded it."""
    name = hashlib.sha1(rec.path.encode()).hexdigest()
    try:
        fd = os.open(os.path.join(report_dir, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError:  # the folder is gone (the owner finished): report locally
        return True
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(list(rec), f)
    return True
