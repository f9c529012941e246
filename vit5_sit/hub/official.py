"""Official SiT checkpoints (``SiT-XL-2-256x256.pt``) as model folders, the layout every model of ours travels in.

    python -m vit5_sit.demo export SiT-XL-2-256x256.pt --out sit-xl2-256 --no-samples
    python -m vit5_sit.demo export SiT-XL-2-256x256.pt --out sit-xl2-256 --preset SiT-XL/2 --image-size 256 \\
        --vae stabilityai/sd-vae-ft-ema

An official file holds a raw state dict and nothing else: which model it is (``--preset``), its resolution
(``--image-size``) and the VAE its latents decode with (``--vae``) are given when it is converted, as when
``sample.py`` samples it. The folder's ``config.yaml`` is then SiT's ImageNet-256 recipe
(``configs/imagenet256/sit-xl2.yaml``) around that model: latent data, SiT's best sampler (SDE Euler, 250 steps)
and the grid guidance of SiT's sample.py (4.0). The weights are kept in float32, so the folder samples what the
file samples (the same images for the same seeds); ``vae/`` holds the VAE, so the folder needs no download.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vit5_sit.common.classes import DEFAULT_IMAGENET_CLASSES
from vit5_sit.config import LATENT_DOWNSAMPLE, DataConfig, ExperimentConfig, LogConfig, ModelSection, TrainConfig
from vit5_sit.models.config import ModelConfig
from vit5_sit.models.presets import PRESETS
from vit5_sit.transport import SamplerConfig

OFFICIAL_SAMPLER = SamplerConfig(mode="sde", method="euler", steps=250)  # SiT's best ImageNet sampler (FID 2.06)
OFFICIAL_CFG_SCALE = 4.0        # the guidance of SiT's sample.py grids (its FID runs use 1.5)
OFFICIAL_DATA_PATH = "/data/imagenet256-latents"  # configs/imagenet256/sit-xl2.yaml: where the latents would be
_DERIVED = ("input_size", "in_channels")  # set by the config's data section, not by model overrides


def official_config(model_cfg: ModelConfig, preset: str, vae: str, source: str | Path) -> ExperimentConfig:
    """The config of a model folder converted from an official file whose model is ``model_cfg`` (``preset``
    with the fields the file needed changed, e.g. its input size): SiT's ImageNet recipe around it."""
    base = dataclasses.asdict(PRESETS[preset])
    overrides = {k: v for k, v in dataclasses.asdict(model_cfg).items() if k not in _DERIVED and base.get(k) != v}
    stem = Path(source).stem.lower().replace("_", "-")
    cfg = ExperimentConfig(
        name=f"{stem}-official",
        model=ModelSection(preset=preset, overrides=overrides),
        sampler=dataclasses.replace(OFFICIAL_SAMPLER),
        data=DataConfig(kind="latents", path=OFFICIAL_DATA_PATH, resolution=model_cfg.input_size * LATENT_DOWNSAMPLE,
                        channels=3, vae=str(vae)),
        train=TrainConfig(global_batch_size=256, lr=1e-4, weight_decay=0.0, ema_decay=0.9999, mixed_precision="bf16"),
        log=LogConfig(sample_classes=list(DEFAULT_IMAGENET_CLASSES), sample_cfg_scale=OFFICIAL_CFG_SCALE),
    )
    if cfg.model_config() != model_cfg:  # the folder must rebuild exactly the model the file was loaded into
        raise ValueError(f"{source}: its model cannot be written as {preset} with overrides {overrides} "
                         f"({cfg.model_config()} != {model_cfg})")
    return cfg
