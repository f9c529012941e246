"""sample.py: labelled grids, per-sample seeds, resumable mass sampling to ADM's .npz, ImageNet class names,
and input mistakes that exit with code 2 and a message naming the flag."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import vit5_sit.sampling.generate as generate
from vit5_sit.common.classes import ClassSpecError, class_label, imagenet_synonyms, parse_classes
from vit5_sit.config import load_config, save_config
from vit5_sit.models import create_model
from vit5_sit.train.checkpoint import save_checkpoint
from vit5_sit.transport import ClassifierFreeGuidance, GuidanceError

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str):
    """A CLI script at the repository root as a module (the root need not be on sys.path)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "vit5_sit" / "cli" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


sample = load_script("sample")
TINY = ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=64", "model.num_heads=2",
        "data.kind=mnist", "data.resolution=8", "sampler.steps=3"]


def _tiny_state(seed: int) -> tuple:
    cfg = load_config(None, TINY)
    torch.manual_seed(seed)
    model = create_model(cfg.model_config())
    with torch.no_grad():  # a fresh DiT outputs zeros (adaLN-Zero): perturb it so that classes differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return cfg, {k: v.contiguous() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A model folder: config.yaml beside ema.safetensors (the layout of the bundled demo)."""
    folder = tmp_path_factory.mktemp("model")
    cfg, state = _tiny_state(0)
    save_config(cfg, folder / "config.yaml")
    save_file(state, str(folder / "ema.safetensors"))
    return folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run folder with two checkpoints; the newest has the weights of `model_dir`."""
    run = tmp_path_factory.mktemp("run")
    cfg, old = _tiny_state(1)
    _, new = _tiny_state(0)
    save_config(cfg, run / "config.yaml")
    save_checkpoint(run, 10, old, old, {"optimizer": {}})
    save_checkpoint(run, 20, new, new, {"optimizer": {}})
    return run


def _run(*args) -> int:
    return sample.main([str(a) for a in args])


def _images(folder: Path) -> np.ndarray:
    return np.stack([np.asarray(Image.open(p)) for p in sorted(folder.glob("*.png"))])


# ----------------------------------------------------------------------------------------------------------
# Grids and per-sample seeds.

def test_grid_is_labelled_and_holds_the_images(model_dir, tmp_path):
    out, imgs = tmp_path / "grid.png", tmp_path / "imgs"
    assert _run("--ckpt", model_dir, "--classes", "0,3", "--per-class", 3, "--seed", 5, "--out", out,
                "--save-images", imgs, "--no-progress") == 0
    grid = np.asarray(Image.open(out).convert("RGB"))
    names = sorted(p.name for p in imgs.glob("*.png"))
    assert names == [f"seed{s:06d}_class{c:04d}.png" for s, c in
                     [(5, 0), (6, 0), (7, 0), (8, 3), (9, 3), (10, 3)]]
    # 8x8 images are enlarged 8x to 64 px cells, 2 px apart; the label column sits left of the images.
    cell, pad = 64, 2
    assert grid.shape[0] == 2 * (cell + pad) + pad
    image_part = generate.make_grid(_images(imgs).repeat(8, axis=1).repeat(8, axis=2), ncol=3)
    assert grid.shape[1] > image_part.shape[1] + 20  # room for "class 3"
    np.testing.assert_array_equal(grid[:, -image_part.shape[1]:], image_part)
    label_column = grid[:, :-image_part.shape[1]]
    assert (label_column < 128).any(), "no label drawn"


def test_same_seed_same_images_other_seed_other_images(model_dir, tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert _run("--ckpt", model_dir, "--classes", "2", "--per-class", 4, "--seed", seed,
                    "--out", tmp_path / f"{name}.png", "--save-images", tmp_path / name) == 0
    a, b, c = (_images(tmp_path / n) for n in "abc")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # seed s gives the same image wherever it stands: seeds 1..3 of run a are seeds 0..2 of run c
    np.testing.assert_array_equal(a[1:], c[:3])


@pytest.mark.parametrize("sampler", ["ode", "sde"])
def test_images_do_not_depend_on_batch_size(model_dir, tmp_path, sampler):
    for bs in (1, 4):
        assert _run("--ckpt", model_dir, "--classes", "1,7", "--per-class", 3, "--sampler", sampler,
                    "--batch-size", bs, "--out", tmp_path / f"{bs}.png",
                    "--save-images", tmp_path / str(bs)) == 0
    one, four = _images(tmp_path / "1"), _images(tmp_path / "4")
    assert len(one) == 6
    np.testing.assert_array_equal(one, four)


def test_run_folder_samples_its_newest_checkpoint(model_dir, run_dir, tmp_path):
    args = ["--classes", "4", "--per-class", 2]
    assert _run("--ckpt", run_dir, *args, "--out", tmp_path / "r.png", "--save-images", tmp_path / "run") == 0
    assert _run("--ckpt", model_dir, *args, "--out", tmp_path / "m.png", "--save-images", tmp_path / "m") == 0
    np.testing.assert_array_equal(_images(tmp_path / "run"), _images(tmp_path / "m"))


def test_other_image_size(model_dir, tmp_path):
    assert _run("--ckpt", model_dir, "--classes", "0", "--per-class", 1, "--image-size", 16,
                "--out", tmp_path / "g.png", "--save-images", tmp_path / "i") == 0
    assert _images(tmp_path / "i").shape == (1, 16, 16, 3)


def test_no_arguments_samples_the_demo(model_dir, tmp_path, monkeypatch):
    import vit5_sit.hub.model_files

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(vit5_sit.hub.model_files, "DEMO_MODEL", model_dir)
    assert _run() == 0
    grid = Image.open(tmp_path / "samples.png")
    assert grid.height == 10 * (64 + 2) + 2  # all ten classes, one row each


def test_missing_demo_is_a_clear_error(tmp_path, monkeypatch, capsys):
    import vit5_sit.hub.model_files

    monkeypatch.setattr(vit5_sit.hub.model_files, "DEMO_MODEL", tmp_path / "no-demo")
    assert _run() == 2
    err = capsys.readouterr().err
    assert "demo model is missing" in err and "--ckpt" in err


@pytest.mark.skipif(not (ROOT / "vit5_sit/assets/demo/config.yaml").is_file(), reason="no bundled demo yet")
def test_bundled_demo(tmp_path):
    assert _run("--out", tmp_path / "demo.png", "--no-progress") == 0
    assert Image.open(tmp_path / "demo.png").width > 100


def test_demo_export_makes_a_model_folder(run_dir, tmp_path, capsys):
    from safetensors.torch import load_file

    from vit5_sit.demo import export as demo

    out = tmp_path / "exported"
    assert demo.main(["export", str(run_dir), "--out", str(out), "--cfg-scale", "2"]) == 0
    assert sorted(re.sub(r"_[0-9a-f]{10}\.py$", ".py", p.name) for p in out.iterdir()) == [
        "README.md", "config.yaml", "model_index.json",
                                                     "pipeline_vit5_sit.py", "samples.png", "scheduler", "transformer"]
    exported_cfg = load_config(out / "config.yaml")
    assert exported_cfg.log.sample_cfg_scale == 2.0 and exported_cfg.train.max_steps == 20
    exported = load_file(str(out / "transformer" / "diffusion_pytorch_model.safetensors"))  # the one weights file
    newest = load_file(str(run_dir / "checkpoints" / "step_0000020" / "ema.safetensors"))
    assert exported.keys() == newest.keys()
    for k, v in exported.items():
        assert v.dtype == torch.float16
        torch.testing.assert_close(v.float(), newest[k], atol=1e-3, rtol=1e-3)
    capsys.readouterr()
    assert _run("--ckpt", out, "--classes", "2", "--per-class", 1, "--out", tmp_path / "g.png", "--no-progress") == 0
    assert "cfg 2)" in capsys.readouterr().out
    assert demo.main(["export", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "error:" in capsys.readouterr().err


def test_grid_guidance_defaults_to_the_run_config(model_dir, tmp_path, capsys):
    guided = tmp_path / "guided"
    guided.mkdir()
    cfg = load_config(model_dir / "config.yaml", ["log.sample_cfg_scale=2.5"])
    save_config(cfg, guided / "config.yaml")
    (guided / "ema.safetensors").write_bytes((model_dir / "ema.safetensors").read_bytes())
    assert _run("--ckpt", guided, "--classes", "1", "--per-class", 1, "--out", tmp_path / "a.png",
                "--no-progress") == 0
    assert "cfg 2.5)" in capsys.readouterr().out
    assert _run("--ckpt", guided, "--classes", "1", "--per-class", 1, "--cfg-scale", 1, "--out",
                tmp_path / "b.png", "--no-progress") == 0
    assert "cfg 1)" in capsys.readouterr().out
    assert _run("--ckpt", guided, "--classes", "1", "--num-samples", 2, "--out", tmp_path / "c.npz",
                "--no-progress") == 0
    assert "cfg 1" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------
# Mass sampling.

NPZ_ARGS = ["--num-samples", 22, "--part-size", 6, "--batch-size", 4, "--seed", 3, "--no-progress"]


def test_npz_adm_layout_balanced_labels(model_dir, tmp_path):
    out = tmp_path / "s.npz"
    assert _run("--ckpt", model_dir, "--out", out, *NPZ_ARGS) == 0
    with np.load(out) as data:
        assert sorted(data.files) == ["arr_0", "arr_1"]
        images, labels = data["arr_0"], data["arr_1"]
    assert images.dtype == np.uint8 and images.shape == (22, 8, 8, 3)
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(labels, np.arange(22) % 10)
    assert not generate.parts_dir(out).exists(), "parts are removed once the .npz is written"
    # image i has seed 3 + i: the grid path gives the same pixels for seed 5 (i = 2, class 2)
    assert _run("--ckpt", model_dir, "--classes", "2", "--per-class", 1, "--seed", 5,
                "--out", tmp_path / "g.png", "--save-images", tmp_path / "one") == 0
    np.testing.assert_array_equal(_images(tmp_path / "one")[0], images[2])


def test_npz_classes_are_cycled(model_dir, tmp_path):
    out = tmp_path / "s.npz"
    assert _run("--ckpt", model_dir, "--out", out, "--classes", "7,2", "--num-samples", 5) == 0
    np.testing.assert_array_equal(np.load(out)["arr_1"], [7, 2, 7, 2, 7])


def test_interrupted_mass_sampling_resumes_to_the_same_file(model_dir, tmp_path, monkeypatch, capsys):
    full = tmp_path / "full.npz"
    assert _run("--ckpt", model_dir, "--out", full, *NPZ_ARGS) == 0

    # Parts of 6 images in batches of 4: Ctrl-C in the second batch of the second part.
    out = tmp_path / "resumed.npz"
    real = generate.sample_images
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(len(args[4]))
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(generate, "sample_images", interrupted)
    capsys.readouterr()
    assert _run("--ckpt", model_dir, "--out", out, *NPZ_ARGS) == 130
    err = capsys.readouterr().err
    parts = generate.parts_dir(out)
    assert err.strip() == (f"interrupted at image 10 of 22 (10 kept in {parts}); run the same command again "
                           "to continue")
    assert not out.exists()
    # The finished part, and the finished batch of the interrupted one.
    assert sorted(p.name for p in parts.glob("part_*.npz")) == ["part_000000.npz", "part_000001.partial.npz"]

    # Started again (with another batch size), it samples only what is missing and says what it kept.
    calls.clear()
    monkeypatch.setattr(generate, "sample_images", lambda *a, **k: calls.append(len(a[4])) or real(*a, **k))
    args = [a if a != 4 else 3 for a in NPZ_ARGS]
    assert _run("--ckpt", model_dir, "--out", out, *args) == 0
    assert f"{parts}: 10 of 22 images already done; sampling the other 12" in capsys.readouterr().out
    assert calls == [2, 3, 3, 3, 1]
    with np.load(full) as a, np.load(out) as b:
        np.testing.assert_array_equal(a["arr_0"], b["arr_0"])
        np.testing.assert_array_equal(a["arr_1"], b["arr_1"])

    # Done: a third run does nothing.
    calls.clear()
    assert _run("--ckpt", model_dir, "--out", out, *NPZ_ARGS) == 0
    assert calls == []


def test_parts_from_other_settings_are_not_mixed_in(model_dir, tmp_path, capsys):
    out = tmp_path / "s.npz"
    cfg, state = _tiny_state(0)
    model = create_model(cfg.model_config())
    model.load_state_dict(state)
    from vit5_sit.transport import Transport

    written = generate.sample_to_npz(model, Transport(cfg.transport), cfg.sampler, out, num_samples=12,
                                     part_size=6, max_parts=1, progress=False)
    assert written is None  # stopped after one part
    rc = _run("--ckpt", model_dir, "--out", out, "--num-samples", 12, "--part-size", 6, "--cfg-scale", 2)
    assert rc == 2
    err = capsys.readouterr().err
    assert "--out:" in err and "other settings" in err and "cfg_scale" in err


def _interrupt_after(monkeypatch, n_calls: int):
    real = generate.sample_images
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > n_calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(generate, "sample_images", interrupted)
    return real


def test_damaged_parts_are_sampled_again_and_a_damaged_manifest_is_named(model_dir, tmp_path, monkeypatch,
                                                                        capsys):
    """A finished part damaged on disk (truncated, or garbage) is drawn again, the same, at the start instead
    of failing the run at the end; an unreadable parts manifest is one error line naming the folder."""
    args = ["--num-samples", 12, "--part-size", 4, "--batch-size", 4, "--no-progress"]
    full, out = tmp_path / "full.npz", tmp_path / "s.npz"
    assert _run("--ckpt", model_dir, "--out", full, *args) == 0
    parts = generate.parts_dir(out)
    real = _interrupt_after(monkeypatch, 2)  # parts 0 and 1 finished, then Ctrl-C
    assert _run("--ckpt", model_dir, "--out", out, *args) == 130
    assert sorted(p.name for p in parts.glob("part_*.npz")) == ["part_000000.npz", "part_000001.npz"]
    first = parts / "part_000000.npz"
    first.write_bytes(first.read_bytes()[:100])
    (parts / "part_000001.npz").write_bytes(b"garbage")
    monkeypatch.setattr(generate, "sample_images", real)
    capsys.readouterr()
    assert _run("--ckpt", model_dir, "--out", out, *args) == 0
    printed = capsys.readouterr().out
    assert "part_000000.npz is damaged" in printed and "part_000001.npz is damaged" in printed, printed
    with np.load(full) as a, np.load(out) as b:
        np.testing.assert_array_equal(a["arr_0"], b["arr_0"])
        np.testing.assert_array_equal(a["arr_1"], b["arr_1"])

    out2 = tmp_path / "t.npz"
    _interrupt_after(monkeypatch, 1)
    assert _run("--ckpt", model_dir, "--out", out2, *args) == 130
    (generate.parts_dir(out2) / "manifest.json").write_bytes(b"\xff not json")
    monkeypatch.setattr(generate, "sample_images", real)
    capsys.readouterr()
    assert _run("--ckpt", model_dir, "--out", out2, *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "manifest.json is unreadable" in err[0] and f"delete {generate.parts_dir(out2)}" in err[0]


# ----------------------------------------------------------------------------------------------------------
# Class names.

def test_imagenet_class_list():
    names = imagenet_synonyms()
    assert len(names) == 1000
    spot = {0: "tench", 1: "goldfish", 207: "golden retriever", 281: "tabby", 291: "lion", 292: "tiger",
            360: "otter", 388: "giant panda", 417: "balloon", 574: "golf ball", 948: "Granny Smith",
            980: "volcano", 999: "toilet tissue"}
    for i, name in spot.items():
        assert names[i][0] == name
    assert all("," not in n for syn in names for n in syn), "--classes splits on commas"
    assert class_label(207, 1000) == "207 golden retriever"
    assert class_label(3, 10) == "class 3"


def test_parse_classes():
    assert parse_classes("golden retriever, GOLDFISH,0-2,Carassius auratus", 1000) == [207, 1, 0, 1, 2, 1]
    assert parse_classes("crayfish", 1000) == [124]  # also a synonym of 123; the class it names first wins
    with pytest.raises(ClassSpecError, match="nearest: 'golden retriever' \\(207\\)"):
        parse_classes("golden retreiver", 1000)
    with pytest.raises(ClassSpecError, match="ambiguous.*134.*517"):
        parse_classes("crane", 1000)
    with pytest.raises(ClassSpecError, match="out of range.*0-9"):
        parse_classes("3,10", 10)
    with pytest.raises(ClassSpecError, match="only for 1000-class"):
        parse_classes("goldfish", 10)
    # huge ids and ranges are refused before anything is built (a range 0-9999999999 was a MemoryError,
    # a 20-digit id an OverflowError, a 5000-digit id int()'s digit limit); non-ASCII digits are not ids
    for spec in ("0-9999999999", "99999999999999999999", "9" * 5000, "0-" + "9" * 5000):
        with pytest.raises(ClassSpecError, match="out of range.*0-9"):
            parse_classes(spec, 10)
    with pytest.raises(ClassSpecError, match="only for 1000-class"):
        parse_classes("\u00b2", 10)  # superscript two: str.isdigit() is true, int() fails
    assert parse_classes("007,2-3", 10) == [7, 2, 3]


# ----------------------------------------------------------------------------------------------------------
# Input mistakes: exit code 2, one line naming the flag, no traceback.

def test_guidance_needs_a_null_label(tmp_path, capsys):
    # class_dropout_prob = 0 builds no null row: guidance would index past the label table.
    cfg = load_config(None, [*TINY, "model.class_dropout_prob=0"])
    model = create_model(cfg.model_config())
    with pytest.raises(GuidanceError, match="cfg_scale=4 needs the null .*class_dropout_prob=0"):
        ClassifierFreeGuidance(model, 4.0, null_class=cfg.model_config().num_classes)
    assert ClassifierFreeGuidance(model, 1.0, null_class=10).scale == 1.0  # no guidance: nothing to refuse
    folder = tmp_path / "no-null"
    save_config(cfg, folder / "config.yaml")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "ema.safetensors"))
    assert _run("--ckpt", folder, "--cfg-scale", 4, "--out", tmp_path / "g.png") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --cfg-scale: cfg_scale=4 needs") and "\n" not in err
    assert not (tmp_path / "g.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--ckpt", "{tmp}/nope"], "--ckpt: no such file or folder: {tmp}/nope"),
    (["--classes", "dog"], "--classes: class 'dog': names are known only for 1000-class ImageNet models"),
    (["--classes", "12"], "--classes: class id 12 out of range"),
    (["--image-size", "10"], "--image-size 10: this model needs a multiple of 4"),
    (["--out", "x.jpg"], "--out x.jpg: expected a .png grid or a .npz"),
    (["--vae", "stabilityai/sd-vae-ft-ema"], "--vae: this model works on pixels"),
    (["--sampler", "sde", "--method", "dopri5"], "--sampler/--method/--steps/--grid/--tol:"),
    (["--num-samples", "5"], "--num-samples/--part-size: for .npz outputs"),
    (["--preset", "SiT-XL/2"], "--preset: applies to official .pt files only"),
    (["--guidance-interval", "0.8", "0.2"], "--guidance-interval 0.8 0.2"),
    # a grid PIL would not open again, refused before hours of sampling
    (["--classes", "0-9", "--per-class", "3000"], "--classes/--per-class: a grid of 10 x 3000 images"),
])
def test_bad_inputs(model_dir, tmp_path, capsys, args, message):
    args = [a.format(tmp=tmp_path) for a in args]
    if "--ckpt" not in args:
        args += ["--ckpt", str(model_dir)]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "g.png")]
    assert sample.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message.format(tmp=tmp_path) in err
    assert "Traceback" not in err


@pytest.mark.parametrize("nrow, ncol, size", [(3, 4, 8), (2, 5, 64), (1, 1, 100)])
def test_grid_pixels_is_the_size_of_the_grid(nrow, ncol, size, tmp_path):
    from vit5_sit.sampling.generate import grid_pixels, save_labelled_grid

    images = np.zeros((nrow * ncol, size, size, 3), dtype=np.uint8)
    path = save_labelled_grid(images, tmp_path / "g.png", ncol, [""] * nrow)
    w, h = Image.open(path).size
    label_w = w - (grid_pixels(nrow, ncol, size) // h)  # the image part is exactly grid_pixels; labels beside it
    assert grid_pixels(nrow, ncol, size) % h == 0 and 0 < label_w < 40


def test_cli_exit_code_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "sample.py"), "--ckpt", str(tmp_path / "missing")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --ckpt: no such file or folder: {tmp_path / 'missing'}"


# ----------------------------------------------------------------------------------------------------------
# Latent models: decoded by the run config's VAE, or --vae.

@pytest.fixture(scope="module")
def latent_model_dir(tmp_path_factory) -> Path:
    """A latent-space model folder whose config names a tiny random AutoencoderKL (8x downsampling)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before diffusers is imported: never wait on the network
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 8, 8, 8), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=1, latent_channels=4,
                        sample_size=32, norm_num_groups=8)
    vae_dir = tmp_path_factory.mktemp("vae") / "tiny-vae"
    vae.save_pretrained(vae_dir)
    folder = tmp_path_factory.mktemp("latent-model")
    cfg = load_config(None, ["model.preset=ViT5-T/2", "model.depth=1", "model.hidden_size=64",
                             "model.num_heads=2", "model.num_classes=5", "data.kind=latents",
                             "data.resolution=32", f"data.vae={vae_dir}", "sampler.steps=2"])
    assert (cfg.model_config().input_size, cfg.model_config().in_channels) == (4, 4)
    save_config(cfg, folder / "config.yaml")
    save_file({k: v.contiguous() for k, v in create_model(cfg.model_config()).state_dict().items()},
              str(folder / "ema.safetensors"))
    return folder


