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
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin, SchedulerMixin
from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerOutput

from vit5_sit.hub.agreement import check_loaded, check_transformer_files, read_json, transformer_files
from vit5_sit.models.config import ModelConfig
from vit5_sit.models.denoiser import Denoiser
from vit5_sit.sampling.call import plan_call, require_accelerate, run_call
from vit5_sit.sampling.generate import sampler_settings
from vit5_sit.transport.guidance import check_guidance_settings
from vit5_sit.transport.samplers import SamplerConfig, steps_grid
from vit5_sit.transport.transport import Transport, TransportConfig


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

    ``pipe(class_labels, guidance_scale=None, num_inference_steps=None, seed=None, generator=None, ...)``: the call
    of `vit5_sit.pipeline.Vit5SitPipeline` (`vit5_sit.sampling.call`: the same contract, checks and images; class
    ids only, since ImageNet names need the package). ``guidance_scale`` and ``guidance_interval`` None = the
    model's (``model_index.json``).
    With a ``guide`` component (a second transformer: a bad version of the model), guidance_scale weighs the model
    against it (autoguidance) instead of against its unconditional output. ``pipe.scheduler`` may be swapped for a
    diffusers flow scheduler (``FlowMatchEulerDiscreteScheduler``, ``DPMSolverMultistepScheduler`` in its flow
    mode), at load (``scheduler=``) too: our scheduler's transport and default steps then serve it.
    ``save_pretrained`` writes a folder that loads again (its code files and ``model_index.json`` included)."""

    model_cpu_offload_seq = "transformer->guide->vae"
    _optional_components = ["vae", "guide"]

    def __init__(self, transformer: ModelMixin, scheduler: SchedulerMixin, vae: ModelMixin | None = None,
                 guide: ModelMixin | None = None, guidance_scale: float = 1.0, trained_guidance: float = 1.0,
                 sampling: dict | None = None, guidance_interval: Sequence[float] = (0.0, 1.0)) -> None:
        super().__init__()
        for module in (vae, guide):  # frozen as our loaders leave them: CPU convolutions of weights that need no
            if module is not None:   # grad round differently, and the images must be the same
                module.requires_grad_(False)
        self.register_modules(transformer=transformer, scheduler=scheduler, vae=vae, guide=guide)
        check_guidance_settings(guidance_scale, guidance_interval, "model_index.json guidance_scale",
                                "model_index.json guidance_interval")  # a folder edited by hand: refused at load
        self.register_to_config(guidance_scale=guidance_scale, guidance_interval=[float(v) for v in guidance_interval],
                                trained_guidance=trained_guidance)
        if sampling is not None:  # our scheduler's config, kept when a diffusers scheduler replaced it
            self.register_to_config(sampling=sampling)

    def __setattr__(self, name, value) -> None:
        current = self.__dict__.get(name)
        if name == "scheduler" and _is_own_scheduler(current) and not _is_own_scheduler(value):
            self.__dict__["_own_scheduler"] = current  # its transport and default steps serve the new one
        super().__setattr__(name, value)

    def own_scheduler(self):
        """Our scheduler (`Vit5SitScheduler`): ``pipe.scheduler``, or the one a diffusers scheduler replaced (after
        loading, or at load with ``scheduler=``: read from the folder's ``scheduler/``, or from the ``sampling``
        that ``save_pretrained`` recorded beside another scheduler)."""
        for candidate in (self.scheduler, self.__dict__.get("_own_scheduler")):
            if _is_own_scheduler(candidate):
                return candidate
        config = self.config.get("sampling")
        folder = self.config.get("_name_or_path")
        if config is None and folder:
            try:
                config = Vit5SitScheduler.load_config(folder, subfolder="scheduler")
            except (OSError, ValueError):
                config = None
            if config is not None and config.get("_class_name") != Vit5SitScheduler.__name__:
                config = None
        if config is None:
            raise ValueError(f"pipe.scheduler is {type(self.scheduler).__name__}, and this pipeline does not know "
                             "its model's transport and default sampler (Vit5SitScheduler): load the model folder "
                             "with its own scheduler, then set pipe.scheduler")
        self.__dict__["_own_scheduler"] = Vit5SitScheduler.from_config(config)
        return self.__dict__["_own_scheduler"]

    def progress_bar(self, iterable=None, total=None):
        """diffusers' bar; for adaptive solvers (``total`` None: their number of steps is not known ahead) a bar
        that counts network evaluations."""
        if iterable is None and total is None:
            from tqdm.auto import tqdm

            return tqdm(total=None, unit="eval", **getattr(self, "_progress_bar_config", {}))
        return super().progress_bar(iterable=iterable, total=total)

    def enable_model_cpu_offload(self, *args, **kwargs) -> None:
        """diffusers' CPU offload, which needs accelerate: without it, one ImportError naming the install."""
        require_accelerate("enable_model_cpu_offload")
        return super().enable_model_cpu_offload(*args, **kwargs)

    def save_pretrained(self, save_directory, **kwargs) -> None:
        """diffusers' save, then what makes the folder load again with ``trust_remote_code=True``: the code files of
        the pipeline and of our components, named in ``model_index.json``."""
        if not _is_own_scheduler(self.scheduler):  # keep our scheduler's config beside the diffusers one
            own = self.own_scheduler()
            self.register_to_config(sampling={k: v for k, v in own.config.items() if not k.startswith("_")})
        super().save_pretrained(save_directory, **kwargs)
        write_own_code(self, save_directory)

    @torch.no_grad()
    def __call__(self, class_labels: int | Sequence[int], *,
                 guidance_scale: float | None = None,             # 1 = none; None = the model's default
                 guidance_interval: tuple[float, float] | None = None,  # guide only for t in this range; None =
                                                                  # the model's (model_index.json)
                 num_inference_steps: int | None = None,          # fixed-step methods; None = the scheduler's
                 sampler: str | None = None,                      # 'ode' | 'sde'; None = the scheduler's
                 method: str | None = None,                       # 'euler', 'heun', 'dpm++2m', 'dopri5', ...
                 num_images_per_prompt: int = 1,                  # images per class label, one after another
                 seed: int | Sequence[int] | None = None,         # first seed (image i: seed + i), or one each
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,  # draws the seeds
                 output_type: str | None = "pil",                 # 'pil' | 'np' | 'pt' | 'latent' (None = 'np')
                 batch_size: int = 64,                            # images per forward; does not change them
                 max_nfe: int | None = None,                      # network evaluations a batch may take
                 on_step=None,                                    # (done, total) after each network evaluation
                 return_dict: bool = True,
                 ):
        """``num_images_per_prompt`` images per class label; ``return_dict=False``: (images, labels, seeds)."""
        arguments = dict(locals())
        own = self.own_scheduler()
        other = None if self.scheduler is own else self.scheduler  # a diffusers flow scheduler
        plan = plan_call(arguments, num_classes=self.transformer.cfg.num_classes,
                         default_scale=self.config.guidance_scale,
                         default_interval=self.config.guidance_interval, sampler=own.sampler,
                         scheduler=other,
                         trained_guidance=self.config.trained_guidance, guide=self.guide)
        out = run_call(plan, self.transformer, own.transport, progress_bar=self.progress_bar, vae=self.vae,
                       device=self._execution_device, scheduler=other, guide=self.guide)
        self.maybe_free_model_hooks()
        return out


