"""The Stable-Diffusion VAE (diffusers ``AutoencoderKL``): offline-friendly loading, encode, decode.

Latent convention (SiT/DiT): ``latents = (z - shift_factor) * scaling_factor`` with ``z`` drawn from the
VAE posterior; both factors come from ``vae.config`` (sd-vae: scaling 0.18215, no shift). The latent cache
stores the posterior *moments* (mean and log-variance, diffusers' ``latent_dist.parameters`` layout) rather
than one sample, so training draws a fresh posterior sample every time it reads an image, as SiT does when
it encodes on the fly; ``sample_latents`` turns moments into scaled latents.

diffusers is imported inside the functions that need it: the rest of ``vit5_sit.data`` (and the latent
dataset) works on machines without it.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch

from vit5_sit.common.utils import host_reachable

DEFAULT_VAE = "stabilityai/sd-vae-ft-ema"
SD_VAE_SCALING_FACTOR = 0.18215  # the SD VAEs' config.scaling_factor; used only if a config has none
TRUE_STRINGS = ("1", "true", "yes", "on")


class VAELoadError(OSError):
    """The VAE could not be loaded; the message says why and what to do."""


def hub_offline_by_env() -> bool:
    """True if the environment declares Hugging Face offline mode (HF_HUB_OFFLINE=1)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_STRINGS


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether one TCP connection to the hub endpoint (HF_ENDPOINT or huggingface.co) succeeds."""
    return host_reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))


def looks_like_path(name: str) -> bool:
    """Hub ids are 'name' or 'org/name'; anything else that is not a folder is a mistyped path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def load_vae(
    name_or_path: str = DEFAULT_VAE,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    subfolder: str | None = None,  # e.g. 'vae' to take the VAE out of a full pipeline repo
):
    """Load an ``AutoencoderKL`` from a local folder, the Hugging Face cache, or (if online) the hub.

    Never waits on network retries: local folders and cached models load with ``local_files_only``;
    an uncached hub name fails at once with a ``VAELoadError`` when HF_HUB_OFFLINE=1 is set or the hub
    is unreachable. Returns the model in eval mode with gradients off.
    """
    from diffusers import AutoencoderKL

    def load(source: str, **kwargs):
        if subfolder is not None:
            kwargs["subfolder"] = subfolder
        with warnings.catch_warnings():  # diffusers passes a deprecated argument to huggingface_hub
            warnings.filterwarnings("ignore", message=".*local_dir_use_symlinks.*")
            return AutoencoderKL.from_pretrained(source, torch_dtype=dtype, **kwargs)

    path = Path(name_or_path).expanduser()
    if path.is_dir():
        try:
            vae = load(str(path), local_files_only=True)
        except Exception as e:
            raise VAELoadError(
                f"could not load VAE from folder {str(path)!r} (expected a config.json and weights written "
                f"by AutoencoderKL.save_pretrained): {e}"
            ) from e
    elif looks_like_path(name_or_path):
        raise VAELoadError(f"could not load VAE {name_or_path!r}: no such folder")
    else:
        try:
            vae = load(name_or_path, local_files_only=True)  # the cache first: no network if it is there
        except OSError as cache_miss:
            offline = hub_offline_by_env() or not hub_reachable()
            if offline:
                from huggingface_hub import constants

                why = "HF_HUB_OFFLINE=1" if hub_offline_by_env() else f"{constants.ENDPOINT} unreachable"
                raise VAELoadError(
                    f"could not load VAE {name_or_path!r}: offline ({why}) and not in the Hugging Face cache "
                    f"({constants.HF_HUB_CACHE}). Download it on a connected machine with "
                    f"`hf download {name_or_path}` (older hub versions: `huggingface-cli download`) "
                    "and copy the cache folder here (or point HF_HOME at it), or pass a local folder "
                    "written by AutoencoderKL.save_pretrained"
                ) from cache_miss
            try:
                vae = load(name_or_path)
            except Exception as e:
                raise VAELoadError(f"could not load VAE {name_or_path!r} from the hub: {e}") from e
    return vae.to(device).eval().requires_grad_(False)


def latent_scaling(vae) -> tuple[float, float]:
    """(scaling_factor, shift_factor) from the VAE config: latents = (z - shift) * scale."""
    scale = getattr(vae.config, "scaling_factor", None)
    shift = getattr(vae.config, "shift_factor", None)
    return float(SD_VAE_SCALING_FACTOR if scale is None else scale), float(0.0 if shift is None else shift)


@torch.no_grad()
def encode_moments(vae, images: torch.Tensor) -> torch.Tensor:
    """Images (B, 3, H, W) in [-1, 1] -> posterior moments (B, 2C, h, w) float32: [mean, logvar], unscaled."""
    dist = vae.encode(images.to(device=vae.device, dtype=vae.dtype)).latent_dist
    return torch.cat([dist.mean, dist.logvar], dim=1).float()


def sample_latents(
    moments: torch.Tensor,  # (..., 2C, h, w): [mean, logvar] along the channel axis
    scaling_factor: float,
    shift_factor: float = 0.0,
    sample: bool = True,  # False: the posterior mean (deterministic)
    generator: torch.Generator | None = None,  # None: the global torch RNG
) -> torch.Tensor:
    """Posterior moments -> scaled latents ``(z - shift) * scale``, z a fresh posterior sample or the mean."""
    mean, logvar = moments.float().chunk(2, dim=-3)
    z = mean
    if sample:
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype).to(mean.device)
        z = mean + torch.exp(0.5 * logvar) * noise
    return (z - shift_factor) * scaling_factor


@torch.no_grad()
def encode(
    vae, images: torch.Tensor, sample: bool = True, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Images (B, 3, H, W) in [-1, 1] -> scaled latents (B, C, h, w) float32, as the denoiser sees them."""
    scale, shift = latent_scaling(vae)
    return sample_latents(encode_moments(vae, images), scale, shift, sample, generator).to(images.device)


@torch.no_grad()
def decode(vae, latents: torch.Tensor) -> torch.Tensor:
    """Scaled latents (B, C, h, w) -> images (B, 3, H, W) float32 in [-1, 1]."""
    scale, shift = latent_scaling(vae)
    z = latents.float() / scale + shift
    return vae.decode(z.to(device=vae.device, dtype=vae.dtype)).sample.float().clamp(-1, 1).to(latents.device)