def test_latent_model_decodes_with_the_config_vae(latent_model_dir, tmp_path):
    assert _run("--ckpt", latent_model_dir, "--classes", "0,4", "--per-class", 2, "--out", tmp_path / "g.png",
                "--save-images", tmp_path / "i") == 0
    assert _images(tmp_path / "i").shape == (4, 32, 32, 3)
    # latents of 8 x 8 (64 px) are allowed: a multiple of 8 pixels per latent x patch size 2
    assert _run("--ckpt", latent_model_dir, "--classes", "1", "--per-class", 1, "--image-size", 64,
                "--out", tmp_path / "g64.png", "--save-images", tmp_path / "j") == 0
    assert _images(tmp_path / "j").shape == (1, 64, 64, 3)


def test_latent_model_bad_vae_and_size(latent_model_dir, tmp_path, capsys):
    assert _run("--ckpt", latent_model_dir, "--vae", tmp_path / "no-vae", "--out", tmp_path / "g.png") == 2
    assert "--vae: could not load VAE" in capsys.readouterr().err
    assert _run("--ckpt", latent_model_dir, "--image-size", 40, "--out", tmp_path / "g.png") == 2
    assert "multiple of 16 (8 pixels per latent x patch size 2)" in capsys.readouterr().err


def test_official_file_with_imagenet_names(latent_model_dir, tmp_path, capsys):
    """An official-layout SiT file (raw state dict in a .pt), a preset naming its model, ImageNet names."""
    official = tmp_path / "SiT-T-2-32x32.pt"
    torch.save(create_model("SiT-T/2", depth=1, input_size=4).state_dict(), official)
    vae = load_config(latent_model_dir / "config.yaml").data.vae
    # The preset is SiT-T/2 at depth 6: the file (depth 1) does not fit, and the error says what differs.
    assert _run("--ckpt", official, "--preset", "SiT-T/2", "--image-size", 32, "--vae", vae,
                "--out", tmp_path / "g.png") == 2
    assert "this file has depth=1" in capsys.readouterr().err
    # A file that fits the preset.
    official = tmp_path / "SiT-T-2-full.pt"
    torch.save(create_model("SiT-T/2", input_size=4).state_dict(), official)
    assert _run("--ckpt", official, "--preset", "SiT-T/2", "--image-size", 32, "--vae", vae, "--steps", 1,
                "--classes", "golden retriever,Goldfish", "--per-class", 2, "--out", tmp_path / "g.png",
                "--save-images", tmp_path / "i") == 0
    names = sorted(p.name for p in (tmp_path / "i").glob("*.png"))
    assert names == ["seed000000_class0207.png", "seed000001_class0207.png", "seed000002_class0001.png",
                     "seed000003_class0001.png"]
    assert _images(tmp_path / "i").shape == (4, 32, 32, 3)
    # Its pos_embed is for 32 px (4 x 4 latents): another --image-size is an error that names the field.
    assert _run("--ckpt", official, "--preset", "SiT-T/2", "--image-size", 64, "--vae", vae,
                "--out", tmp_path / "g.png") == 2
    err = capsys.readouterr().err
    assert "--ckpt:" in err and "input_size" in err and "--image-size sets" in err
    assert _run("--ckpt", official, "--image-size", 36, "--out", tmp_path / "g.png") == 2
    assert "multiple of 8" in capsys.readouterr().err


