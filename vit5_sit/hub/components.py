"""The diffusers side of a model folder: the denoiser as a ``ModelMixin``, our sampler as a ``SchedulerMixin``,
and the pipeline that ``DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`` builds from them.

    from diffusers import DiffusionPipeline
    pipe = DiffusionPipeline.from_pretrained("me/vit5-mnist", trust_remote_code=True)   # vit5-sit not needed
    images = pipe(class_labels=[3, 7], seed=0).images       # the images Vit5SitPipeline gives for these seeds

These classes are the source of the code in a model folder: `vit5_sit.hub.remote_code` copies them, with every
definition of the package they use (the denoiser, the samplers, seeded noise, guidance, VAE decoding), into
``transformer/transformer_vit5_sit.py``, ``scheduler/scheduling_vit5_sit.py`` and ``pipeline_vit5_sit.py``
when the folder is written (`vit5_sit.hub.layout`). Here they are importable as they are, and tested both ways.

- `Vit5SitTransformer2DModel` *is* a `Denoiser` (same modules, state-dict keys, forward ``(x, t, y)``, t = 0
  noise, t = 1 data) that is also a diffusers model: ``transformer/config.json`` holds the `ModelConfig` fields
  (a new field of ModelConfig is a new config key by itself), ``transformer/diffusion_pytorch_model.safetensors``
  the weights, the one weights file of the folder, which vit5-sit's own loaders read too.
- `Vit5SitScheduler` holds the model's transport (path, prediction) and its default sampler (the sampler section
  of config.yaml) as a scheduler config; the pipeline samples with `vit5_sit.transport.sample` through it, so every
  sampler of the package (ODE / SDE, DPM-Solver++, ...) gives the package's images. diffusers' own step loop
  (``set_timesteps`` / ``timesteps`` / ``step``) serves ODE Euler, the default: its steps are those of
  `ode_euler`, bit for bit. diffusers' `FlowMatchEulerDiscreteScheduler` is not used: its grid ends with a
  step to sigma = 1/1000 and it steps in float32 sigmas, so at the same step count its images differ from ours.
- `Vit5SitDiffusersPipeline`: ``__call__`` takes `Vit5SitPipeline`'s arguments (class ids, not names) and samples
  with ``sample.py``'s function, `sample_images`: the same seeds and settings give the same images.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Sequence
from pathlib import Path

import torch
from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin, SchedulerMixin
from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerOutput

from vit5_sit.common.classes import ClassSpecError, check_class_id
from vit5_sit.hub.agreement import check_loaded, check_transformer_files, read_json, transformer_files
from vit5_sit.models.config import ModelConfig
from vit5_sit.models.denoiser import Denoiser
from vit5_sit.pipeline import Vit5SitPipelineOutput, convert_images, draw_seeds
from vit5_sit.sampling.generate import sample_images, sampler_settings, steps_per_batch
from vit5_sit.transport.guidance import check_guidance_settings
from vit5_sit.transport.samplers import SamplerConfig, steps_grid
from vit5_sit.transport.transport import Transport, TransportConfig

OUTPUT_TYPES = ("pil", "np", "pt", "latent", None)  # diffusers' output types; None = "np", as diffusers reads it


def config_init(*config_classes):
    """Decorate an ``__init__(self, **fields)``: its signature becomes the fields of the dataclasses, with their
    defaults, and diffusers' `register_to_config` records them (what ConfigMixin writes to the config file and
    passes back on loading)."""
    params, seen = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)], set()
    for config_class in config_classes:
        for f in dataclasses.fields(config_class):
            if f.name in seen:
                raise TypeError(f"{config_class.__name__}.{f.name}: the name is also a field of another config "
                                "of the same component")
            seen.add(f.name)
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default))

    def decorate(init):
        init.__signature__ = inspect.Signature(params)
        return register_to_config(init)

    return decorate


def split_fields(fields: dict, config_class) -> tuple[dict, dict]:
    """(the fields of ``config_class``, the others)."""
    names = {f.name for f in dataclasses.fields(config_class)}
    return {k: v for k, v in fields.items() if k in names}, {k: v for k, v in fields.items() if k not in names}


class Vit5SitTransformer2DModel(ModelMixin, ConfigMixin, Denoiser):
    """`Denoiser` as a diffusers model: the same modules, weights and ``forward(x, t, y)``; its config is the
    `ModelConfig` fields (``transformer/config.json``)."""

    config_name = "config.json"
    # Config values are read as model.config.x only: ModelMixin's fallback (model.x = the config's x) would
    # shadow modules of the same name (pos_embed is a config field and the position table).
    __getattr__ = torch.nn.Module.__getattr__

    @config_init(ModelConfig)
    def __init__(self, **fields) -> None:
        Denoiser.__init__(self, ModelConfig(**fields))  # nn.Module's __init__ through Denoiser's
        self._gradient_checkpointing_func = None         # what ModelMixin.__init__ sets

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """diffusers' loading, refusing a folder whose files state two models (`vit5_sit.hub.agreement`): before
        the model is built, config.json against the record in the weights' metadata and the weights' keys and
        shapes against the model; after, the config it was built with against that record, and NaN or inf."""
        where = str(Path(pretrained_model_name_or_path) / (kwargs.get("subfolder") or ""))
        files = transformer_files(pretrained_model_name_or_path, kwargs)
        if files is not None:
            check_transformer_files(read_json(files[0]), files[1], where)
        loaded = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True: (model, info)
        check_loaded(model, model.cfg, files[1] if files is not None else None, where)
        return loaded


class Vit5SitScheduler(SchedulerMixin, ConfigMixin):
    """The model's transport and default sampler as a diffusers scheduler (``scheduler/scheduler_config.json``:
    the `TransportConfig` and `SamplerConfig` fields). ``sample`` runs the whole sampler; ``set_timesteps`` and
    ``step`` are diffusers' loop for ODE Euler, with our times: ``timesteps`` are the t (0 = noise, 1 = data) at
    which the model is called, and ``step`` takes the model's output (its prediction, velocity by default)."""

    config_name = "scheduler_config.json"
    order = 1

    @config_init(TransportConfig, SamplerConfig)
    def __init__(self, **fields) -> None:
        transport, sampler = split_fields(fields, TransportConfig)
        self.transport = Transport(TransportConfig(**transport))
        self.sampler = SamplerConfig(**sampler)
        self.timesteps: torch.Tensor | None = None
        self.times: list[float] | None = None
        self.num_inference_steps: int | None = None
        self._step_index = 0

    def sampler_config(self, num_inference_steps: int | None = None, mode: str | None = None,
                       method: str | None = None) -> SamplerConfig:
        """The default sampler with some settings changed (`vit5_sit.sampling.generate.sampler_settings`)."""
        return sampler_settings(self.sampler, mode, method, num_inference_steps)

    def sample(self, model_fn, noise: torch.Tensor, y: torch.Tensor, num_inference_steps: int | None = None,
               rng=None) -> torch.Tensor:
        """noise (t = 0) -> samples (t = 1) with the default sampler: `vit5_sit.transport.sample`."""
        from vit5_sit.transport.samplers import sample

        return sample(model_fn, noise, y, self.transport, self.sampler_config(num_inference_steps), rng=rng).samples

    def set_timesteps(self, num_inference_steps: int | None = None, device: torch.device | str | None = None):
        """The times of ODE Euler's steps (``timesteps``, in t; ``sigmas`` = 1 - t, diffusers' noise level)."""
        cfg = self.sampler_config(num_inference_steps)
        if (cfg.mode, cfg.method) != ("ode", "euler"):
            raise ValueError(f"set_timesteps / step serve ODE Euler; this scheduler's sampler is {cfg.mode} "
                             f"{cfg.method}: call the pipeline (or scheduler.sample), which runs it whole")
        self.times = steps_grid(self.transport, cfg)
        self.timesteps = torch.tensor(self.times[:-1], dtype=torch.float32, device=device)
        self.sigmas = 1 - torch.tensor(self.times, dtype=torch.float32, device=device)
        self.num_inference_steps = cfg.steps
        self._step_index = 0

    def step(self, model_output: torch.Tensor, timestep, sample: torch.Tensor, return_dict: bool = True):
        """One Euler step from times[i] to times[i + 1] (i: the steps since set_timesteps) along the velocity of
        ``model_output`` at (sample, times[i]), exactly as `vit5_sit.transport.samplers.ode_euler` steps."""
        if self.times is None or self._step_index >= len(self.times) - 1:
            raise ValueError("step() past the last time: call set_timesteps first, then step once per timestep")
        t_cur, t_next = self.times[self._step_index], self.times[self._step_index + 1]
        t = torch.full((sample.shape[0],), t_cur, dtype=sample.dtype, device=sample.device)
        prev = sample + (t_next - t_cur) * self.transport.velocity(model_output, sample, t)
        self._step_index += 1
        return SchedulerOutput(prev_sample=prev) if return_dict else (prev,)

    def __len__(self) -> int:
        return self.sampler.steps


