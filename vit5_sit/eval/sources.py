"""Where images and reference statistics come from, and their Inception features.

Images (`open_images`):
  - an .npz in ADM's layout: `arr_0` uint8 (N, H, W, 3), optional `arr_1` labels (ignored). Read in batches
    straight from the zip member, so a 50k-sample file is never held in memory whole;
  - a folder, searched recursively for .png / .jpg / .jpeg / .webp (sorted paths; every mode converted to RGB
    like the training loader, 16-bit scaled; images of different sizes are batched separately; unreadable
    files are skipped, warned about and listed in ``source.skipped``);
  - a uint8 array (N, H, W, 3).
References (`open_reference`):
  - our statistics file from `compute_reference` / `eval_fid.py ref`: `mu`, `sigma`, `mu_s`, `sigma_s` (ADM's
    keys), `features` (precision/recall and KID) and `arr_0` when the images are kept; files of format /1
    (`mu` with `features` or `sigma`, no `mu_s`) still read, without sFID;
  - ADM's reference batch (e.g. VIRTUAL_imagenet256_labeled.npz): `arr_0` images plus `mu`, `sigma`, `mu_s`,
    `sigma_s`. FID and sFID use its statistics; precision/recall/KID compute features from `arr_0` (cache
    them once with `eval_fid.py ref`);
  - any image source above: features are computed from the images.
"""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL.Image
import torch
from tqdm import tqdm

from vit5_sit.common.utils import IMAGE_EXTENSIONS, walk_image_files

from .errors import EvalError
from .inception import POOL_DIM, SPATIAL_DIM
from .metrics import feature_statistics

# Written into our statistics files. /2 adds sigma (always), mu_s and sigma_s (sFID), and arr_0 when the images
# are kept: the keys ADM's evaluator reads. /1 files (features or sigma, no mu_s) are still read.
REFERENCE_FORMAT = "vit5_sit.eval.reference/2"


def _layout_error(dtype, shape) -> EvalError:
    return EvalError(f"arr_0 must be uint8 N×H×W×3, got {np.dtype(dtype)} {tuple(shape)}")


def _check_layout(dtype, shape) -> None:
    if np.dtype(dtype) != np.uint8 or len(shape) != 4 or shape[-1] != 3:
        raise _layout_error(dtype, shape)


class ImageSource:
    """A sized sequence of uint8 RGB images, read in batches (N, H, W, 3)."""

    description: str
    num_images: int

    def iter_batches(self, batch_size: int, num_workers: int = 0) -> Iterator[np.ndarray]:
        raise NotImplementedError


class ArrayImages(ImageSource):
    def __init__(self, images: np.ndarray, description: str = "array"):
        images = np.asarray(images)
        _check_layout(images.dtype, images.shape)
        self.images, self.description, self.num_images = images, description, len(images)

    def iter_batches(self, batch_size, num_workers=0):
        for i in range(0, self.num_images, batch_size):
            yield self.images[i : i + batch_size]


class NpzImages(ImageSource):
    """`arr_0` of an .npz, streamed from the zip member (compressed or not) batch by batch."""

    MEMBER = "arr_0.npy"

    def __init__(self, path: Path):
        self.path, self.description = path, str(path)
        with zipfile.ZipFile(path) as zf, zf.open(self.MEMBER) as f:
            self._header = self._read_header(f)
        shape, fortran_order, dtype = self._header
        _check_layout(dtype, shape)
        self.num_images = shape[0]
        if self.num_images == 0:
            raise EvalError(f"no images found in {path} (arr_0 is empty)")
        self._streamable = not fortran_order

    @staticmethod
    def _read_header(f):
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(f)
        raise EvalError(f"arr_0 uses .npy format version {version}; uint8 images are written as 1.0 or 2.0")

    def iter_batches(self, batch_size, num_workers=0):
        shape, _, _ = self._header
        if not self._streamable:
            yield from ArrayImages(np.load(self.path)["arr_0"]).iter_batches(batch_size)
            return
        image_bytes = int(np.prod(shape[1:]))
        with zipfile.ZipFile(self.path) as zf, zf.open(self.MEMBER) as f:
            self._read_header(f)  # skip to the data
            for start in range(0, self.num_images, batch_size):
                count = min(batch_size, self.num_images - start)
                data = f.read(count * image_bytes)
                if len(data) != count * image_bytes:
                    raise EvalError(f"{self.path}: arr_0 is truncated at image {start}")
                yield np.frombuffer(bytearray(data), dtype=np.uint8).reshape(count, *shape[1:])  # writable


