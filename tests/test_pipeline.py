"""Vit5SitPipeline: the same images as sample.py for the same seeds and settings, output types, seeds from a
generator, ImageNet names, a latent model decoded by its VAE, and the bundled demo model."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from vit5_sit.common.classes import ClassSpecError
from vit5_sit.config import load_config, save_config
from vit5_sit.models import create_model
from vit5_sit.pipeline import Vit5SitPipeline

ROOT = Path(__file__).resolve().parent.parent
TINY = ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=64", "model.num_heads=2",
        "data.kind=mnist", "data.resolution=8", "sampler.steps=3", "log.sample_cfg_scale=2.0"]


def _model_dir(folder: Path, overrides: list[str]) -> Path:
    cfg = load_config(None, overrides)
    torch.manual_seed(0)
    model = create_model(cfg.model_config())
    with torch.no_grad():  # a fresh DiT outputs zeros (adaLN-Zero): perturb it so that classes differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_config(cfg, folder / "config.yaml")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "ema.safetensors"))
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return _model_dir(tmp_path_factory.mktemp("model"), TINY)


@pytest.fixture(scope="module")
def pipe(model_dir) -> Vit5SitPipeline:
    p = Vit5SitPipeline.from_pretrained(model_dir)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture(scope="module")
def sample_cli():
    spec = importlib.util.spec_from_file_location("sample", ROOT / "vit5_sit" / "cli" / "sample.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sample"] = module
    spec.loader.exec_module(module)
    return module


def _sample_py(sample_cli, tmp_path, *args) -> np.ndarray:
    """sample.py's images (--save-images), in seed order."""
    out = tmp_path / "imgs"
    assert sample_cli.main([*map(str, args), "--out", str(tmp_path / "g.png"), "--save-images", str(out),
                            "--no-progress"]) == 0
    return np.stack([np.asarray(Image.open(p)) for p in sorted(out.glob("*.png"))])


@pytest.mark.parametrize("flags, kwargs", [
    ([], {}),                                                                  # the model config's defaults
    (["--cfg-scale", "4", "--sampler", "sde", "--steps", "4", "--seed", "11"],
     {"guidance_scale": 4.0, "sampler": "sde", "num_inference_steps": 4, "seed": 11}),
    (["--cfg-scale", "1.5", "--guidance-interval", "0.2", "0.9", "--method", "heun", "--steps", "2"],
     {"guidance_scale": 1.5, "guidance_interval": (0.2, 0.9), "method": "heun", "num_inference_steps": 2}),
])
def test_same_images_as_sample_py(pipe, model_dir, sample_cli, tmp_path, flags, kwargs):
    want = _sample_py(sample_cli, tmp_path, "--ckpt", model_dir, "--classes", "0,3,9", "--per-class", 2, *flags)
    labels = [0, 0, 3, 3, 9, 9]
    out = pipe(class_labels=labels, **{"seed": 0, **kwargs})
    got = np.stack([np.asarray(im) for im in out.images])
    assert got.shape == want.shape == (6, 8, 8, 3)
    assert np.array_equal(got, want)
    assert out.seeds == list(range(kwargs.get("seed", 0), kwargs.get("seed", 0) + 6)) and out.class_labels == labels


def test_batch_size_and_output_types(pipe):
    pil = pipe([1, 2, 3, 4], seed=5).images
    np_out = pipe([1, 2, 3, 4], seed=5, output_type="np", batch_size=3).images
    pt_out = pipe([1, 2, 3, 4], seed=5, output_type="pt", batch_size=1).images
    # every output type is RGB for grey digits, as PIL's: the channel repeated (np had 1 channel, pil 3)
    assert np_out.shape == (4, 8, 8, 3) and np_out.dtype == np.float32 and 0 <= np_out.min() <= np_out.max() <= 1
    assert np.array_equal(np_out[..., 0], np_out[..., 2]) and np.array_equal(np.asarray(pil[0]).shape, (8, 8, 3))
    assert isinstance(pt_out, torch.Tensor) and pt_out.shape == (4, 3, 8, 8)
    assert np.allclose(pt_out.permute(0, 2, 3, 1).numpy(), np_out, atol=1e-6)
    # PIL is the uint8 rounding of the same batch's floats (another batch size can move a value across a .5)
    same_batch = pipe([1, 2, 3, 4], seed=5, output_type="np").images
    assert np.allclose(same_batch, np_out, atol=1e-5)  # images do not depend on the batch size
    assert np.array_equal(np.stack([np.asarray(i)[..., 0] for i in pil]), np.round(same_batch[..., 0] * 255))
    images, labels, seeds = pipe([1], seed=5, return_dict=False)  # diffusers: the tuple of the output's fields
    assert np.array_equal(np.asarray(images[0]), np.asarray(pil[0])) and (labels, seeds) == ([1], [5])


