"""A model folder that diffusers loads without vit5-sit (issue #45): the bundled demo exported, then loaded with
``DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`` in a subprocess where ``import vit5_sit``
(and torchdiffeq, which the package needs and diffusers does not) fails; its images equal Vit5SitPipeline's bit
for bit (CPU, float32) for the same seeds and settings, and bfloat16 loads and samples. In-process: the folder's
code is generated from the package's source (no import of vit5_sit, the ModelConfig fields as the config), and
the scheduler's diffusers step loop is ode_euler's steps."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from vit5_sit.config import load_config
from vit5_sit.demo.export import export_model
from vit5_sit.hub.model_files import DEMO_MODEL
from vit5_sit.pipeline import Vit5SitPipeline

ROOT = Path(__file__).resolve().parent.parent
CALLS = {  # name -> keyword arguments of both pipelines' calls
    "default": dict(class_labels=[0, 3, 7], seed=0),
    "sde-heun": dict(class_labels=[1, 8], seed=[5, 9], sampler="sde", method="heun", num_inference_steps=4,
                     guidance_scale=2.0),
    "dpm-pt": dict(class_labels=[4], num_images_per_prompt=2, seed=11, method="dpm++2m", num_inference_steps=5,
                   output_type="pt"),
    "generator": dict(class_labels=[2, 6], generator="seeded", guidance_scale=1.0, batch_size=1),
    "latent": dict(class_labels=[9], seed=3, output_type="latent"),
}

# The start of every script run in a fresh Python where vit5_sit and torchdiffeq cannot be imported and the
# checkout is not on the path (`run_without_package`).
WITHOUT_PACKAGE = textwrap.dedent("""
    import importlib.abc, json, os, sys
    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("vit5_sit", "torchdiffeq"):
                raise ImportError(f"{name}: not installed here")
    sys.meta_path.insert(0, Blocked())
    sys.path = [p for p in sys.path if p not in ("", ".") and not p.startswith(os.environ["CHECKOUT"])]
    try:
        import vit5_sit
        sys.exit("vit5_sit could be imported")
    except ImportError:
        pass
""")


def run_without_package(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``WITHOUT_PACKAGE + script`` in a fresh Python, offline, with its own diffusers modules cache in ``cwd``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CHECKOUT": str(ROOT), "PYTHONPATH": "",
           "HF_MODULES_CACHE": str(cwd / "modules")}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_PACKAGE + textwrap.dedent(script), *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


OUTSIDE = textwrap.dedent("""
    import numpy as np, torch
    from diffusers import DiffusionPipeline
    folder, out = sys.argv[1], sys.argv[2]
    calls = json.loads(sys.argv[3])
    pipe = DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)
    pipe.set_progress_bar_config(disable=True)
    result = {"class": type(pipe).__name__, "dtype": str(pipe.dtype), "components": sorted(pipe.components)}
    for name, kwargs in calls.items():
        if kwargs.get("generator") == "seeded":
            kwargs["generator"] = [torch.Generator().manual_seed(i) for i in range(len(kwargs["class_labels"]))]
        images = pipe(**kwargs).images
        if isinstance(images, list):
            images = np.stack([np.asarray(im) for im in images])
        np.save(f"{out}/{name}.npy", np.asarray(images))
    # diffusers' own step loop with the scheduler (ODE Euler), unguided
    model, sched = pipe.transformer, pipe.scheduler
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1, 32, 32, generator=gen)
    y = torch.tensor([3, 5])
    sched.set_timesteps(6)
    with torch.no_grad():
        for t in sched.timesteps:
            x = sched.step(model(x, t.expand(2), y), t, x).prev_sample
    np.save(f"{out}/loop.npy", x.numpy())
    half = DiffusionPipeline.from_pretrained(folder, trust_remote_code=True, dtype=torch.bfloat16)
    half.set_progress_bar_config(disable=True)
    images = half(class_labels=[3, 7], seed=0, output_type="np").images
    result["bf16"] = [str(half.transformer.dtype), list(images.shape), bool(np.isfinite(images).all())]
    np.save(f"{out}/bf16.npy", images)
    print(json.dumps(result))