class _ImageFiles(torch.utils.data.Dataset):
    def __init__(self, files: list[Path]):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i) -> tuple[np.ndarray, str]:
        """(uint8 (H, W, 3) image, '') or (empty array, the reason it cannot be read)."""
        from vit5_sit.data.images import to_rgb_uint8

        try:
            with PIL.Image.open(self.files[i]) as im:
                im.load()  # decode fully while open: truncated files fail here
                return to_rgb_uint8(im), ""  # every mode as the training loader converts it (16-bit scaled)
        except Exception as e:  # noqa: BLE001 - any decoder error: skip the file and report it
            return np.zeros((0,), np.uint8), f"{type(e).__name__}: {e}"


class FolderImages(ImageSource):
    def __init__(self, path: Path):
        self.path, self.description = path, str(path)
        self.files = sorted(walk_image_files(path))
        self.num_images = len(self.files)
        self.skipped: list[tuple[str, str]] = []  # (file, reason) of unreadable images, filled while reading
        if not self.files:
            kinds = ", ".join(IMAGE_EXTENSIONS)
            raise EvalError(f"no images found in {path} (searched recursively for {kinds})")

    def iter_batches(self, batch_size, num_workers=0):
        dataset = _ImageFiles(self.files)
        if num_workers > 0:  # decode in worker processes, in order
            images = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers)
        else:
            images = (dataset[i] for i in range(len(dataset)))
        batch, read = [], 0
        self.skipped = []
        for i, (image, reason) in enumerate(images):
            if reason:
                self.skipped.append((str(self.files[i]), str(reason)))
                print(f"warning: skipping unreadable image {self.files[i]} ({reason})", file=sys.stderr)
                continue
            read += 1
            image = np.asarray(image)
            if batch and (len(batch) == batch_size or image.shape != batch[0].shape):  # one size per batch
                yield np.stack(batch)
                batch = []
            batch.append(image)
        if batch:
            yield np.stack(batch)
        if not read:
            first = f" (first: {self.skipped[0][0]}: {self.skipped[0][1]})" if self.skipped else ""
            raise EvalError(f"none of the {self.num_images} images in {self.path} could be read{first}")


