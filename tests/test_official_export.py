"""An official SiT checkpoint converts to the model-folder layout (issue #45): ``python -m vit5_sit.demo export
FILE.pt --preset ... --image-size ... --vae ...`` writes our files and diffusers' beside them, with the VAE in
``vae/``. The folder then samples what the file samples: ``Vit5SitPipeline`` on the folder gives sample.py's images
of the .pt (the same pixels for the same seeds and settings), and diffusers alone (no vit5_sit importable) gives
the pipeline's, bit for bit. A tiny SiT-T/2 in the official layout and a tiny random AutoencoderKL (8x
downsampling) stand in for SiT-XL-2-256x256.pt and sd-vae-ft-ema."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from test_diffusers_folder import run_without_package

from vit5_sit.cli.sample import build_parser, run
from vit5_sit.config import load_config
from vit5_sit.demo.export import main as export_main
from vit5_sit.models import create_model
from vit5_sit.pipeline import Vit5SitPipeline

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = dict(sampler="sde", steps=2, cfg=4.0)  # the folder's sampler (SiT's SDE Euler), 2 steps: fast


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(the official-layout .pt, the VAE folder, its state dict)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 8, 8, 8), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=1, latent_channels=4,
                        sample_size=32, norm_num_groups=8)
    root = tmp_path_factory.mktemp("official")
    vae.save_pretrained(root / "tiny-vae")
    torch.manual_seed(1)
    state = create_model("SiT-T/2", input_size=4).state_dict()  # the official key layout, learn_sigma on
    torch.save(state, root / "SiT-T-2-32x32.pt")
    return root / "SiT-T-2-32x32.pt", root / "tiny-vae", state


@pytest.fixture(scope="module")
def folder(official, tmp_path_factory) -> Path:
    pt, vae, _ = official
    out = tmp_path_factory.mktemp("converted") / "sit-t2"
    assert export_main(["export", str(pt), "--out", str(out), "--preset", "SiT-T/2", "--image-size", "32",
                        "--vae", str(vae), "--no-samples"]) == 0
    return out


def test_official_file_converts_to_both_layouts(official, folder):
    pt, vae, state = official
    index = json.loads((folder / "model_index.json").read_text())
    assert index["vae"] == ["diffusers", "AutoencoderKL"] and index["guidance_scale"] == 4.0
    assert all((folder / "vae" / name).is_file() for name in ("config.json", "diffusion_pytorch_model.safetensors"))
    weights = load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert set(weights) == set(state)
    assert all(weights[k].dtype == torch.float32 and torch.equal(weights[k], state[k]) for k in state)  # kept whole
    cfg = load_config(folder / "config.yaml")
    # the VAE named by its folder's name: the folder carries it in vae/, and no local path is published
    assert (cfg.model.preset, cfg.data.kind, cfg.data.resolution, cfg.data.vae) == ("SiT-T/2", "latents", 32, vae.name)
    local = str(pt.parent).encode()
    assert [p for p in folder.rglob("*") if p.is_file() and local in p.read_bytes()] == []
    assert (cfg.sampler.mode, cfg.sampler.method, cfg.sampler.steps, cfg.log.sample_cfg_scale) == ("sde", "euler",
                                                                                                     250, 4.0)
    assert cfg.model_config() == create_model("SiT-T/2", input_size=4).cfg
    card = (folder / "README.md").read_text()
    assert "official SiT checkpoint `SiT-T-2-32x32.pt`" in card and "Trained by SiT's authors" in card
    assert "trained with vit5-sit" not in card and "| dataset | ImageNet (SiT's training set) at 32px |" in card


def test_folder_samples_what_the_file_samples(official, folder, tmp_path):
    pt, vae, _ = official
    flags = ["--ckpt", str(pt), "--preset", "SiT-T/2", "--image-size", "32", "--vae", str(vae), "--sampler",
             SETTINGS["sampler"], "--steps", str(SETTINGS["steps"]), "--cfg-scale", str(SETTINGS["cfg"]),
             "--classes", "3,7", "--per-class", "1", "--out", str(tmp_path / "g.png"), "--save-images",
             str(tmp_path / "i"), "--no-progress"]
    assert run(build_parser().parse_args(flags)) == 0
    from_file = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in sorted((tmp_path / "i").glob("*.png"))])
    pipe = Vit5SitPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    images = pipe([3, 7], seed=0, num_inference_steps=SETTINGS["steps"]).images  # the folder's sde, guidance 4
    assert np.array_equal(np.stack([np.asarray(im) for im in images]), from_file)


@pytest.mark.slow
def test_diffusers_alone_samples_the_converted_folder(folder, tmp_path):
    """The folder with its vae/ in a Python where vit5_sit cannot be imported: the pipeline's images, bit for bit."""
    script = """
        import numpy as np
        from diffusers import DiffusionPipeline
        pipe = DiffusionPipeline.from_pretrained(sys.argv[1], trust_remote_code=True)
        pipe.set_progress_bar_config(disable=True)
        images = pipe(class_labels=[3, 7], seed=0, num_inference_steps=2, output_type="np").images
        np.save(sys.argv[2], images)
        print(type(pipe.vae).__name__)
    """
    proc = run_without_package(script, [str(folder), str(tmp_path / "theirs.npy")], tmp_path)
    assert proc.stdout.strip().splitlines()[-1] == "AutoencoderKL"
    pipe = Vit5SitPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    ours = pipe([3, 7], seed=0, num_inference_steps=2, output_type="np").images
    assert np.array_equal(np.load(tmp_path / "theirs.npy"), ours)


@pytest.mark.parametrize(("flags", "message"), [
    (["--preset", "SiT-S/2"], "does not fit preset SiT-S/2"),              # another model: the presets that fit it
    (["--preset", "SiT-T/3"], "--preset='SiT-T/3': must be one of"),
    (["--image-size", "36"], "must be a multiple of 8"),
    (["--vae", "no/such-vae-here"], "could not load VAE"),
])
def test_bad_conversions_are_one_line_and_write_nothing(official, tmp_path, capsys, flags, message):
    pt, vae, _ = official
    base = {"--preset": "SiT-T/2", "--image-size": "32", "--vae": str(vae)}
    base.update(dict(zip(flags[::2], flags[1::2], strict=True)))
    args = ["export", str(pt), "--out", str(tmp_path / "out"), "--no-samples", *sum(map(list, base.items()), [])]
    assert export_main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out" / "model_index.json").exists()


def test_official_flags_on_our_folder_are_refused(tmp_path, capsys):
    from vit5_sit.hub.model_files import DEMO_MODEL

    assert export_main(["export", str(DEMO_MODEL), "--out", str(tmp_path / "o"), "--preset", "SiT-T/2",
                        "--no-samples"]) == 2
    assert "apply to official .pt files only" in capsys.readouterr().err
