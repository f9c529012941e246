"""`Vit5SitPipeline`: class-conditional generation from Python, in the shape of diffusers' `DiTPipeline`.

    from vit5_sit.pipeline import Vit5SitPipeline

    pipe = Vit5SitPipeline.from_pretrained()                     # the bundled demo (MNIST digits)
    images = pipe(class_labels=[3, 7], seed=0).images             # two PIL images
    pipe = Vit5SitPipeline.from_pretrained("me/vit5-xl2-in256")   # a Hub repo, run or model folder
    out = pipe(class_labels=[207, "goldfish"], guidance_scale=4.0, num_inference_steps=50, sampler="sde",
               generator=torch.Generator().manual_seed(0), output_type="np")

A plain class, not a diffusers ``DiffusionPipeline``: that base class expects ``ModelMixin`` / ``ConfigMixin``
components stored as ``model_index.json`` + per-component ``config.json`` folders, and a scheduler with a
``step()`` loop. Our model folder is one ``config.yaml`` + ``ema.safetensors`` that ``sample.py``, training and
evaluation all read, and our samplers (SiT's ODE / SDE solvers, adaptive dopri5 included) are whole
functions of (model, noise), not per-step schedulers; fitting both into diffusers' shapes would mean a
second weight layout and a scheduler that only wraps them. The call shape follows `DiTPipeline`.

Sampling is `vit5_sit.generate.sample_images`, the function behind ``sample.py``: image i has seed
``seed + i`` (one generator per sample), so for the same seeds and settings the pipeline gives exactly the
images of ``sample.py``, whatever the batch size.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from vit5_sit.classes import IMAGENET_NUM_CLASSES, ClassSpecError, check_class_id, imagenet_name, parse_classes
from vit5_sit.config import ExperimentConfig
from vit5_sit.generate import sample_images, sampler_settings, to_uint8
from vit5_sit.models import Denoiser
from vit5_sit.transport import SeedError, Transport, check_guidance_settings, check_seeds

OUTPUT_TYPES = ("pil", "np", "pt")
MAX_SEED = 2**31 - 1  # seeds drawn from a torch.Generator lie in [0, MAX_SEED)


@dataclasses.dataclass
class Vit5SitPipelineOutput:
    """Like diffusers' ``ImagePipelineOutput``: ``images``, plus the labels and seeds that made them."""

    images: list | np.ndarray | torch.Tensor  # PIL images; np (N, H, W, C) / pt (N, C, H, W) floats in [0, 1]
    class_labels: list[int]
    seeds: list[int]