def test_generator_draws_reproducible_seeds(pipe):
    a = pipe([0, 1, 2], generator=torch.Generator().manual_seed(123), output_type="np")
    b = pipe([0, 1, 2], generator=torch.Generator().manual_seed(123), output_type="np")
    c = pipe([0, 1, 2], generator=torch.Generator().manual_seed(124), output_type="np")
    assert a.seeds == b.seeds != c.seeds and np.array_equal(a.images, b.images)
    assert not np.array_equal(a.images, c.images)
    again = pipe([0, 1, 2], seed=a.seeds, output_type="np")   # the recorded seeds give the same images
    assert np.array_equal(again.images, a.images)


def test_a_list_of_generators_gives_one_seed_per_image(pipe):
    """diffusers' convention: generator i makes image i, whatever the other generators are."""
    gens = [torch.Generator().manual_seed(s) for s in (10, 11, 12)]
    out = pipe([0, 1, 2], generator=gens)
    want = [int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(s))) for s in (10, 11, 12)]
    assert out.seeds == want
    alone = pipe([1], generator=[torch.Generator().manual_seed(11)])  # PIL: sample.py's pixels, any batch size
    assert alone.seeds == [want[1]] and np.array_equal(np.asarray(alone.images[0]), np.asarray(out.images[1]))
    again = pipe([0, 1, 2], seed=want).images
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(again, out.images))
    with pytest.raises(ValueError, match=r"2 generators for 3 images: give one generator per image \(or one for all"):
        pipe([0, 1, 2], generator=gens[:2])
    with pytest.raises(ValueError, match="generator of type int: give a torch.Generator, or a list of them"):
        pipe([0], generator=5)  # was a raw TypeError from torch.randint
    with pytest.raises(ValueError, match="generator\\[1\\] is a int: give a list of torch.Generator"):
        pipe([0, 1], generator=[gens[0], 3])


def test_output_reads_as_a_tuple_and_a_dict(pipe):
    out = pipe([4, 2], seed=3, output_type="np")
    assert out[0] is out.images and out["seeds"] == out[2] == [3, 4] and out["class_labels"] == out[1] == [4, 2]
    images, labels, seeds = out
    assert len(out) == 3 and out.keys() == ["images", "class_labels", "seeds"] and seeds == [3, 4]
    assert out[:2] == out.to_tuple()[:2]
    tup = pipe([4, 2], seed=3, output_type="np", return_dict=False)
    assert isinstance(tup, tuple) and np.array_equal(tup[0], images) and tup[1:] == (labels, seeds)
    with pytest.raises(KeyError, match="'image': the output has images, class_labels, seeds"):
        out["image"]


def test_num_images_per_prompt(pipe):
    out = pipe([0, 3], num_images_per_prompt=2, seed=4, output_type="np")
    assert out.class_labels == [0, 0, 3, 3] and out.seeds == [4, 5, 6, 7]  # sample.py --classes 0,3 --per-class 2
    assert np.array_equal(out.images, pipe([0, 0, 3, 3], seed=4, output_type="np").images)
    gens = [torch.Generator().manual_seed(s) for s in range(4)]
    assert len(pipe([0, 3], num_images_per_prompt=2, generator=gens).images) == 4
    for bad in (0, 1.5, True, 10**12):  # 10**12 built its label list first and hung
        with pytest.raises(ValueError, match=rf"num_images_per_prompt={bad!r}: (must be in \[1, 10000\]|expected a "
                                             "whole number)"):
            pipe([0], num_images_per_prompt=bad)
    with pytest.raises(ValueError, match="2 class label.* = 10,002 images: a call holds at most"):
        pipe([0, 1], num_images_per_prompt=5_001)


