"""Latent cache: encode an image folder once with the VAE (image and mirror image), read it back for training.

Layout of a cache folder::

    shard_00000.safetensors  moments_0  (N, 2C, h, w)  posterior [mean, logvar] of each image, unscaled
                             moments_1  (N, 2C, h, w)  the same for the horizontally flipped image
                             labels     (N,) int64
                             indices    (N,) int64     position of the image in the folder's sorted file list
                             stats_sum, stats_sumsq (C,) float64: per-channel sums for meta.json
                             metadata 'info': JSON with the shard's range, skipped files and a fingerprint
    meta.json                written last; a cache is complete only when it exists

Shard k holds the images with indices in [k * shard_size, (k + 1) * shard_size); unreadable images are left
out and listed. Every file is written under a temporary name and renamed into place, so an interrupted run
leaves only finished shards, which a re-run keeps (after checking their fingerprint) before encoding the rest.
``part`` / ``num_parts`` split the shards between processes (one per GPU); whichever finishes last writes
meta.json.

Example::

    python -m vit5_sit.data encode --data /data/imagenet/train --out /data/in256_sdvae --resolution 256
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from vit5_sit.common.utils import atomic_write_file, atomic_write_text, check_choice, save_safetensors, stale_temp_files

from .images import ImageFolderDataset, item_generator
from .vae import DEFAULT_VAE, encode_moments, latent_scaling, load_vae, sample_latents

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
SHARD_PATTERN = "shard_{:05d}.safetensors"
META_FILE = "meta.json"
SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _read_info(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["info"])


class _Loader(torch.utils.data.Dataset):
    """Loads images by index for encoding; a failure becomes a flagged placeholder, not an exception."""

    def __init__(self, images: ImageFolderDataset, indices: range):
        self.images, self.indices = images, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        index = self.indices[i]
        try:
            image, label = self.images.load(index)
            return image, label, index, ""
        except Exception as e:  # any decoder error: leave the image out and record why
            return torch.zeros(self.images.sample_shape), -1, index, f"{type(e).__name__}: {e}"


def encode_dataset(
    image_root: str | os.PathLike,
    out_dir: str | os.PathLike,
    vae=DEFAULT_VAE,                   # hub name, local folder, or a loaded AutoencoderKL (on its device)
    resolution: int = 256,             # pixels; images are ADM centre-cropped to this
    batch_size: int = 32,              # images per VAE forward (each is encoded twice: as is and flipped)
    shard_size: int = 4096,            # images per shard file
    device: str | torch.device | None = None,  # None: cuda if available, else cpu
    dtype: torch.dtype = torch.float32,  # VAE compute dtype
    save_dtype: str = "float32",       # 'float32' | 'float16' | 'bfloat16' for the stored moments
    num_workers: int = 0,              # DataLoader processes decoding images
    verify: bool = False,              # header-check every image before planning the shards
    part: int = 0,                     # this process encodes shards k with k % num_parts == part
    num_parts: int = 1,
    progress: bool = True,             # tqdm bar
) -> dict | None:
    """Encode ``image_root`` into ``out_dir``; resumable. Returns meta.json's content once all shards
    exist, or None if other parts still have shards to write."""
    check_choice("save_dtype", save_dtype, sorted(SAVE_DTYPES))
    if batch_size <= 0 or shard_size <= 0:
        raise ValueError(f"batch_size and shard_size must be positive, got {batch_size} and {shard_size}")
    if not 0 <= part < num_parts:
        raise ValueError(f"part must be in [0, num_parts), got part={part}, num_parts={num_parts}")
    images = ImageFolderDataset(image_root, resolution, random_flip=False, channels=3, verify=verify)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    vae_name = vae if isinstance(vae, str) else str(getattr(vae.config, "_name_or_path", type(vae).__name__))
    if isinstance(vae, str):
        vae = load_vae(vae, device=device, dtype=dtype)
    scale, shift = latent_scaling(vae)
    down = 2 ** (len(vae.config.block_out_channels) - 1)  # diffusers' vae_scale_factor
    latent_shape = [vae.config.latent_channels, resolution // down, resolution // down]
    settings = dict(format=CACHE_FORMAT, vae=vae_name, scaling_factor=scale, shift_factor=shift,
                    resolution=resolution, latent_shape=latent_shape, save_dtype=save_dtype,
                    shard_size=shard_size, class_names=images.classes)
    settings_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()

    n = len(images)
    num_shards = (n + shard_size - 1) // shard_size
    ranges = [range(k * shard_size, min((k + 1) * shard_size, n)) for k in range(num_shards)]
    paths = [out / SHARD_PATTERN.format(k) for k in range(num_shards)]
    extra = sorted(p.name for p in out.glob("shard_*.safetensors") if p not in paths)
    if extra:
        raise ValueError(f"{str(out)!r} holds shards beyond this dataset's {num_shards} ({extra[0]}, ...): "
                         "it was made from other images; use a new folder or delete it")

    def fingerprint(k: int) -> str:
        files = "\n".join(images.samples[i][0] for i in ranges[k])
        return hashlib.sha256(f"{settings_hash}\n{files}".encode()).hexdigest()

    def check(k: int) -> dict:
        """The info of finished shard k, if it belongs to this cache."""
        try:
            info = _read_info(paths[k])
        except Exception as e:
            raise ValueError(f"{paths[k]} is unreadable ({e}); delete it and re-run to encode it") from e
        if info.get("fingerprint") != fingerprint(k):
            raise ValueError(f"{paths[k]} was encoded with other settings (VAE, resolution, save dtype, "
                             "shard size, classes) or other images; use a new output folder or delete it")
        return info

    from tqdm import tqdm

    done = [k for k in range(num_shards) if paths[k].exists()]
    for k in done:
        check(k)
    todo = [k for k in range(num_shards) if k % num_parts == part and not paths[k].exists()]
    bar = tqdm(total=sum(len(ranges[k]) for k in todo), desc=f"encoding {image_root}", unit="img",
               disable=not progress)
    for k in todo:
        for stale in stale_temp_files(paths[k]):  # left by a killed run of this part
            stale.unlink()
        with atomic_write_file(paths[k]) as tmp:
            _encode_shard(images, vae, ranges[k], tmp, batch_size, num_workers, scale, shift,
                          SAVE_DTYPES[save_dtype], latent_shape, fingerprint(k), bar)
    bar.close()

    missing = [p.name for p in paths if not p.exists()]
    if missing:
        log.info("%d shards (%s, ...) are left to other parts; meta.json is written by the last one",
                 len(missing), missing[0])
        return None
    return _write_meta(out, settings, images, [check(k) for k in range(num_shards)])


def _encode_shard(images, vae, indices, tmp, batch_size, num_workers, scale, shift, save_dtype,
                  latent_shape, fingerprint, bar) -> None:
    loader = torch.utils.data.DataLoader(_Loader(images, indices), batch_size=batch_size,
                                         num_workers=num_workers, shuffle=False)
    moments, labels, kept, skipped = ([], []), [], [], []
    channels = latent_shape[0]
    stats_sum = torch.zeros(channels, dtype=torch.float64)
    stats_sumsq = torch.zeros(channels, dtype=torch.float64)
    for x, y, index, reason in loader:
        ok = torch.tensor([r == "" for r in reason])
        for i, r in zip(index[~ok].tolist(), [r for r in reason if r]):
            skipped.append(dict(path=images.samples[i][0], reason=r))
            log.warning("skipping unreadable image %s (%s)", images.root / images.samples[i][0], r)
        bar.update(len(reason))
        if not ok.any():
            continue
        x = x[ok]
        m = encode_moments(vae, torch.cat([x, x.flip(-1)])).cpu()  # (2B, 2C, h, w): B images, then mirrors
        assert m.shape[1:] == (2 * channels, *latent_shape[1:]), f"unexpected latent shape {tuple(m.shape)}"
        # Exact per-channel moments of the sampled scaled latents: E[x] and E[x^2] = mean^2 + var.
        mean, logvar = m.double().chunk(2, dim=1)
        mean = (mean - shift) * scale
        stats_sum += mean.sum(dim=(0, 2, 3))
        stats_sumsq += (mean.square() + logvar.exp() * scale**2).sum(dim=(0, 2, 3))
        for flip, half in enumerate(m.chunk(2)):
            moments[flip].append(half.to(save_dtype))
        labels.append(y[ok])
        kept.append(index[ok])
    empty = torch.zeros(0, 2 * channels, *latent_shape[1:], dtype=save_dtype)
    tensors = {
        "moments_0": torch.cat(moments[0]) if kept else empty,
        "moments_1": torch.cat(moments[1]) if kept else empty,
        "labels": torch.cat(labels).long() if kept else torch.zeros(0, dtype=torch.long),
        "indices": torch.cat(kept).long() if kept else torch.zeros(0, dtype=torch.long),
        "stats_sum": stats_sum,
        "stats_sumsq": stats_sumsq,
    }
    info = dict(first=indices.start, stop=indices.stop, count=len(tensors["labels"]), skipped=skipped,
                fingerprint=fingerprint)
    tensors = {name: t.contiguous() for name, t in tensors.items()}  # conv outputs may be channels-last
    save_safetensors(tensors, tmp, metadata={"info": json.dumps(info, sort_keys=True)})  # one key: stable bytes


def _write_meta(out: Path, settings: dict, images: ImageFolderDataset, infos: list[dict]) -> dict:
    stats_sum, stats_sumsq = 0.0, 0.0
    for k in range(len(infos)):
        with safe_open(str(out / SHARD_PATTERN.format(k)), framework="pt") as f:
            stats_sum = stats_sum + f.get_tensor("stats_sum")
            stats_sumsq = stats_sumsq + f.get_tensor("stats_sumsq")
    num_images = sum(info["count"] for info in infos)
    if num_images == 0:
        raise ValueError(f"no image in {str(images.root)!r} could be read; nothing was encoded")
    h, w = settings["latent_shape"][1:]
    count = 2 * num_images * h * w  # both flips
    channel_mean = stats_sum / count
    channel_std = (stats_sumsq / count - channel_mean.square()).clamp_min(0).sqrt()
    skipped = [dict(path=s.path, reason=s.reason) for s in images.skipped]  # verify=True scan
    skipped += [s for info in infos for s in info["skipped"]]
    meta = dict(
        settings,
        storage="moments",  # [mean, logvar] along channels, unscaled; latent = (sample - shift) * scale
        flips=2,            # moments_0: the image, moments_1: its mirror image
        num_images=num_images,
        num_classes=len(settings["class_names"]),
        skipped_count=len(skipped),
        skipped=skipped,
        channel_mean=channel_mean.tolist(),  # of the scaled latents, posterior samples of both flips
        channel_std=channel_std.tolist(),
        shards=[dict(file=SHARD_PATTERN.format(k), count=info["count"]) for k, info in enumerate(infos)],
    )
    atomic_write_text(out / META_FILE, json.dumps(meta, indent=1) + "\n")
    return meta


class LatentDataset(torch.utils.data.Dataset):
    """Items ``(latent, label)`` from a latent cache: latent float32 (C, h, w), scaled by the VAE's factor.

    Each read draws a fresh posterior sample (``sample_posterior=True``, as SiT does when it encodes on
    the fly) of the image or, with ``random_flip``, of its mirror image. With a ``seed`` both choices come
    from a generator seeded with (seed, epoch, index), so resumed runs see the same data. Shards are
    memory-mapped and opened lazily in each process (safe with DataLoader workers).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        random_flip: bool = True,
        seed: int | None = None,        # None: the global torch RNG
        sample_posterior: bool = True,  # False: the posterior mean (deterministic latents)
    ):
        self.root = Path(root)
        meta_path = self.root / META_FILE
        if not meta_path.is_file():
            raise ValueError(
                f"{str(self.root)!r} is not a finished latent cache ({META_FILE} missing): run "
                f"`python -m vit5_sit.data encode --data IMAGES --out {self.root}` (it resumes)"
            )
        redo = f"run `python -m vit5_sit.data encode --data IMAGES --out {self.root}` again (it resumes)"
        try:
            self.meta = json.loads(meta_path.read_bytes())
        except (OSError, ValueError) as e:
            raise ValueError(f"{meta_path}: unreadable ({type(e).__name__}: {e}); {redo}") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") != CACHE_FORMAT:
            found = self.meta.get("format") if isinstance(self.meta, dict) else type(self.meta).__name__
            raise ValueError(f"{meta_path}: cache format {found}, expected {CACHE_FORMAT}")
        self.random_flip, self.seed, self.sample_posterior = random_flip, seed, sample_posterior
        self.epoch = 0
        try:
            self.classes = list(self.meta["class_names"])
            self.scaling_factor = float(self.meta["scaling_factor"])
            self.shift_factor = float(self.meta["shift_factor"])
            self._files = [self.root / s["file"] for s in self.meta["shards"]]
            self._offsets = np.cumsum([0] + [s["count"] for s in self.meta["shards"]]).tolist()
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{meta_path}: malformed ({type(e).__name__}: {e}); {redo}") from None
        labels = []
        for path in self._files:
            try:
                with safe_open(str(path), framework="pt") as f:
                    labels.append(f.get_tensor("labels"))
            except (SafetensorError, OSError) as e:  # missing, truncated or not a safetensors file
                raise ValueError(f"{path}: unreadable latent shard ({type(e).__name__}: {e}); {redo}") from None
        self.labels = torch.cat(labels)  # (N,) int64, for class statistics or balanced samplers
        self._handles: dict[int, object] = {}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return tuple(self.meta["latent_shape"])

    @property
    def resolution(self) -> int:
        return int(self.meta["resolution"])

    def set_epoch(self, epoch: int) -> None:
        """Select the flips and posterior samples of this epoch (only matters with a ``seed``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self._offsets[-1]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handles": {}}  # open files don't travel to worker processes

    def moments(self, index: int, flip: int = 0) -> torch.Tensor:
        """Stored posterior moments (2C, h, w) of image ``index`` (flip 1: its mirror image)."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} latents")
        shard = bisect.bisect_right(self._offsets, index) - 1
        if shard not in self._handles:
            self._handles[shard] = safe_open(str(self._files[shard]), framework="pt")
        return self._handles[shard].get_slice(f"moments_{flip}")[index - self._offsets[shard]]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = None if self.seed is None else item_generator(self.seed, self.epoch, index)
        flip = int(torch.randint(2, (), generator=g)) if self.random_flip else 0
        latent = sample_latents(self.moments(index, flip), self.scaling_factor, self.shift_factor,
                                sample=self.sample_posterior, generator=g)
        return latent, self.labels[index]