""")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return export_model(DEMO_MODEL, tmp_path_factory.mktemp("export") / "demo", samples=False)


@pytest.fixture(scope="module")
def outside(folder, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("outside")
    proc = run_without_package(OUTSIDE, [str(folder), str(out), json.dumps(CALLS)], out)
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pipe() -> Vit5SitPipeline:
    p = Vit5SitPipeline.from_pretrained(DEMO_MODEL)
    p.set_progress_bar_config(disable=True)
    return p


def _ours(pipe, kwargs) -> np.ndarray:
    kwargs = dict(kwargs)
    if kwargs.get("generator") == "seeded":
        kwargs["generator"] = [torch.Generator().manual_seed(i) for i in range(len(kwargs["class_labels"]))]
    images = pipe(**kwargs).images
    return np.stack([np.asarray(im) for im in images]) if isinstance(images, list) else np.asarray(images)


def test_folder_has_diffusers_layout_beside_ours(folder):
    index = json.loads((folder / "model_index.json").read_text())
    stems = {name: index[name][0] for name in ("_class_name", "transformer", "scheduler")}
    assert index["_class_name"][1] == "Vit5SitDiffusersPipeline"
    assert index["transformer"][1] == "Vit5SitTransformer2DModel"
    for name, stem in stems.items():  # file stems carry a hash of their text: one diffusers module per code
        base = {"_class_name": "pipeline_vit5_sit", "transformer": "transformer_vit5_sit",
                "scheduler": "scheduling_vit5_sit"}[name]
        assert re.fullmatch(base + "_[0-9a-f]{10}", stem), stem
        path = folder / ("" if name == "_class_name" else name) / f"{stem}.py"
        assert hashlib.sha256(path.read_bytes()).hexdigest().startswith(stem[-10:])
    assert index["vae"] == [None, None] and index["guide"] == index["transformer"]  # the demo's guide went with it
    demo = load_config(DEMO_MODEL / "config.yaml").log  # the demo's default (docs/sampling.md "Guidance")
    assert (index["guidance_scale"], index["guidance_interval"]) == (3.0, [0.0, 0.5]) == (
        demo.sample_cfg_scale, demo.sample_guidance_interval)
    assert not (folder / "ema.safetensors").exists()  # one weights file each, read by both loaders
    weights = sorted(folder.rglob("*.safetensors"))
    assert weights == [folder / "guide" / "diffusion_pytorch_model.safetensors",
                       folder / "transformer" / "diffusion_pytorch_model.safetensors"]
    from vit5_sit.models.config import ModelConfig

    config = json.loads((folder / "transformer" / "config.json").read_text())
    import dataclasses

    assert {k for k in config if not k.startswith("_")} == {f.name for f in dataclasses.fields(ModelConfig)}
    codes = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py"))
    assert codes == [f"guide/{stems['transformer']}.py", f"{stems['_class_name']}.py",
                     f"scheduler/{stems['scheduler']}.py", f"transformer/{stems['transformer']}.py"]
    for name in codes:  # generated from the package's source, importing none of it
        text = (folder / name).read_text()
        imported = {(n.module or "") if isinstance(n, ast.ImportFrom) else a.name
                    for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import | ast.ImportFrom)
                    for a in n.names}
        assert not any(m.split(".")[0] in ("vit5_sit", "torchdiffeq") for m in imported), (name, imported)
        assert "written by vit5-sit" in text.splitlines()[0]
    model_code = (folder / codes[3]).read_text()
    assert "# ---- from vit5_sit.models.denoiser" in model_code and "class Denoiser(nn.Module):" in model_code


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CALLS))
def test_diffusers_alone_gives_the_pipelines_images_bit_for_bit(outside, pipe, name):
    out, result = outside
    assert result["class"] == "Vit5SitDiffusersPipeline" and result["dtype"] == "torch.float32"
    assert result["components"] == ["guide", "scheduler", "transformer", "vae"]  # vae: None here
    theirs = np.load(out / f"{name}.npy")
    ours = _ours(pipe, CALLS[name])
    assert theirs.shape == ours.shape and theirs.dtype == ours.dtype
    assert np.array_equal(theirs, ours)


@pytest.mark.slow
def test_scheduler_step_loop_is_ode_euler(outside, pipe):
    from vit5_sit.transport import SamplerConfig, Transport, sample

    out, _ = outside
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1, 32, 32, generator=gen)
    want = sample(pipe.model, x, torch.tensor([3, 5]), Transport(), SamplerConfig(steps=6)).samples
    assert np.array_equal(np.load(out / "loop.npy"), want.numpy())


@pytest.mark.slow
def test_bfloat16_loads_and_samples(outside, pipe):
    out, result = outside
    assert result["bf16"] == ["torch.bfloat16", [2, 32, 32, 3], True]
    bf16 = np.load(out / "bf16.npy")
    ours = pipe([3, 7], seed=0, output_type="np").images
    assert np.abs(bf16 - ours).mean() < 0.05  # the same digits, to bfloat16's precision


def test_one_step_demo_folder_loads_in_diffusers_without_the_package(tmp_path):
    """The bundled MeanFlow demo, exported: diffusers' DiffusionPipeline (no vit5_sit importable) samples it in 1
    and 2 steps, bit for bit as Vit5SitPipeline does; the scheduler's step loop, ODE Euler only, refuses it."""
    from vit5_sit.hub.files import BUNDLED_MODELS

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = export_model(BUNDLED_MODELS["demo-1step"], tmp_path / "one-step", samples=False)
    calls = {"default": dict(class_labels=[0, 3, 7], seed=0),
             "two": dict(class_labels=[1, 2], seed=4, num_inference_steps=2)}
    script = OUTSIDE.split("# diffusers' own step loop")[0] + textwrap.dedent("""
        sched = pipe.scheduler
        try:
            sched.set_timesteps(6)
            result["loop"] = "ran"
        except ValueError as e:
            result["loop"] = str(e)
        print(json.dumps(result))
    """)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_without_package(script, [str(folder), str(out), json.dumps(calls)], out)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "this scheduler's sampler is meanflow" in result["loop"]
    pipe = Vit5SitPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    for name, kwargs in calls.items():
        assert np.array_equal(_ours(pipe, kwargs), np.load(out / f"{name}.npy")), name