def _is_own_scheduler(scheduler) -> bool:
    """Our scheduler (`Vit5SitScheduler`, from this package or a folder's copy): it holds a transport and a sampler."""
    return hasattr(scheduler, "transport") and hasattr(scheduler, "sampler_config")


def code_file(obj) -> tuple[str, str] | None:
    """(file stem, source) of the module that defines ``obj``'s class, if it is vit5-sit code (a model folder's
    module, or in the package the module a folder gets: `vit5_sit.hub.layout.folder_code`); None otherwise."""
    cls = type(obj)
    if cls.__module__.split(".")[0] == "vit5_sit":  # the package: the code a folder gets for this class
        return importlib.import_module("vit5_sit.hub.layout").folder_code(cls.__name__)
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if path is None or not path.endswith(".py"):
        return None
    text = Path(path).read_text(encoding="utf-8")
    return (Path(path).stem, text) if text.startswith("# ") and "written by vit5-sit" in text.splitlines()[0] \
        else None


def write_own_code(pipe, save_directory) -> None:
    """The code files of a saved pipeline and of its vit5-sit components (a folder beside each), and
    ``model_index.json`` naming them as diffusers' remote-code loading reads them: ``[file stem, class]``."""
    out = Path(save_directory)
    index = json.loads((out / "model_index.json").read_text(encoding="utf-8"))
    for name, obj in (("", pipe), *((k, v) for k, v in pipe.components.items() if v is not None)):
        code = code_file(obj)
        if code is None:
            continue
        stem, text = code
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / f"{stem}.py").write_text(text, encoding="utf-8")
        index["_class_name" if not name else name] = [stem, type(obj).__name__]
    index.pop("_name_or_path", None)  # a local path is no part of a folder
    (out / "model_index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