class _Bar:
    """Records a progress bar's position at each update."""

    def __init__(self, total):
        self.total, self.n, self.positions = total, 0.0, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, k):
        self.n += k
        self.positions.append(self.n)


@pytest.mark.parametrize("kwargs, steps, evals", [
    (dict(sampler="ode", method="euler", num_inference_steps=3), 3, 3),
    (dict(sampler="sde", method="heun", num_inference_steps=2), 3, 5),  # 2 Heun steps (4 NFE) + the last step
])
def test_progress_moves_with_every_step(pipe, monkeypatch, kwargs, steps, evals):
    """The bar counts whole sampler steps over all batches (it counted images: 0 until the end of a batch)."""
    bars, calls = [], []
    monkeypatch.setattr(pipe, "progress_bar", lambda total, **kw: bars.append(_Bar(total)) or bars[-1])
    want = pipe([0, 1, 2], seed=0, batch_size=2, output_type="np", **kwargs).images
    got = pipe([0, 1, 2], seed=0, batch_size=2, output_type="np", on_step=lambda *a: calls.append(a), **kwargs)
    assert np.array_equal(got.images, want)  # the hook changes nothing
    assert calls == [(i, 2 * evals) for i in range(1, 2 * evals + 1)]  # two batches
    bar = bars[-1]
    assert bar.total == 2 * steps and len(bar.positions) == 2 * evals
    # whole steps (an SDE Heun step is two evaluations: the bar showed 0.6/6, and 2.0/6 with guidance)
    assert bar.positions == [i * steps // evals for i in range(1, 2 * evals + 1)] and bar.n == 2 * steps


def test_max_nfe_bounds_fixed_and_adaptive_solvers(pipe):
    from vit5_sit.pipeline import NFELimitError

    calls = []
    with pytest.raises(NFELimitError, match="ode/heun with 3 steps takes 6 network evaluations a batch: more than "
                                            "max_nfe=5"):
        pipe([0], method="heun", num_inference_steps=3, max_nfe=5, on_step=lambda *a: calls.append(a))
    assert calls == []  # refused before sampling
    assert len(pipe([0], method="heun", num_inference_steps=3, max_nfe=6).images) == 1
    with pytest.raises(NFELimitError, match="ode/dopri5 took more than max_nfe=4 network evaluations on a batch of "
                                            "2 images and was stopped"):
        pipe([0, 1], method="dopri5", max_nfe=4, on_step=lambda *a: calls.append(a))
    assert calls == [(i, None) for i in range(1, 6)]  # stopped at the first evaluation past the bound
    free = pipe([0, 1], seed=0, method="dopri5", output_type="np", on_step=lambda *a: calls.append(a))
    nfe = calls[-1][0]  # what dopri5 took: exactly that bound lets it finish
    bounded = pipe([0, 1], seed=0, method="dopri5", output_type="np", max_nfe=nfe)
    assert np.array_equal(bounded.images, free.images)
    with pytest.raises(ValueError, match=r"max_nfe=0: must be in \[1, 20000\]"):
        pipe([0], max_nfe=0)


def test_save_pretrained_round_trip(pipe, tmp_path):
    folder = pipe.save_pretrained(tmp_path / "saved")
    assert (folder / "README.md").is_file()
    again = Vit5SitPipeline.from_pretrained(folder)
    again.set_progress_bar_config(disable=True)
    assert np.array_equal(again([2, 5], seed=3, output_type="np").images, pipe([2, 5], seed=3, output_type="np").images)


def test_bad_arguments_name_the_value(pipe):
    with pytest.raises(ValueError, match="output_type='jpg': choose one of pil, np, pt"):
        pipe([0], output_type="jpg")
    with pytest.raises(ClassSpecError, match="class id 10 out of range"):
        pipe([10])
    with pytest.raises(ClassSpecError, match="names are known only for 1000-class"):
        pipe(["goldfish"])
    with pytest.raises(ValueError, match="2 seeds for 3 images"):
        pipe([0, 1, 2], seed=[1, 2])
    with pytest.raises(ValueError, match="dopri5"):
        pipe([0], sampler="sde", method="dopri5")
    with pytest.raises(ValueError, match="guidance_interval 0.9 0.1: need 0 <= LOW <= HIGH <= 1"):
        pipe([0], guidance_interval=(0.9, 0.1))
    with pytest.raises(ValueError, match=r"guidance_scale=-2: must be in \[0, 1000\]"):
        pipe([0], guidance_scale=-2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(class_labels=[]), "class_labels is empty"),
    (dict(class_labels=[0], batch_size=0), r"batch_size=0: must be in \[1, 65536\]"),
    (dict(class_labels=[0], seed=1.5), "seed=1.5: give the first seed"),
    (dict(class_labels=[0], seed="3"), "seed='3': give the first seed"),  # not the characters as seeds
    (dict(class_labels=[0], seed=-1), r"seed=-1: sample seeds must lie in \[0, 4294967295\]"),
    (dict(class_labels=[0, 1], seed=2**32 - 1), "choose seed between 0 and 4294967294"),
    (dict(class_labels=[0, 1], seed=[0, True]), "seed=True: expected a whole number"),
    (dict(class_labels=[0], seed=1, generator=torch.Generator()), "give seed or generator, not both"),
    (dict(class_labels=[-1]), r"class id -1 out of range: this model has 10 classes \(ids 0-9\)"),
    (dict(class_labels=[1.0]), "class label 1.0: give a class id"),
    (dict(class_labels=torch.tensor([0.5])), "class label 0.5: give a class id"),
    (dict(class_labels=[0], num_inference_steps=0), r"num_inference_steps=0: must be in \[1, 10000\]"),
])
def test_bad_seeds_labels_and_batches_are_refused_before_sampling(pipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipe(**kwargs)


def test_seeds_as_arrays_and_tensors(pipe):
    a = pipe([0, 1], seed=[5, 9], output_type="np", num_inference_steps=1)
    b = pipe([0, 1], seed=torch.tensor([5, 9]), output_type="np", num_inference_steps=1)
    c = pipe([0, 1], seed=np.array([5, 9]), output_type="np", num_inference_steps=1)
    assert a.seeds == b.seeds == c.seeds == [5, 9]
    assert np.array_equal(a.images, b.images) and np.array_equal(a.images, c.images)
    assert pipe.get_label_ids(torch.tensor([3, 1])) == pipe.get_label_ids(np.array([3, 1])) == [3, 1]
    assert pipe.get_label_ids(torch.tensor(4)) == pipe.get_label_ids([torch.tensor(4)]) == [4]  # was refused


def test_imagenet_names(tmp_path):
    folder = _model_dir(tmp_path, [*TINY, "model.num_classes=1000", "data.channels=3"])
    p = Vit5SitPipeline.from_pretrained(folder)
    assert p.get_label_ids([207, "goldfish", "Carassius auratus"]) == [207, 1, 1]
    assert p.id2label[207] == "golden retriever"
    out = p(class_labels=[207, "goldfish"], guidance_scale=4.0, num_inference_steps=2, seed=0)
    assert out.class_labels == [207, 1] and out.images[0].size == (8, 8)


@pytest.mark.slow  # ~10 s: importing diffusers
def test_latent_model_decodes_with_its_vae(tmp_path, sample_cli):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before diffusers is imported: never wait on the network
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 8, 8, 8), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=1, latent_channels=4,
                        sample_size=32, norm_num_groups=8)
    vae.save_pretrained(tmp_path / "vae")
    (tmp_path / "m").mkdir()
    folder = _model_dir(tmp_path / "m", ["model.preset=ViT5-T/2", "model.depth=1", "model.hidden_size=64",
                                         "model.num_heads=2", "model.num_classes=5", "data.kind=latents",
                                         "data.resolution=32", f"data.vae={tmp_path / 'vae'}", "sampler.steps=2"])
    p = Vit5SitPipeline.from_pretrained(folder)
    got = np.stack([np.asarray(i) for i in p([0, 4], seed=0, guidance_scale=1.0).images])
    want = _sample_py(sample_cli, tmp_path, "--ckpt", folder, "--classes", "0,4", "--per-class", 1,
                      "--cfg-scale", 1)
    assert got.shape == (2, 32, 32, 3) and np.array_equal(got, want)


