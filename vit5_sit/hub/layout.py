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
Their names end in a hash of their text (``pipeline_vit5_sit_3f2a9c01d4.py``): diffusers imports a local folder's
code as ``diffusers_modules.local.<file stem>``, one module per name for the whole process, so two folders with
other code must not share a name (the names above are those of folders written before; they still load).
A model trained beside a guide (autoguidance, `vit5_sit.transport.AutoGuidance`) has a ``guide/`` folder laid out
as ``transformer/``; ``model_index.json`` names it, ``[null, null]`` when there is none.
"""

from __future__ import annotations

import json
from pathlib import Path

from vit5_sit.common.utils import atomic_write_text
from vit5_sit.config import ExperimentConfig

MODEL_INDEX = "model_index.json"
PIPELINE_MODULE = "pipeline_vit5_sit"
COMPONENTS = {  # folder -> (module file stem before its hash, class in vit5_sit.hub.components)
    "transformer": ("transformer_vit5_sit", "Vit5SitTransformer2DModel"),
    "scheduler": ("scheduling_vit5_sit", "Vit5SitScheduler"),
}
PIPELINE_CLASS = "Vit5SitDiffusersPipeline"
CODE_STEMS = {PIPELINE_CLASS: PIPELINE_MODULE, **{cls: stem for stem, cls in COMPONENTS.values()}}
CONFIG_FILES = {"transformer": "config.json", "scheduler": "scheduler_config.json"}
VAE_FOLDER = "vae"
GUIDE_FOLDER = "guide"  # autoguidance's guide: a second transformer, laid out as transformer/
HASH_CHARS = 10         # of the code's sha256 in its file name: distinct names for distinct code


def code_header(what: str) -> str:
    from vit5_sit import __version__

    return (f"# {what}, written by vit5-sit {__version__} when this model folder was exported: every definition\n"
            "# below is copied from the vit5_sit package's source (the module named above each group), so that\n"
            "# diffusers loads the folder without vit5-sit: DiffusionPipeline.from_pretrained(folder,\n"
            "# trust_remote_code=True). Not edited by hand: export the folder again to update it.")


def folder_code(class_name: str) -> tuple[str, str]:
    """(file stem, text) of the module a folder carries for ``class_name`` (`CODE_STEMS`), assembled from the
    package's source; the stem ends in a hash of the text. The pipeline's module also defines the components'
    classes and stands in for their modules (`COMPONENT_ALIASES`)."""
    import hashlib

    from vit5_sit.hub.remote_code import assemble

    source = "vit5_sit.hub.components"
    if class_name == PIPELINE_CLASS:
        stems = [folder_code(cls)[0] for _, cls in COMPONENTS.values()]
        roots = [(source, PIPELINE_CLASS), *((source, cls) for _, cls in COMPONENTS.values())]
        text = assemble(roots, code_header(f"{PIPELINE_CLASS}, the pipeline")) + COMPONENT_ALIASES.format(stems)
    else:
        text = assemble([(source, class_name)], code_header(class_name))
    return f"{CODE_STEMS[class_name]}_{hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]}", text


# The pipeline module's last lines: diffusers checks a component passed to from_pretrained (``scheduler=...``)
# against the module that model_index.json names for it, looked up in sys.modules; this module defines the same
# classes, so it stands in for those modules.
COMPONENT_ALIASES = """

# ---- the components' modules, for diffusers' from_pretrained(..., scheduler=...) -----------------------------
COMPONENT_MODULES = {!r}
for _name in COMPONENT_MODULES:
    __import__("sys").modules.setdefault(_name, __import__("sys").modules[__name__])
"""


def write_code(out: Path, guide: bool = False) -> dict[str, list[str]]:
    """The pipeline's and the components' modules (and the guide's, the transformer's code), assembled from the
    package's source; returns their ``model_index.json`` entries (``[file stem, class]``, by folder; "" is the
    pipeline's)."""
    entries = {}
    folders = {"": PIPELINE_CLASS, **{folder: cls for folder, (_, cls) in COMPONENTS.items()}}
    if guide:
        folders[GUIDE_FOLDER] = COMPONENTS["transformer"][1]
    for folder, cls in folders.items():
        stem, text = folder_code(cls)
        (out / folder).mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / folder / f"{stem}.py", text)
        entries[folder] = [stem, cls]
    return entries


def write_diffusers_layout(out: str | Path, cfg: ExperimentConfig, vae=None, guide_config=None) -> Path:
    """Everything of the layout but the weights (`vit5_sit.hub.api.write_model_folder` writes those):
    model_index.json, the components' configs, the code, and for a latent model its VAE (``vae``: a loaded
    ``AutoencoderKL``, a name or folder; None = the config's data.vae); with ``guide_config`` (the guide's
    `ModelConfig`) the guide's config and code in ``guide/``."""
    import dataclasses

    import diffusers

    from vit5_sit.transport.guidance import trained_guidance

    out = Path(out)
    version = diffusers.__version__
    latent = cfg.data.kind == "latents"
    configs = {"transformer": dataclasses.asdict(cfg.model_config()),
               "scheduler": {**dataclasses.asdict(cfg.transport), **dataclasses.asdict(cfg.sampler)}}
    if guide_config is not None:
        configs[GUIDE_FOLDER] = dataclasses.asdict(guide_config)
    for folder, values in configs.items():
        kind = "transformer" if folder == GUIDE_FOLDER else folder
        config = {"_class_name": COMPONENTS[kind][1], "_diffusers_version": version, **values}
        (out / folder).mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / folder / CONFIG_FILES[kind], json.dumps(config, indent=2) + "\n")
    code = write_code(out, guide=guide_config is not None)
    index = {"_class_name": code[""], "_diffusers_version": version,
             "guidance_scale": float(cfg.log.sample_cfg_scale),
             "guidance_interval": [float(v) for v in cfg.log.sample_guidance_interval],
             "trained_guidance": trained_guidance(cfg),  # a MeanFlow model's: it takes no second guidance
             **{folder: code[folder] for folder in COMPONENTS},
             VAE_FOLDER: ["diffusers", "AutoencoderKL"] if latent else [None, None],
             GUIDE_FOLDER: code.get(GUIDE_FOLDER, [None, None])}
    if latent:
        from vit5_sit.data.vae import load_vae

        if vae is None or isinstance(vae, str | Path):
            vae = load_vae(str(vae or cfg.data.vae))
        vae.save_pretrained(str(out / VAE_FOLDER), safe_serialization=True)
    atomic_write_text(out / MODEL_INDEX, json.dumps(index, indent=2) + "\n")  # last: the folder is complete
    return out