class Vit5SitDiffusersPipeline(DiffusionPipeline):
    """Class-conditional generation with a vit5-sit model folder, loaded by diffusers alone.

    ``pipe(class_labels, guidance_scale=None, num_inference_steps=None, seed=None, generator=None, ...)``: the
    arguments of `vit5_sit.pipeline.Vit5SitPipeline` (class ids only: ImageNet names need the package), the same
    images for the same seeds and settings. ``guidance_scale`` None = the model's (``model_index.json``)."""

    model_cpu_offload_seq = "transformer->vae"
    _optional_components = ["vae"]

    def __init__(self, transformer: ModelMixin, scheduler: SchedulerMixin, vae: ModelMixin | None = None,
                 guidance_scale: float = 1.0) -> None:
        super().__init__()
        if vae is not None:  # frozen as vit5_sit.data.vae.load_vae leaves it: CPU convolutions of weights that
            vae.requires_grad_(False)  # need no grad round differently, and the images must be the same
        self.register_modules(transformer=transformer, scheduler=scheduler, vae=vae)
        self.register_to_config(guidance_scale=guidance_scale)

    @torch.no_grad()
    def __call__(self, class_labels: int | Sequence[int], *,
                 guidance_scale: float | None = None,             # 1 = none; None = the model's default
                 guidance_interval: tuple[float, float] = (0.0, 1.0),  # guide only for t in this range
                 num_inference_steps: int | None = None,          # fixed-step methods; None = the scheduler's
                 sampler: str | None = None,                      # 'ode' | 'sde'; None = the scheduler's
                 method: str | None = None,                       # 'euler', 'heun', 'dpm++2m', ...
                 num_images_per_prompt: int = 1,                  # images per class label, one after another
                 seed: int | Sequence[int] | None = None,         # first seed (image i: seed + i), or one each
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,  # draws the seeds
                 output_type: str | None = "pil",                 # 'pil' | 'np' | 'pt' | 'latent' (None = 'np')
                 batch_size: int = 64,                            # images per forward; does not change them
                 return_dict: bool = True,
                 ) -> Vit5SitPipelineOutput | tuple:
        """``num_images_per_prompt`` images per class label; ``return_dict=False``: (images, labels, seeds)."""
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type={output_type!r}: choose one of pil, np, pt, latent")
        if isinstance(num_images_per_prompt, bool) or not isinstance(num_images_per_prompt, numbers.Integral) \
                or num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt={num_images_per_prompt!r}: must be a whole number >= 1")
        model = self.transformer
        labels = [class_labels] if isinstance(class_labels, int | torch.Tensor) else list(class_labels)
        if not labels or any(isinstance(c, bool | str) for c in labels):
            raise ClassSpecError(f"class_labels={class_labels!r}: give class ids (ImageNet names need vit5-sit)")
        labels = [check_class_id(int(c), model.cfg.num_classes) for c in labels for _ in range(num_images_per_prompt)]
        seeds = draw_seeds(len(labels), seed, generator)
        scale = self.config.guidance_scale if guidance_scale is None else float(guidance_scale)
        check_guidance_settings(scale, guidance_interval, "guidance_scale", "guidance_interval")
        settings = self.scheduler.sampler_config(num_inference_steps, sampler, method)
        evals = steps_per_batch(settings)  # None: adaptive
        steps = settings.steps + (settings.mode == "sde" and settings.last_step != "none")
        batches = -(-len(labels) // batch_size)
        with self.progress_bar(total=steps * batches if evals else None) as bar:
            x = sample_images(model, self.scheduler.transport, settings, labels, seeds, cfg_scale=scale,
                              guidance_interval=tuple(guidance_interval), batch_size=batch_size,
                              vae=None if output_type == "latent" else self.vae, as_float=True,
                              device=self._execution_device,
                              on_step=lambda: bar.update(steps / evals if evals else 1))
        self.maybe_free_model_hooks()
        images = x if output_type == "latent" else convert_images(x, output_type)
        out = Vit5SitPipelineOutput(images, labels, seeds)
        return out if return_dict else out.to_tuple()
