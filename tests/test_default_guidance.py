"""A model's default guidance is a scale and an interval in t (issue #52: the bundled demo ships autoguidance 3 on
t in [0, 0.5]): ``log.sample_guidance_interval`` is the default of sample.py's grids, `Vit5SitPipeline`, the folder
in diffusers and the web page, bit for bit the explicit call; model_index.json states it, both doors check it, and
``demo export --guidance-interval`` sets it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from vit5_sit.config import ConfigError, load_config
from vit5_sit.models import create_model

TINY = ["name=tiny-default", "model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=32", "model.num_heads=2",
        "data.kind=mnist", "data.resolution=8", "sampler.steps=4", "log.sample_cfg_scale=2.0",
        "log.sample_guidance_interval=[0.0,0.5]"]
LABELS = [3, 4]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A model folder with a guide whose default guidance is weight 2 on t in [0, 0.5] (Euler 4: t = 0, 0.25, 0.5
    guided, 0.75 not)."""
    from vit5_sit.pipeline import Vit5SitPipeline

    cfg = load_config(None, TINY)
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = create_model(cfg.model_config())
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        models.append(m.eval())
    return Vit5SitPipeline(models[0], cfg, guide=models[1]).save_pretrained(tmp_path_factory.mktemp("m") / "guided")


def _images(pipe, **kwargs) -> np.ndarray:
    return np.stack([np.asarray(im) for im in pipe(LABELS, seed=0, **kwargs).images])


def test_every_door_defaults_to_the_folders_interval(folder, tmp_path):
    from diffusers import DiffusionPipeline

    from vit5_sit.cli import sample
    from vit5_sit.pipeline import Vit5SitPipeline

    pipe = Vit5SitPipeline.from_pretrained(folder)
    default = _images(pipe)
    assert np.array_equal(default, _images(pipe, guidance_scale=2.0, guidance_interval=(0.0, 0.5)))
    assert not np.array_equal(default, _images(pipe, guidance_interval=(0.0, 1.0)))  # the interval matters here
    door = DiffusionPipeline.from_pretrained(str(folder), trust_remote_code=True)
    assert list(door.config.guidance_interval) == [0.0, 0.5]
    assert np.array_equal(default, _images(door))
    shots = tmp_path / "shots"
    assert sample.main(["--ckpt", str(folder), "--classes", "3,4", "--per-class", "1", "--out",
                        str(tmp_path / "g.png"), "--save-images", str(shots), "--no-progress"]) == 0
    drawn = np.stack([np.asarray(Image.open(p).convert("L")) for p in sorted(shots.glob("*.png"))])
    assert np.array_equal(drawn, default if default.ndim == 3 else default[..., 0])


def test_the_page_fills_in_the_interval(folder):
    from vit5_sit.demo import app as demo_app
    from vit5_sit.pipeline import Vit5SitPipeline

    d = demo_app.model_defaults(Vit5SitPipeline.from_pretrained(folder))
    assert (d["guidance"], d["low"], d["high"]) == (2.0, 0.0, 0.5)


def test_model_index_states_it_and_both_doors_check_it(folder, tmp_path):
    from diffusers import DiffusionPipeline

    from vit5_sit.common.checks import ModelLoadError
    from vit5_sit.pipeline import Vit5SitPipeline

    assert json.loads((folder / "model_index.json").read_text())["guidance_interval"] == [0.0, 0.5]
    edited = shutil.copytree(folder, tmp_path / "edited")
    index = json.loads((edited / "model_index.json").read_text())
    (edited / "model_index.json").write_text(json.dumps({**index, "guidance_interval": [0.0, 0.6]}))
    with pytest.raises(ModelLoadError, match=r"guidance_interval=\[0\.0, 0\.6\].*guidance_interval=\[0\.0, 0\.5\]"):
        Vit5SitPipeline.from_pretrained(edited)  # config.yaml says [0, 0.5]: one error, not a second default
    (edited / "model_index.json").write_text(json.dumps({**index, "guidance_interval": [0.7, 0.2]}))
    with pytest.raises(ValueError, match=r"model_index.json guidance_interval 0.7 0.2: need 0 <= LOW <= HIGH"):
        DiffusionPipeline.from_pretrained(str(edited), trust_remote_code=True)


@pytest.mark.parametrize("value, said", [
    ("[0.6,0.2]", "log.sample_guidance_interval 0.6 0.2: need 0 <= LOW <= HIGH <= 1"),
    ("[0,1.5]", "log.sample_guidance_interval=1.5: must be in [0, 1]"),
    ("[0.5]", "log.sample_guidance_interval [0.5]: expected two numbers LOW HIGH"),
    ("half", "log.sample_guidance_interval"),
])
def test_a_bad_interval_in_the_config_is_one_error(value, said):
    with pytest.raises(ConfigError) as e:
        load_config(None, [*TINY[:-1], f"log.sample_guidance_interval={value}"])
    assert said in str(e.value)


def test_export_sets_the_default_guidance(folder, tmp_path):
    from vit5_sit.demo.export import export_model, main

    out = export_model(folder, tmp_path / "x", cfg_scale=3.0, guidance_interval=(0.0, 0.4), samples=False,
                       guide=folder / "guide")
    assert json.loads((out / "model_index.json").read_text())["guidance_interval"] == [0.0, 0.4]
    assert load_config(out / "config.yaml").log.sample_guidance_interval == [0.0, 0.4]
    card = (out / "README.md").read_text()
    assert "autoguidance weight 3 on t in [0, 0.4] with the guide in `guide/`" in card
    assert "## Guidance: autoguidance" in card
    assert main(["export", str(folder), "--out", str(tmp_path / "y"), "--guidance-interval", "0.6", "0.2"]) == 2
    assert not (tmp_path / "y").exists()  # refused before anything is written


def test_export_keeps_a_folders_guide_unless_told_none(folder, tmp_path):
    """Exported again, a model folder keeps its guide/ (its default guidance weighs it); --guide none drops it."""
    from vit5_sit.demo.export import export_model

    kept = export_model(folder, tmp_path / "kept", samples=False)
    assert (kept / "guide" / "diffusion_pytorch_model.safetensors").is_file()
    assert json.loads((kept / "model_index.json").read_text())["guide"][1] == "Vit5SitTransformer2DModel"
    dropped = export_model(folder, tmp_path / "dropped", samples=False, guide="none")
    assert not (dropped / "guide").exists()
    assert json.loads((dropped / "model_index.json").read_text())["guide"] == [None, None]
    assert "## Guidance: autoguidance" not in (dropped / "README.md").read_text()