def test_official_file_mismatch_names_the_preset_that_fits(tmp_path, capsys):
    """A file that does not fit the preset: the presets that fit it, never a field sample.py cannot set;
    the --image-size hint only where the input size differs."""
    def refused(state, name):
        torch.save(state, tmp_path / name)
        assert _run("--ckpt", tmp_path / name, "--preset", "SiT-T/2", "--image-size", 32,
                    "--out", tmp_path / "g.png") == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --ckpt: ") and "\n" not in err and "pass " not in err
        return err

    patch4 = create_model("SiT-T/4", input_size=4).state_dict()
    err = refused(patch4, "patch4.pt")
    assert "this file has patch_size=4 (SiT-T/2 has 2)" in err and "presets that fit it: SiT-T/4" in err
    assert "--image-size sets" not in err
    no_sigma = create_model("SiT-T/2", input_size=4, learn_sigma=False).state_dict()
    err = refused(no_sigma, "no_sigma.pt")
    assert "this file has learn_sigma=False (SiT-T/2 has True)" in err and "no preset fits it" in err
    missing = create_model("SiT-T/2", input_size=4).state_dict()
    del missing["final_layer.adaLN_modulation.1.bias"]
    err = refused(missing, "missing.pt")
    assert "1 missing keys: final_layer.adaLN_modulation.1.bias" in err and "--image-size sets" not in err


def test_adaptive_solver_resume_needs_the_same_batches(model_dir, tmp_path, monkeypatch, capsys):
    """dopri5 shares its step sizes within a batch, so its parts record the batch size."""
    out = tmp_path / "s.npz"
    args = ["--ckpt", model_dir, "--out", out, "--method", "dopri5", "--num-samples", 6, "--part-size", 3]
    real = generate.sample_images

    def interrupted(*a, **k):
        if generate.parts_dir(out).joinpath("part_000000.npz").exists():
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(generate, "sample_images", interrupted)
    assert _run(*args, "--batch-size", 3) == 130
    monkeypatch.setattr(generate, "sample_images", real)
    assert _run(*args, "--batch-size", 2) == 2
    assert "batches" in capsys.readouterr().err
    assert _run(*args, "--batch-size", 3) == 0
    assert np.load(out)["arr_0"].shape == (6, 8, 8, 3)