def test_folder_with_a_guide_and_bad_inputs_without_the_package(tmp_path):
    """#53 / #52 from outside: a tiny model saved with a guide, loaded by diffusers where vit5_sit cannot be imported:
    the guided images equal Vit5SitPipeline's bit for bit, every bad input is one ValueError (nothing hangs), dopri5
    without torchdiffeq is one ImportError naming it, and save_pretrained writes a folder that loads again and gives
    the same images."""
    from vit5_sit.config import load_config
    from vit5_sit.models import create_model

    cfg = load_config(None, ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=32", "model.num_heads=2",
                             "data.kind=mnist", "data.resolution=8", "sampler.steps=2"])
    torch.manual_seed(0)
    model, guide = create_model(cfg.model_config()), create_model(cfg.model_config())
    with torch.no_grad():
        for p in (*model.parameters(), *guide.parameters()):
            p.add_(torch.randn_like(p) * 0.05)
    pipe = Vit5SitPipeline(model, cfg, guide=guide)
    pipe.set_progress_bar_config(disable=True)
    folder = pipe.save_pretrained(tmp_path / "guided")
    script = textwrap.dedent("""
        import numpy as np, torch
        from diffusers import DiffusionPipeline
        folder, out = sys.argv[1], sys.argv[2]
        pipe = DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)
        pipe.set_progress_bar_config(disable=True)
        np.save(f"{out}/guided.npy", pipe([0, 7], seed=2, guidance_scale=2.0, output_type="np").images)
        bad = [dict(class_labels=[1, 2], num_images_per_prompt=10**12), dict(class_labels=[1], batch_size=0),
               dict(class_labels=[1.5]), dict(class_labels=torch.tensor([1.7])),
               dict(class_labels=torch.tensor([True])),
               dict(class_labels=[1], return_dict="no"), dict(class_labels=range(10**12)),
               dict(class_labels=[1], guidance_scale=float("inf")), dict(class_labels=[1], method="nope")]
        errors = []
        for kwargs in bad:
            try:
                pipe(**kwargs)
                errors.append("accepted")
            except ValueError as e:
                errors.append(str(e))
        assert np.int64(3) is not None and pipe(np.int64(3), seed=0, output_type="np").images.shape == (1, 8, 8, 3)
        try:  # torchdiffeq is blocked here, as in a Python with diffusers alone
            pipe([1, 2], seed=0, method="dopri5", output_type="np")
            errors.append("dopri5 ran")
        except ImportError as e:
            errors.append(str(e))
        pipe.save_pretrained(f"{out}/saved")
        again = DiffusionPipeline.from_pretrained(f"{out}/saved", trust_remote_code=True)
        again.set_progress_bar_config(disable=True)
        np.save(f"{out}/again.npy", again([0, 7], seed=2, guidance_scale=2.0, output_type="np").images)
        print(json.dumps(errors))
    """)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_without_package(script, [str(folder), str(out)], out)
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "accepted" not in errors and all("\n" not in e for e in errors), errors
    for error, word in zip(errors, ["num_images_per_prompt", "batch_size", "1.5", "1.70", "True", "return_dict",
                                    "class labels", "guidance_scale", "nope", "pip install torchdiffeq"]):
        assert word in error, (word, error)
    want = pipe([0, 7], seed=2, guidance_scale=2.0, output_type="np").images
    assert np.array_equal(np.load(out / "guided.npy"), want)
    assert np.array_equal(np.load(out / "again.npy"), want)
