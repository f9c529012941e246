"""`Vit5SitPipeline`: class-conditional generation from Python, in the shape of diffusers' `DiTPipeline`.

    from vit5_sit.pipeline import Vit5SitPipeline

    pipe = Vit5SitPipeline.from_pretrained()                     # the bundled demo (MNIST digits)
    images = pipe(class_labels=[3, 7], seed=0).images             # two PIL images
    pipe = Vit5SitPipeline.from_pretrained("me/vit5-xl2-in256")   # a Hub repo, run or model folder
    out = pipe(class_labels=[207, "goldfish"], guidance_scale=4.0, num_inference_steps=50, sampler="sde",
               generator=torch.Generator().manual_seed(0), output_type="np")
    images = pipe([3, 7], num_images_per_prompt=2, return_dict=False,            # diffusers' conventions:
                  generator=[torch.Generator().manual_seed(i) for i in range(4)])[0]  # one generator per image

A plain class, not a diffusers ``DiffusionPipeline``: that base class expects ``ModelMixin`` / ``ConfigMixin``
components stored as ``model_index.json`` + per-component ``config.json`` folders, and a scheduler with a
``step()`` loop. Our model folder is one ``config.yaml`` + ``ema.safetensors`` that ``sample.py``, training and
evaluation all read, and our samplers (SiT's ODE / SDE solvers, adaptive dopri5 included) are whole
functions of (model, noise), not per-step schedulers; fitting both into diffusers' shapes would mean a
second weight layout and a scheduler that only wraps them. The call shape follows `DiTPipeline`.

Sampling is `vit5_sit.sampling.generate.sample_images`, the function behind ``sample.py``: image i has seed
``seed + i`` (one generator per sample), so for the same seeds and settings the pipeline gives exactly the
images of ``sample.py``, whatever the batch size.

As in diffusers: ``generator`` is a torch.Generator or a list of them, one per image; ``return_dict=False``
returns a tuple and the output reads as a tuple too (``out[0]`` is the images); ``num_images_per_prompt``
images per class label; a tqdm bar over sampler steps (``set_progress_bar_config``). Deliberately not:

- class ids or ImageNet names (``class_labels``), not text prompts: these are class-conditional models.
- seeds, not noise, come from a generator: each image's seed is drawn from it and its noise from that seed,
  so every image is reproducible on its own (``out.seeds``; ``seed=out.seeds`` redraws them) and the
  same seed gives ``sample.py``'s image. The noise is not ``torch.randn(..., generator=generator)``, so the
  images differ from what diffusers' sampling would draw from the same generator state.
- the output also carries ``class_labels`` and ``seeds``: the tuple is ``(images, class_labels, seeds)``,
  where ``DiTPipeline``'s is ``(images,)``; ``out[0]`` / ``tuple[0]`` are the images in both.
- our samplers are whole functions of the noise (``sampler`` / ``method``, e.g. ``method="dpm++2m"``), not
  scheduler objects; ``scheduler=`` takes a diffusers flow scheduler instead (``FlowMatchEulerDiscreteScheduler``,
  or ``DPMSolverMultistepScheduler`` / ``UniPCMultistepScheduler`` with ``use_flow_sigmas=True,
  prediction_type="flow_prediction"``; linear-path models only), driven through
  `vit5_sit.transport.diffusers_schedulers` (their sigma = 1 - t, their model output = -velocity).
  No ``callback_on_step_end`` with latents: ``on_step(done, total)`` reports each network evaluation, and
  ``max_nfe`` bounds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from vit5_sit.common.classes import IMAGENET_NUM_CLASSES, imagenet_name, parse_classes
from vit5_sit.config import ExperimentConfig
from vit5_sit.models import Denoiser
from vit5_sit.sampling.call import (  # the call both doors share; these names are also this module's API
    MAX_SEED,
    OUTPUT_TYPES,
    PIPELINE_ARGS,
    NFELimitError,
    Vit5SitPipelineOutput,
    convert_images,
    draw_seeds,
    label_ids,
    plan_call,
    require_accelerate,
    run_call,
)
from vit5_sit.transport import Transport, check_guide
from vit5_sit.transport.guidance import trained_guidance
from vit5_sit.transport.samplers import SamplerConfig

__all__ = ["MAX_SEED", "OUTPUT_TYPES", "PIPELINE_ARGS", "NFELimitError", "Vit5SitPipeline", "Vit5SitPipelineOutput",
           "convert_images", "draw_seeds"]


class Vit5SitPipeline:
    """A trained model, its config and (latent models) the VAE; call it to generate images."""

    def __init__(self, model: Denoiser, config: ExperimentConfig, vae=None, metrics: list[dict] | None = None,
                 scheduler=None, guide: Denoiser | None = None):
        self.model = model.eval()
        self.config = config
        if guide is not None:  # autoguidance: guidance_scale weighs the model against this bad version of it
            check_guide(model.cfg, guide.cfg)
            guide = guide.eval()
        self.guide = guide
        self.metrics = list(metrics or [])  # measured metrics, carried into save_pretrained's model card
        self.transport = Transport(config.transport)
        self._scheduler = None            # a diffusers flow scheduler, or None: ours (see `scheduler`)
        self.scheduler = scheduler
        self.latent = config.data.kind == "latents"
        self._vae = vae                   # None until first needed: a name/path, or a loaded AutoencoderKL
        self._vae_dtype = torch.float32   # the dtype a VAE loaded on first use gets (pipe.to(dtype) sets it)
        self._offload: torch.device | None = None  # enable_model_cpu_offload's device
        self._progress = {"disable": False}

    # -- loading ---------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, repo_id_or_path: str | Path | None = None, *,
                        revision: str | None = None,          # branch, tag or commit of a Hub repo
                        cache_dir: str | Path | None = None,  # None = the Hugging Face cache
                        token: str | None = None,
                        vae=None,                             # latent models: None = the folder's vae/,
                                                              # else the config's data.vae
                        device: torch.device | str = "cpu",
                        scheduler=None,                       # a diffusers flow scheduler; None = ours
                        torch_dtype: torch.dtype | None = None,  # the weights' dtype; None = float32
                        dtype: torch.dtype | None = None,     # the same (diffusers' newer name)
                        guide: str | Path | Denoiser | None = None,  # autoguidance's guide: a model (folder,
                                                              # run, checkpoint, Hub id); None = the folder's guide/
                        ) -> Vit5SitPipeline:
        """From a Hub repo id, a model folder, a run folder (newest valid checkpoint) or a checkpoint folder;
        None = the bundled demo model. ``torch_dtype=torch.bfloat16`` runs the network in bfloat16 (the solvers
        stay float32)."""
        from vit5_sit.hub.api import PretrainedModel

        if torch_dtype is not None and dtype is not None and torch_dtype != dtype:
            raise ValueError(f"torch_dtype={torch_dtype} and dtype={dtype}: give one of them")
        loaded = PretrainedModel.from_pretrained(repo_id_or_path, revision=revision, cache_dir=cache_dir,
                                                 token=token, device=device)
        if vae is None and loaded.folder is not None and (loaded.folder / "vae" / "config.json").is_file():
            vae = loaded.folder / "vae"  # the VAE the model folder carries (diffusers' layout)
        if guide is None and loaded.folder is not None and (loaded.folder / "guide" / "config.json").is_file():
            guide = loaded.folder / "guide"  # the guide the model folder carries
        if guide is not None:
            from vit5_sit.hub.guide import load_guide

            guide = load_guide(guide, loaded.config, revision=revision, cache_dir=cache_dir, token=token,
                               device=device)
        pipe = cls(loaded.model, loaded.config, vae=vae, metrics=loaded.metrics, scheduler=scheduler, guide=guide)
        return pipe.to(dtype=torch_dtype or dtype) if (torch_dtype or dtype) else pipe

    def _pretrained(self):
        from vit5_sit.hub.api import PretrainedModel

        return PretrainedModel(self.model, self.config, self.metrics)

    def save_pretrained(self, save_directory: str | Path, **kwargs) -> Path:
        """The model folder (`vit5_sit.hub.api.PretrainedModel.save_pretrained`), diffusers' layout included; a
        latent model's folder gets this pipeline's VAE, and a pipeline with a guide its ``guide/``. The folder's
        ``scheduler/`` is the model's own sampler (our scheduler with the settings it was given); a diffusers
        scheduler set on the pipeline is a sampling choice, not saved: a warning says so."""
        if self._scheduler is not None:
            import warnings

            warnings.warn(f"save_pretrained: pipe.scheduler ({type(self._scheduler).__name__}) is not saved; the "
                          "folder keeps the model's own sampler (scheduler/): set the scheduler again after loading",
                          stacklevel=2)
        if self.latent and "vae" not in kwargs:
            kwargs["vae"] = self._vae
        return self._pretrained().save_pretrained(save_directory, guide=self.guide, **kwargs)

    def push_to_hub(self, repo_id: str, **kwargs) -> str:
        """Upload the model folder to a Hub model repo (`vit5_sit.hub.api.PretrainedModel.push_to_hub`)."""
        return self._pretrained().push_to_hub(repo_id, **kwargs)

    def to(self, *args, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
           ) -> Vit5SitPipeline:
        """As diffusers' ``pipe.to``: ``to("cuda")``, ``to(torch.bfloat16)``, ``to("cuda", torch.float16)``,
        ``to(device=..., dtype=...)``. The dtype is the network's (and the VAE's); the solvers stay float32."""
        for arg in args:
            if isinstance(arg, torch.dtype):
                dtype = arg
            elif isinstance(arg, str | torch.device | int):
                device = arg
            else:
                raise TypeError(f"to({arg!r}): give a device, a torch.dtype, or both")
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype}: the weights need a floating-point dtype (torch.float32, bfloat16, ...)")
        self._offload = None  # an explicit placement ends enable_model_cpu_offload
        for module in (self.model, self.guide, self._vae):
            if module is not None and not isinstance(module, str | Path):
                module.to(device=device, dtype=dtype)
        if dtype is not None:
            self._vae_dtype = dtype
        return self

    @property
    def device(self) -> torch.device:
        """Where the pipeline computes: the network's device (with CPU offload, the device it runs on)."""
        return self._offload if self._offload is not None else next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The network's weights' dtype."""
        return next(self.model.parameters()).dtype

    @property
    def transformer(self) -> Denoiser:
        """The network, under diffusers' name for it (``pipe.model`` is the same object)."""
        return self.model

    @property
    def scheduler(self):
        """As in diffusers: a diffusers flow scheduler if one was set (``scheduler=`` or ``pipe.scheduler = ...``),
        else ours, `vit5_sit.hub.components.Vit5SitScheduler` (the config's transport and sampler, as a model
        folder's ``scheduler/`` holds them), so ``OtherScheduler.from_config(pipe.scheduler.config, ...)`` works."""
        if self._scheduler is not None:
            return self._scheduler
        from vit5_sit.hub.components import Vit5SitScheduler

        own = getattr(self, "_own_scheduler", None)  # one object while the sampler stays (set_timesteps' state)
        if own is None or dataclasses.asdict(own.sampler) != dataclasses.asdict(self.config.sampler):
            own = self._own_scheduler = Vit5SitScheduler(**dataclasses.asdict(self.config.transport),
                                                         **dataclasses.asdict(self.config.sampler))
        return own

    @scheduler.setter
    def scheduler(self, scheduler) -> None:
        """A diffusers flow scheduler (checked against the model's transport), or ours / None: the config's sampler
        (ours with other sampler settings makes them the config's: a later `save_pretrained` keeps them)."""
        if scheduler is None:
            self._scheduler = None
        elif hasattr(scheduler, "transport") and hasattr(scheduler, "sampler_config"):  # ours (package or folder)
            if dataclasses.asdict(scheduler.transport.cfg) != dataclasses.asdict(self.config.transport):
                raise ValueError(f"this Vit5SitScheduler's transport ({scheduler.transport.cfg}) is not the one the "
                                 f"model was trained with ({self.config.transport}): build it from this model's "
                                 "folder or from pipe.scheduler.config")
            self.config = dataclasses.replace(self.config, sampler=SamplerConfig(**dataclasses.asdict(
                scheduler.sampler)))
            self._scheduler = None
        else:
            from vit5_sit.transport.diffusers_schedulers import check_scheduler

            check_scheduler(scheduler, self.transport)
            self._scheduler = scheduler

    @property
    def components(self) -> dict:
        """As in diffusers: the parts by name (``transformer``, ``scheduler``: a diffusers flow scheduler or ours,
        ``vae``: None for pixel models, ``guide``: autoguidance's guide or None)."""
        return {"transformer": self.model, "scheduler": self.scheduler, "vae": self.vae, "guide": self.guide}

    def enable_model_cpu_offload(self, gpu_id: int | None = None, device: torch.device | str = "cuda") -> None:
        """As diffusers': the weights wait on the CPU and each model moves to ``device`` when it runs (the network,
        then the VAE), through accelerate's ``cpu_offload_with_hook``; ``pipe.to(...)`` ends it."""
        require_accelerate("enable_model_cpu_offload")
        from accelerate import cpu_offload_with_hook

        device = torch.device(device)
        if gpu_id is not None:
            device = torch.device(device.type, gpu_id)
        self.to("cpu")
        hook = None
        for module in (self.model, self.guide, self.vae):
            if module is not None:
                _, hook = cpu_offload_with_hook(module, device, prev_module_hook=hook)
        self._offload = device

    @property
    def vae(self):
        """The VAE of a latent model, loaded on first use (`vit5_sit.data.vae.load_vae`); None for pixels."""
        if not self.latent:
            return None
        if self._vae is None or isinstance(self._vae, str | Path):
            from vit5_sit.data.vae import load_vae

            self._vae = load_vae(str(self._vae or self.config.data.vae), device=self.device,
                                 dtype=self._vae_dtype)
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
        """Class ids from ids and (ImageNet) names, as ``sample.py --classes`` reads them (`label_ids`)."""
        return label_ids(labels, self.model.cfg.num_classes, parse_classes)

    # -- progress bar (as in diffusers) ----------------------------------------------------------------
    def set_progress_bar_config(self, **kwargs) -> None:
        """tqdm options for the bar of each call, e.g. ``disable=True``."""
        self._progress = {**self._progress, **kwargs}

    def progress_bar(self, iterable=None, total: float | None = None, **kwargs):
        """As diffusers': a tqdm bar over ``iterable``, or one of ``total`` sampler steps (None: counted, not known
        ahead: adaptive solvers), with the options of `set_progress_bar_config`."""
        from tqdm.auto import tqdm

        from vit5_sit.sampling.generate import BAR_FORMAT

        options = {"unit": "step", "desc": "sampling", "dynamic_ncols": True,
                   "bar_format": BAR_FORMAT if total and iterable is None else None, **kwargs}
        return tqdm(iterable, total=total, **{**options, **self._progress})

    # -- generation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, class_labels: int | str | Sequence[int | str], *,
                 guidance_scale: float | None = None,             # 1 = none; None = the config's grid scale
                 guidance_interval: tuple[float, float] | None = None,  # guide only for t in this range; None =
                                                                  # the config's (log.sample_guidance_interval)
                 num_inference_steps: int | None = None,          # fixed-step methods; None = the config's
                 sampler: str | None = None,                      # 'ode' | 'sde' | 'meanflow'; None = the config's
                 method: str | None = None,                       # 'euler', 'heun', 'dopri5', ...
                 num_images_per_prompt: int = 1,                  # images per class label, one after another
                 seed: int | Sequence[int] | None = None,         # first seed (image i: seed + i), or one each
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,  # draws the seeds; a
                                                                  # list: one generator per image
                 output_type: str | None = "pil",                 # 'pil' | 'np' | 'pt' | 'latent'; None = 'np'
                 batch_size: int = 64,                            # images per forward; does not change them
                 max_nfe: int | None = None,                      # network evaluations a batch may take
                 on_step: Callable[[int, int | None], None] | None = None,  # after each network evaluation
                 return_dict: bool = True,
                 ) -> Vit5SitPipelineOutput | tuple:
        """``num_images_per_prompt`` images per class label (label a's, then b's, ...).

        Seeds: ``seed`` as in ``sample.py`` (image i has seed + i), else drawn from ``generator`` (a list:
        image i's seed from generator i), else from torch's global RNG; the output's ``seeds`` has them.
        ``max_nfe``: a fixed-step method that needs more network evaluations per batch is refused before
        sampling, an adaptive one (dopri5) that takes more is stopped (NFELimitError); None = no bound of
        its own (an adaptive solver stops at MAX_NFE, `vit5_sit.common.contract`, with a SolverError).
        ``on_step(done, total)``: called after each network evaluation with the evaluations done so far
        over all batches and their total (None for adaptive solvers, whose count is not known ahead);
        an exception raised there stops sampling. ``return_dict=False``: ``(images, class_labels, seeds)``.
        """
        plan = plan_call(locals(), num_classes=self.model.cfg.num_classes,
                         default_scale=self.config.log.sample_cfg_scale,
                         default_interval=self.config.log.sample_guidance_interval, sampler=self.config.sampler,
                         scheduler=self._scheduler, parse_name=parse_classes,
                         trained_guidance=trained_guidance(self.config), guide=self.guide)
        return run_call(plan, self.model, self.transport, progress_bar=self.progress_bar,
                        vae=None if output_type == "latent" else self.vae, device=self.device,
                        scheduler=self._scheduler, guide=self.guide)
