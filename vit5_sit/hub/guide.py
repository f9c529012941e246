"""Autoguidance's guide in a model folder: ``guide/config.json`` + ``guide/diffusion_pytorch_model.safetensors``, laid
out as ``transformer/`` (a `Vit5SitTransformer2DModel` that diffusers loads without this package), written beside the
model and read back by `Vit5SitPipeline.from_pretrained`; and a guide given by the user (a model folder, a run, a
checkpoint or a Hub id), checked against the model it guides (`vit5_sit.transport.check_guide`: data shape,
classes, kind, transport) before anything is sampled.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from vit5_sit.config import ExperimentConfig
from vit5_sit.hub.layout import GUIDE_FOLDER
from vit5_sit.models import Denoiser
from vit5_sit.models.config import ModelConfig
from vit5_sit.transport import check_guide

GUIDE_WEIGHTS = f"{GUIDE_FOLDER}/diffusion_pytorch_model.safetensors"
GUIDE_CONFIG = f"{GUIDE_FOLDER}/config.json"


def write_guide(out: str | Path, guide: Denoiser | None, dtype: torch.dtype | None = None) -> None:
    """The guide's weights (with the record of its `ModelConfig` in their metadata, as the transformer's); its
    config.json and code come with diffusers' layout (`vit5_sit.hub.layout.write_diffusers_layout`). None: a
    folder written again loses the guide it had."""
    from safetensors.torch import save

    from vit5_sit.common.checks import tensors_problem
    from vit5_sit.common.utils import atomic_write_bytes
    from vit5_sit.hub.agreement import weights_metadata
    from vit5_sit.hub.model_files import ModelLoadError

    out = Path(out)
    if guide is None:
        shutil.rmtree(out / GUIDE_FOLDER, ignore_errors=True)
        return
    tensors = {k: (v.to(dtype) if dtype is not None else v).detach().cpu().contiguous()
               for k, v in guide.state_dict().items()}
    problem = tensors_problem(tensors)
    if problem:
        raise ModelLoadError(f"the guide: {problem}; give a guide with finite weights")
    (out / GUIDE_FOLDER).mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / GUIDE_WEIGHTS, save(tensors, metadata=weights_metadata(guide.cfg)))


def is_guide_folder(path: Path) -> bool:
    """A folder laid out as a model folder's ``guide/`` (config.json + weights, no config.yaml)."""
    return (path / "config.json").is_file() and (path / "diffusion_pytorch_model.safetensors").is_file() \
        and not (path / "config.yaml").is_file()


def load_guide_folder(folder: str | Path, device: torch.device | str = "cpu") -> Denoiser:
    """A model folder's ``guide/`` as a `Denoiser`, checked as diffusers' loading of the folder checks it (config.json
    against the weights' record, keys and shapes, NaN / inf: `vit5_sit.hub.agreement`)."""
    from safetensors.torch import load_file

    from vit5_sit.hub.agreement import check_loaded, check_transformer_files, effective_fields, read_json

    folder = Path(folder)
    weights = folder / "diffusion_pytorch_model.safetensors"
    config = read_json(folder / "config.json")
    check_transformer_files(config, weights, str(folder))
    model = Denoiser(ModelConfig(**effective_fields(config)))
    model.load_state_dict(load_file(str(weights)), strict=True)
    check_loaded(model, model.cfg, weights, str(folder))
    return model.to(device).eval()


def load_guide(spec: str | Path | Denoiser, main: ExperimentConfig, *, device: torch.device | str = "cpu",
               revision: str | None = None, cache_dir: str | Path | None = None, token: str | None = None,
               ) -> Denoiser:
    """The guide of a model of config ``main``: a `Denoiser`, a ``guide/`` folder, or anything
    `PretrainedModel.from_pretrained` reads (a model, run or checkpoint folder, a Hub id); one GuidanceError naming
    the first difference from the model (data shape, classes, kind, transport) before any sampling."""
    transport = None
    if isinstance(spec, Denoiser):
        guide = spec
    elif Path(spec).is_dir() and is_guide_folder(Path(spec)):
        guide = load_guide_folder(spec, device)
    else:
        from vit5_sit.hub.api import PretrainedModel

        loaded = PretrainedModel.from_pretrained(spec, revision=revision, cache_dir=cache_dir, token=token,
                                                 device=device)
        guide, transport = loaded.model, loaded.config.transport
    check_guide(main.model_config(), guide.cfg, main.transport, transport)
    return guide.eval()