def _npz_keys(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as zf:
            return [name[: -len(".npy")] for name in zf.namelist() if name.endswith(".npy")]
    except zipfile.BadZipFile as e:
        raise EvalError(f"not a valid .npz file: {path}") from e


def _existing_path(source, reference: bool = False) -> Path:
    path = Path(source).expanduser()
    if not path.exists():
        make = (f"; make a reference with `python eval_fid.py ref --data IMAGE_FOLDER --out {source}` (the MNIST "
                "digits: `python -m vit5_sit.data mnist data/mnist32`, then --data data/mnist32)"
                if reference and path.suffix == ".npz" else "")
        raise EvalError(f"file not found: {path}{make}")
    if not path.is_file() and not path.is_dir():  # a FIFO would block the first read forever
        raise EvalError(f"{path} is neither a file nor a folder (a device or a pipe); give an .npz or a folder")
    return path


def open_images(source) -> ImageSource:
    """An ImageSource for a folder, an ADM-layout .npz, or a uint8 array (N, H, W, 3)."""
    if isinstance(source, ImageSource):
        return source
    if isinstance(source, (np.ndarray, torch.Tensor)):
        return ArrayImages(np.asarray(source))
    path = _existing_path(source)
    if path.is_dir():
        return FolderImages(path)
    keys = _npz_keys(path)
    if "arr_0" not in keys:
        raise EvalError(f"no images found in {path}: it has no arr_0 (keys: {', '.join(keys) or 'none'})")
    _check_members(path, ["arr_0"], "give an .npz with arr_0 uint8 N x H x W x 3, as sample.py writes")
    return NpzImages(path)


@dataclass
class Features:
    """Inception features of a set of images."""

    pool: np.ndarray  # (N, 2048) float32 pool3 features: FID, precision/recall, KID
    logits: np.ndarray | None = None  # (N, 1008) unbiased classifier logits: Inception Score; None without fc
    spatial: np.ndarray | None = None  # (N, 2023) float32 mixed_6/conv[..., :7] in NHWC order: sFID


@dataclass
class Reference:
    """What FID / precision / recall / KID compare with: statistics, features, or images to compute them."""

    description: str
    mu: np.ndarray | None = None  # (2048,) float64
    sigma: np.ndarray | None = None  # (2048, 2048) float64
    features: np.ndarray | None = None  # (N, 2048) pool3 features; precision/recall and KID need them
    images: ImageSource | None = None  # where features come from when `features` is None
    inception_weights: str | None = None  # provenance of stored statistics
    mu_s: np.ndarray | None = None  # (2023,) float64: sFID statistics (ADM's mu_s)
    sigma_s: np.ndarray | None = None  # (2023, 2023) float64 (ADM's sigma_s)
    adm: bool = False  # an ADM reference batch (arr_0 with mu/sigma/mu_s/sigma_s), not our own file

    @property
    def num_images(self) -> int | None:
        if self.features is not None:
            return len(self.features)
        return self.images.num_images if self.images is not None else None


# The contract of a reference .npz: every field it may hold, its dtype kinds (numpy's: f float, i/u integer,
# U/S text) and shape (None: any length). A file is checked whole when it is opened, each member's header before
# its data is read: no object or pickled arrays (np.load runs with allow_pickle=False), no complex or integer
# statistics, no shape other than these, no header that declares more data than the file holds.
REFERENCE_FIELDS: dict[str, tuple[str, tuple[int | None, ...]]] = {
    "mu": ("f", (POOL_DIM,)),                      # FID: mean of the pool3 features
    "sigma": ("f", (POOL_DIM, POOL_DIM)),          # FID: their covariance (symmetric, PSD)
    "mu_s": ("f", (SPATIAL_DIM,)),                 # sFID: mean of the mixed_6/conv features
    "sigma_s": ("f", (SPATIAL_DIM, SPATIAL_DIM)),  # sFID: their covariance (symmetric, PSD)
    "features": ("f", (None, POOL_DIM)),           # precision / recall / KID
    "arr_0": ("u", (None, None, None, 3)),         # the images (uint8; `_check_layout` says so by name)
    "arr_1": ("iu", (None,)),                      # ADM's labels (not read)
    "num_images": ("iu", ()),
    "inception_weights": ("US", ()),
    "source": ("US", ()),
    "format": ("US", ()),
}
COVARIANCES = ("sigma", "sigma_s")
# A covariance must be symmetric within SYMMETRY_TOL and positive semi-definite within PSD_TOL, both relative to
# its largest variance: np.cov's rounding stays orders of magnitude below, a damaged or made-up matrix does not
# (a negative-definite sigma_s gave an sFID of -1609).
SYMMETRY_TOL = 1e-6
PSD_TOL = 1e-6


def _member_problem(zf: zipfile.ZipFile, key: str) -> str | None:
    """Why member ``key`` of an .npz cannot be one of REFERENCE_FIELDS, from its header alone, or None."""
    info = zf.getinfo(key + ".npy")
    try:
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                return f"{key} uses .npy format version {version}"
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        return f"{key} has no readable .npy header ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    if dtype.hasobject:
        return f"{key} holds Python objects (a pickle), which are never loaded"
    kinds, want = REFERENCE_FIELDS[key]
    if dtype.kind not in kinds:
        what = {"c": "complex numbers", "b": "booleans", "O": "objects"}.get(dtype.kind, f"dtype {dtype}")
        need = {"f": "real floating-point numbers", "u": "uint8 images", "iu": "integers", "US": "text"}[kinds]
        return f"{key} holds {what}; it must hold {need}"
    if len(shape) != len(want) or any(w is not None and s != w for s, w in zip(shape, want)):
        names = "NHW" if len(want) == 4 else "NDD"[:len(want)]  # images N x H x W x C; statistics N or D x D
        shown = "(" + ", ".join(names[i] if w is None else str(w) for i, w in enumerate(want)) + (
            "," if len(want) == 1 else "") + ")"
        return f"{key} has shape {tuple(shape)}; it must be {shown}"
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if declared > info.file_size:
        return (f"{key}'s header declares {tuple(shape)} {dtype} ({declared:,} bytes), more than the file holds "
                f"({info.file_size:,}): the file is damaged")
    return None


REBUILD = "rebuild the reference with python eval_fid.py ref --data <images> --out <ref.npz>"


def _check_members(path: Path, keys: list[str], fix: str = REBUILD) -> None:
    """Every member of REFERENCE_FIELDS in the file, checked from its header before anything is read."""
    try:
        with zipfile.ZipFile(path) as zf:
            for key in keys:
                if key in REFERENCE_FIELDS and (problem := _member_problem(zf, key)):
                    raise EvalError(f"{path}: {problem}; {fix}")
    except zipfile.BadZipFile as e:
        raise EvalError(f"not a valid .npz file: {path}") from e


def covariance_problem(name: str, sigma: np.ndarray) -> str | None:
    """Why ``sigma`` is no covariance matrix (not symmetric, not positive semi-definite, within the stated
    tolerances), or None."""
    scale = float(np.abs(np.diag(sigma)).max(initial=0.0))
    if scale == 0.0:
        return f"its {name} is all zeros on the diagonal: no covariance of real images"
    asymmetry = float(np.abs(sigma - sigma.T).max())
    if asymmetry > SYMMETRY_TOL * scale:
        return (f"its {name} is not symmetric (entries differ from their transpose by up to {asymmetry:.3g}, more "
                f"than {SYMMETRY_TOL:g} of its largest variance)")
    try:
        np.linalg.cholesky(sigma + PSD_TOL * scale * np.eye(len(sigma)))
    except np.linalg.LinAlgError:
        return (f"its {name} is not positive semi-definite (it has an eigenvalue below -{PSD_TOL:g} of its largest "
                "variance): no covariance matrix")
    return None


def _check_statistics(path: Path, mu: np.ndarray, sigma: np.ndarray, features: np.ndarray | None,
                      mu_s: np.ndarray | None = None, sigma_s: np.ndarray | None = None) -> None:
    if mu.shape != (POOL_DIM,) or sigma.shape != (POOL_DIM, POOL_DIM):
        raise EvalError(
            f"{path}: mu must have shape ({POOL_DIM},) and sigma ({POOL_DIM}, {POOL_DIM}), "
            f"got {mu.shape} and {sigma.shape}"
        )
    if mu_s is not None and (mu_s.shape != (SPATIAL_DIM,) or sigma_s.shape != (SPATIAL_DIM, SPATIAL_DIM)):
        raise EvalError(
            f"{path}: mu_s must have shape ({SPATIAL_DIM},) and sigma_s ({SPATIAL_DIM}, {SPATIAL_DIM}) (ADM's sFID "
            f"statistics), got {mu_s.shape} and {sigma_s.shape}"
        )
    if features is not None and (features.ndim != 2 or features.shape[1] != POOL_DIM):
        raise EvalError(f"{path}: features must have shape (N, {POOL_DIM}), got {features.shape}")
    for name, value in (("mu", mu), ("sigma", sigma), ("features", features), ("mu_s", mu_s),
                        ("sigma_s", sigma_s)):
        if value is not None and not np.isfinite(value).all():
            raise EvalError(f"{path}: its {name} holds NaN or inf; rebuild the reference with "
                            "python eval_fid.py ref --data <images> --out <ref.npz>")
    for name, value in (("sigma", sigma), ("sigma_s", sigma_s)):
        if value is not None and (problem := covariance_problem(name, value)):
            raise EvalError(f"{path}: {problem}; rebuild the reference with python eval_fid.py ref --data <images> "
                            "--out <ref.npz>")


def open_reference(source) -> Reference:
    """A Reference for a statistics .npz (ours or ADM's), an image source, Features, or a Reference."""
    if isinstance(source, Reference):
        return source
    if isinstance(source, Features):
        return Reference("features", features=source.pool)
    if isinstance(source, (np.ndarray, torch.Tensor, ImageSource)):
        images = open_images(source)
        return Reference(images.description, images=images)
    path = _existing_path(source, reference=True)
    if path.is_dir():
        return Reference(str(path), images=FolderImages(path))
    keys = _npz_keys(path)
    _check_members(path, keys)
    if "mu" in keys and ("sigma" in keys or "features" in keys):
        with np.load(path, allow_pickle=False) as data:
            features = data["features"] if "features" in keys else None
            if "sigma" in keys:
                mu, sigma = data["mu"].astype(np.float64), data["sigma"].astype(np.float64)
            else:  # our files with features leave sigma out (it is as large as 4,096 features)
                if features.ndim != 2 or features.shape[1] != POOL_DIM or len(features) < 2:
                    raise EvalError(f"{path}: features must have shape (N >= 2, {POOL_DIM}), got {features.shape}")
                mu, sigma = feature_statistics(features)
            weights = str(data["inception_weights"]) if "inception_weights" in keys else None
            mu_s = sigma_s = None
            if "mu_s" in keys and "sigma_s" in keys:
                mu_s, sigma_s = data["mu_s"].astype(np.float64), data["sigma_s"].astype(np.float64)
            ours = "format" in keys and str(data["format"]).startswith("vit5_sit.eval.reference/")
        _check_statistics(path, mu, sigma, features, mu_s, sigma_s)
        images = NpzImages(path) if "arr_0" in keys else None
        if images is not None and not ours:  # ADM's reference batch: images and their statistics
            return Reference(f"{path} (ADM reference batch)", mu, sigma, images=images, mu_s=mu_s, sigma_s=sigma_s,
                             adm=True)
        return Reference(str(path), mu, sigma, features=features, images=images, inception_weights=weights,
                         mu_s=mu_s, sigma_s=sigma_s)
    if "arr_0" in keys:
        return Reference(str(path), images=NpzImages(path))
    raise EvalError(
        f"{path} is neither images (arr_0) nor statistics (mu, sigma); keys: {', '.join(keys) or 'none'}"
    )


def compute_features(
    images: ImageSource,
    inception,                          # vit5_sit.eval.inception.Inception
    batch_size: int = 64,               # images per Inception forward
    num_workers: int = 0,               # image-decoding processes for folders; 0 = in this process
    progress: bool = True,              # tqdm bar on stderr
    desc: str | None = None,            # bar label; None = the source's description
) -> Features:
    """Inception features of every image: pool3, logits (when the weights have them) and the sFID features,
    from one forward pass per batch. An `inception` without `extract` (a plain callable returning
    (pool, logits)) gives no sFID features."""
    pools, logits, spatials = [], [], []
    extract = getattr(inception, "extract", None)
    with tqdm(total=images.num_images, unit="img", desc=desc or images.description, file=sys.stderr,
              disable=not progress, dynamic_ncols=True) as bar:
        for batch in images.iter_batches(batch_size, num_workers):
            if extract is not None:
                pool, logit, spatial = extract(batch)
                spatials.append(spatial)
            else:
                pool, logit = inception(batch)
            pools.append(pool)
            if logit is not None:
                logits.append(logit)
            bar.update(len(batch))
    return Features(np.concatenate(pools), np.concatenate(logits) if logits else None,
                    np.concatenate(spatials) if spatials else None)