class Vit5SitPipeline:
    """A trained model, its config and (latent models) the VAE; call it to generate images."""

    def __init__(self, model: Denoiser, config: ExperimentConfig, vae=None, metrics: list[dict] | None = None):
        self.model = model.eval()
        self.config = config
        self.metrics = list(metrics or [])  # measured metrics, carried into save_pretrained's model card
        self.transport = Transport(config.transport)
        self.latent = config.data.kind == "latents"
        self._vae = vae                   # None until first needed: a name/path, or a loaded AutoencoderKL
        self._progress = {"disable": False}

    # -- loading ---------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, repo_id_or_path: str | Path | None = None, *,
                        revision: str | None = None,          # branch, tag or commit of a Hub repo
                        cache_dir: str | Path | None = None,  # None = the Hugging Face cache
                        token: str | None = None,
                        vae=None,                             # latent models: None = the config's data.vae
                        device: torch.device | str = "cpu",
                        ) -> Vit5SitPipeline:
        """From a Hub repo id, a model folder, a run folder (newest valid checkpoint) or a checkpoint folder;
        None = the bundled demo model."""
        from vit5_sit.hub import PretrainedModel

        loaded = PretrainedModel.from_pretrained(repo_id_or_path, revision=revision, cache_dir=cache_dir,
                                                 token=token, device=device)
        return cls(loaded.model, loaded.config, vae=vae, metrics=loaded.metrics)

    def _pretrained(self):
        from vit5_sit.hub import PretrainedModel

        return PretrainedModel(self.model, self.config, self.metrics)

    def save_pretrained(self, save_directory: str | Path, **kwargs) -> Path:
        """The model folder (`vit5_sit.hub.PretrainedModel.save_pretrained`); the VAE is the config's name."""
        return self._pretrained().save_pretrained(save_directory, **kwargs)

    def push_to_hub(self, repo_id: str, **kwargs) -> str:
        """Upload the model folder to a Hub model repo (`vit5_sit.hub.PretrainedModel.push_to_hub`)."""
        return self._pretrained().push_to_hub(repo_id, **kwargs)

    def to(self, device: torch.device | str) -> Vit5SitPipeline:
        self.model.to(device)
        if self._vae is not None and not isinstance(self._vae, str | Path):
            self._vae.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vae(self):
        """The VAE of a latent model, loaded on first use (`vit5_sit.data.vae.load_vae`); None for pixels."""
        if not self.latent:
            return None
        if self._vae is None or isinstance(self._vae, str | Path):
            from vit5_sit.data.vae import load_vae

            self._vae = load_vae(str(self._vae or self.config.data.vae), device=self.device)
        return self._vae

    # -- labels ----------------------------------------------------------------------------------------
    @property
    def id2label(self) -> dict[int, str]:
        """Class id -> name: ImageNet names for 1000-class models, the id itself otherwise."""
        n = self.model.cfg.num_classes
        if n == IMAGENET_NUM_CLASSES:
            return {i: imagenet_name(i) for i in range(n)}
        return {i: str(i) for i in range(n)}

    def get_label_ids(self, labels: int | str | Sequence[int | str]) -> list[int]:
        """Class ids from ids and (ImageNet) names, as ``sample.py --classes`` reads them."""
        n = self.model.cfg.num_classes
        if isinstance(labels, torch.Tensor | np.ndarray):  # a tensor / array of ids, or one id
            labels = labels.reshape(-1).tolist() if labels.ndim <= 1 else labels
        labels = [labels] if isinstance(labels, int | str | np.integer) else list(labels)
        if not labels:
            raise ClassSpecError("class_labels is empty: give at least one class id or name")
        ids = []
        for label in labels:
            if isinstance(label, str):
                ids += parse_classes(label, n)
                continue
            if isinstance(label, torch.Tensor) and label.ndim == 0 and not label.is_floating_point():
                label = label.item()
            if isinstance(label, bool) or not isinstance(label, int | np.integer):
                raise ClassSpecError(f"class label {label!r}: give a class id or an ImageNet class name")
            ids.append(check_class_id(int(label), n))
        return ids

    # -- progress bar (as in diffusers) ----------------------------------------------------------------
    def set_progress_bar_config(self, **kwargs) -> None:
        """tqdm options for the bar of each call, e.g. ``disable=True``."""
        self._progress = {**self._progress, **kwargs}

    def progress_bar(self, total: int):
        from tqdm.auto import tqdm

        return tqdm(total=total, unit="img", desc="sampling", **{"dynamic_ncols": True, **self._progress})

    # -- generation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, class_labels: int | str | Sequence[int | str], *,
                 guidance_scale: float | None = None,             # 1 = none; None = the config's grid scale
                 guidance_interval: tuple[float, float] = (0.0, 1.0),  # guide only for t in this range
                 num_inference_steps: int | None = None,          # fixed-step methods; None = the config's
                 sampler: str | None = None,                      # 'ode' | 'sde'; None = the config's
                 method: str | None = None,                       # 'euler', 'heun', 'dopri5', ...
                 seed: int | Sequence[int] | None = None,         # first seed (image i: seed + i), or one each
                 generator: torch.Generator | None = None,        # draws the seeds when seed is None
                 output_type: str = "pil",                        # 'pil' | 'np' | 'pt'
                 batch_size: int = 64,                            # images per forward; does not change them
                 return_dict: bool = True,
                 ) -> Vit5SitPipelineOutput | tuple:
        """One image per class label. Seeds: ``seed`` as in ``sample.py`` (image i has seed + i), else
        drawn from ``generator``, else from torch's global RNG (see the output's ``seeds``)."""
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type={output_type!r}: choose one of {', '.join(OUTPUT_TYPES)}")
        labels = self.get_label_ids(class_labels)
        seeds = self._seeds(len(labels), seed, generator)
        scale = self.config.log.sample_cfg_scale if guidance_scale is None else float(guidance_scale)
        check_guidance_settings(scale, guidance_interval, "guidance_scale", "guidance_interval")
        low, high = guidance_interval
        try:
            settings = sampler_settings(self.config.sampler, sampler, method, num_inference_steps)
        except ValueError as e:
            raise ValueError(f"sampler / method / num_inference_steps: {e}") from None
        with self.progress_bar(len(labels)) as bar:
            x = sample_images(self.model, self.transport, settings, labels, seeds, cfg_scale=scale,
                              guidance_interval=(low, high), vae=self.vae, batch_size=batch_size,
                              device=self.device, on_batch=bar.update, as_float=True)
        images = self._convert(x, output_type)
        if not return_dict:
            return (images,)
        return Vit5SitPipelineOutput(images, labels, seeds)

    @staticmethod
    def _seeds(n: int, seed, generator: torch.Generator | None) -> list[int]:
        if seed is not None and generator is not None:
            raise SeedError("give seed or generator, not both: seed fixes every image's seed, generator draws them")
        if seed is not None:
            if isinstance(seed, numbers.Integral):
                first = check_seeds(seed, n)
                return list(range(first, first + n))
            if isinstance(seed, str | bytes) or not isinstance(seed, Sequence | np.ndarray | torch.Tensor):
                raise SeedError(f"seed={seed!r}: give the first seed (an int; image i has seed + i) or one int "
                                "per image")
            seeds = [check_seeds(s.item() if isinstance(s, torch.Tensor) else s) for s in seed]
            if len(seeds) != n:
                raise ValueError(f"{len(seeds)} seeds for {n} class labels: give one seed per image, or the first")
            return seeds
        drawn = torch.randint(0, MAX_SEED, (n,), generator=generator)
        return [int(s) for s in drawn]

    @staticmethod
    def _convert(x: torch.Tensor, output_type: str):
        """(N, C, H, W) in [-1, 1] -> PIL images (RGB, exactly sample.py's pixels) or floats in [0, 1]."""
        if output_type == "pil":
            from PIL import Image

            return [Image.fromarray(a) for a in to_uint8(x)]
        x = ((x + 1) / 2).clamp(0, 1)
        return x.permute(0, 2, 3, 1).numpy() if output_type == "np" else x