def test_bundled_demo_loads_through_the_pipeline():
    p = Vit5SitPipeline.from_pretrained()
    p.set_progress_bar_config(disable=True)
    out = p(class_labels=[7], num_inference_steps=2, seed=0)
    assert out.images[0].size == (32, 32) and out.images[0].mode == "RGB"


@pytest.mark.slow  # the demo model at the README's settings
def test_readme_pipeline_example_runs(tmp_path, monkeypatch):
    """docs/hub.md's pipeline example, run as written (in a temporary folder)."""
    readme = (ROOT / "docs" / "hub.md").read_text()
    section = readme[readme.index("## Python: Vit5SitPipeline"):]
    start = section.index("```python\n") + len("```python\n")
    code = section[start:section.index("\n```", start)]
    assert "Vit5SitPipeline.from_pretrained()" in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert Image.open(tmp_path / "three.png").size == (32, 32)


# diffusers' habits (issue #45) -------------------------------------------------------------------------------------

def test_diffusers_habits_dtype_device_components_progress_bar(model_dir):
    pipe = Vit5SitPipeline.from_pretrained(model_dir)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.dtype == torch.float32 and pipe.device == torch.device("cpu")
    assert set(pipe.components) == {"transformer", "scheduler", "vae", "guide"}
    assert pipe.components["transformer"] is pipe.model and pipe.components["guide"] is None
    assert pipe.transformer is pipe.model and pipe.components["vae"] is None  # a pixel model
    assert list(pipe.progress_bar(iterable=range(3))) == [0, 1, 2]
    with pipe.progress_bar(total=4) as bar:
        bar.update(4)
    want = pipe([1, 2], seed=0, output_type="np").images
    assert np.array_equal(pipe([1, 2], seed=0, output_type=None).images, want)  # None is "np", as in diffusers
    latent = pipe([1, 2], seed=0, output_type="latent").images  # the model's own space: 1 channel, in [-1, 1]
    assert latent.shape == (2, 1, 8, 8) and np.allclose(((latent + 1) / 2).clamp(0, 1)[:, 0], want[..., 0])
    assert pipe.to("cpu", torch.bfloat16) is pipe and pipe.dtype == torch.bfloat16
    half = pipe([1, 2], seed=0, output_type="np").images  # the network in bfloat16, the solver in float32
    assert half.dtype == np.float32 and np.abs(half - want).mean() < 0.05
    assert pipe.to(device="cpu", dtype=torch.float32).dtype == torch.float32  # (bfloat16's rounding stays)
    with pytest.raises(TypeError, match="give a device, a torch.dtype, or both"):
        pipe.to(1.5)
    loaded = Vit5SitPipeline.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16 and Vit5SitPipeline.from_pretrained(model_dir, dtype=torch.float16).dtype \
        == torch.float16


def test_model_cpu_offload_keeps_the_images(model_dir):
    pytest.importorskip("accelerate")
    pipe = Vit5SitPipeline.from_pretrained(model_dir)
    pipe.set_progress_bar_config(disable=True)
    want = pipe([3, 4], seed=1, output_type="np").images
    pipe.enable_model_cpu_offload(device="cpu")  # no GPU here: the hooks run, on the CPU
    assert pipe.device == torch.device("cpu")
    assert np.array_equal(pipe([3, 4], seed=1, output_type="np").images, want)
