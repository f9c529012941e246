"""diffusers' layout inside a model folder, beside the files vit5-sit reads: one folder, two ways to load it.

    config.yaml                                        the run's config (vit5-sit: sample.py, the pipeline, eval)
    README.md, metrics.json, samples.png               the card, its metrics, its sample grid
    model_index.json                                   diffusers: the pipeline class and its components
    pipeline_vit5_sit.py                               the pipeline's code (Vit5SitDiffusersPipeline)
    transformer/config.json                            the denoiser's ModelConfig fields
    transformer/diffusion_pytorch_model.safetensors    the EMA weights: the folder's only weights, read by both
    transformer/transformer_vit5_sit.py                the denoiser's code (Vit5SitTransformer2DModel)
    scheduler/scheduler_config.json                    the transport and the default sampler
    scheduler/scheduling_vit5_sit.py                   the sampler's code (Vit5SitScheduler)
    vae/config.json, vae/diffusion_pytorch_model.safetensors   latent models: the VAE of data.vae

The three ``.py`` files are assembled from the package's source when the folder is written
(`vit5_sit.hub.remote_code`, from the classes of `vit5_sit.hub.components`), so they cannot drift from it; with
them ``DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`` works where vit5-sit is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

from vit5_sit.common.utils import atomic_write_text
from vit5_sit.config import ExperimentConfig

MODEL_INDEX = "model_index.json"
PIPELINE_MODULE = "pipeline_vit5_sit"
COMPONENTS = {  # folder -> (module file stem, class in vit5_sit.hub.components)
    "transformer": ("transformer_vit5_sit", "Vit5SitTransformer2DModel"),
    "scheduler": ("scheduling_vit5_sit", "Vit5SitScheduler"),
}
PIPELINE_CLASS = "Vit5SitDiffusersPipeline"
CONFIG_FILES = {"transformer": "config.json", "scheduler": "scheduler_config.json"}
VAE_FOLDER = "vae"


def code_header(what: str) -> str:
    from vit5_sit import __version__

    return (f"# {what}, written by vit5-sit {__version__} when this model folder was exported: every definition\n"
            "# below is copied from the vit5_sit package's source (the module named above each group), so that\n"
            "# diffusers loads the folder without vit5-sit: DiffusionPipeline.from_pretrained(folder,\n"
            "# trust_remote_code=True). Not edited by hand: export the folder again to update it.")


def write_code(out: Path) -> None:
    """The pipeline's and the components' modules, assembled from the package's source."""
    from vit5_sit.hub.remote_code import assemble

    source = "vit5_sit.hub.components"
    atomic_write_text(out / f"{PIPELINE_MODULE}.py",
                      assemble([(source, PIPELINE_CLASS)], code_header(f"{PIPELINE_CLASS}, the pipeline")))
    for folder, (module, cls) in COMPONENTS.items():
        atomic_write_text(out / folder / f"{module}.py", assemble([(source, cls)], code_header(f"{cls}")))


def write_diffusers_layout(out: str | Path, cfg: ExperimentConfig, vae=None) -> Path:
    """Everything of the layout but the weights (`vit5_sit.hub.api.write_model_folder` writes those):
    model_index.json, the components' configs, the code, and for a latent model its VAE (``vae``: a loaded
    ``AutoencoderKL``, a name or folder; None = the config's data.vae)."""
    import dataclasses

    import diffusers

    out = Path(out)
    version = diffusers.__version__
    latent = cfg.data.kind == "latents"
    index = {"_class_name": [PIPELINE_MODULE, PIPELINE_CLASS], "_diffusers_version": version,
             "guidance_scale": float(cfg.log.sample_cfg_scale),
             **{folder: list(spec) for folder, spec in COMPONENTS.items()},
             VAE_FOLDER: ["diffusers", "AutoencoderKL"] if latent else [None, None]}
    configs = {"transformer": dataclasses.asdict(cfg.model_config()),
               "scheduler": {**dataclasses.asdict(cfg.transport), **dataclasses.asdict(cfg.sampler)}}
    for folder, values in configs.items():
        config = {"_class_name": COMPONENTS[folder][1], "_diffusers_version": version, **values}
        (out / folder).mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / folder / CONFIG_FILES[folder], json.dumps(config, indent=2) + "\n")
    write_code(out)
    if latent:
        from vit5_sit.data.vae import load_vae

        if vae is None or isinstance(vae, str | Path):
            vae = load_vae(str(vae or cfg.data.vae))
        vae.save_pretrained(str(out / VAE_FOLDER), safe_serialization=True)
    atomic_write_text(out / MODEL_INDEX, json.dumps(index, indent=2) + "\n")  # last: the folder is complete
    return out
