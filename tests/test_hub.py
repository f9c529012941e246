"""vit5_sit.hub.api: save_pretrained / from_pretrained round trips, the model card, Hub repo ids served from a local
Hugging Face cache offline, the offline error for a missing repo, and push_to_hub with the upload mocked at the
huggingface_hub API boundary. Nothing here touches the network (HF_HUB_OFFLINE=1, or the API calls mocked)."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from tinydata import needs_inception

from vit5_sit.config import load_config, save_config
from vit5_sit.demo.export import export_model
from vit5_sit.demo.export import main as demo_main
from vit5_sit.hub import api as hub
from vit5_sit.hub.model_files import ModelLoadError, load_for_sampling
from vit5_sit.models import create_model
from vit5_sit.sampling.generate import sample_images
from vit5_sit.train.checkpoint import save_checkpoint
from vit5_sit.transport import SamplerConfig, Transport

ROOT = Path(__file__).resolve().parent.parent
TINY = ["name=tiny-hub", "model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=64", "model.num_heads=2",
        "data.kind=mnist", "data.resolution=8", "sampler.steps=3", "log.sample_cfg_scale=2.5"]
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


# diffusers' layout beside our files (vit5_sit.hub.layout); the weights are transformer/'s safetensors
LAYOUT = ["model_index.json", "pipeline_vit5_sit.py", "scheduler/scheduler_config.json",
          "scheduler/scheduling_vit5_sit.py", "transformer/config.json",
          "transformer/diffusion_pytorch_model.safetensors", "transformer/transformer_vit5_sit.py"]


def _plain(names) -> list[str]:
    """Sorted file names with the code files' content hash dropped (pipeline_vit5_sit_0123456789.py ->
    pipeline_vit5_sit.py: `vit5_sit.hub.layout`)."""
    return sorted(re.sub(r"_[0-9a-f]{10}\.py$", ".py", str(name)) for name in names)


def _files(folder: Path) -> list[str]:
    """Every file under a folder, as sorted relative paths."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _tiny(seed: int = 0):
    cfg = load_config(None, TINY)
    torch.manual_seed(seed)
    model = create_model(cfg.model_config())
    with torch.no_grad():  # a fresh DiT outputs zeros (adaLN-Zero): perturb it so that classes differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return cfg, model.eval()


def _samples(model) -> np.ndarray:
    return sample_images(model, Transport(), SamplerConfig(steps=3), [0, 1, 2], [5, 6, 7])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    cfg, model = _tiny()
    hub.PretrainedModel(model, cfg).save_pretrained(folder)
    return folder


@pytest.fixture()
def hf_cache(tmp_path, model_dir) -> Path:
    """A Hugging Face cache holding the repo me/tiny-vit5, laid out as huggingface_hub lays it out."""
    cache = tmp_path / "hf-cache"
    repo = cache / "models--me--tiny-vit5"
    snapshot = repo / "snapshots" / REVISION
    blobs = repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for name in ("config.yaml", hub.WEIGHTS_FILE, "README.md"):  # blobs by content, linked from the snapshot
        data = (model_dir / name).read_bytes()
        import hashlib

        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(Path("../" * (name.count("/") + 2)) / "blobs" / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return cache


# ----------------------------------------------------------------------------------------------------------
# save_pretrained / from_pretrained and the card.

def test_save_and_load_round_trip_keeps_weights_and_samples(tmp_path):
    cfg, model = _tiny(3)
    out = hub.PretrainedModel(model, cfg).save_pretrained(tmp_path / "m")
    assert _plain(_files(out)) == sorted(["README.md", "config.yaml", *LAYOUT])
    back = hub.PretrainedModel.from_pretrained(out)
    a, b = model.state_dict(), back.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert np.array_equal(_samples(model), _samples(back.model))
    assert back.config.log.sample_cfg_scale == 2.5 and back.metrics == []


def test_save_pretrained_dtype_halves_the_weights(tmp_path, model_dir):
    m = hub.PretrainedModel.from_pretrained(model_dir)
    out = m.save_pretrained(tmp_path / "half", dtype=torch.float16)
    assert {v.dtype for v in load_file(str(out / hub.WEIGHTS_FILE)).values()} == {torch.float16}
    assert (out / hub.WEIGHTS_FILE).stat().st_size < 0.6 * (model_dir / hub.WEIGHTS_FILE).stat().st_size


def test_model_card_names_preset_parameters_steps_dataset_sampler(model_dir):
    card = (model_dir / "README.md").read_text()
    cfg, model = _tiny()
    params = sum(v.numel() for v in model.state_dict().values())
    assert card.startswith("---\n") and "library_name: vit5-sit" in card
    for text in ("# tiny-hub", "`ViT5-T/4` with ", "`hidden_size=64`", "`depth=1`", f"{params:,}", "RoPE on",
                 "4 registers",
                 f"{cfg.train.max_steps:,} steps of batch {cfg.train.global_batch_size}", "MNIST",
                 "ode euler, 3 steps, guidance scale 2.5", "None measured"):
        assert text in card, text


@pytest.mark.parametrize("preset, family", [("SiT-T/4", "SiT (vanilla ViT) denoiser"), ("ViT5G-T/4", "ViT-5 denoiser"),
                                            ("SiTRoPE-T/4", "SiT (vanilla ViT) with 2D RoPE denoiser")])
def test_model_card_names_the_backbone_family_of_each_preset(preset, family):
    card = hub.model_card(load_config(None, [f"model.preset={preset}"]), 1000)
    assert f"A class-conditional {family}" in card and f"`{preset}`" in card


MEANFLOW = [*TINY[:-2], "train.objective=meanflow"]  # the tiny model, one-step: its sampler is MeanFlow's 1 step
ONE_STEP_ROWS = [{"settings": f"n1000_seed0_meanflow_euler_{n}steps_cfg1", "step": 3000, "fid": fid,
                  "num_samples": 1000, "digit_accuracy": acc}
                 for n, fid, acc in ((2, 51.552, 0.997), (1, 111.325, 0.994))]


def _body(card: str) -> str:
    return card.split("\n---\n", 1)[1]  # after the metadata


def test_one_step_card_says_meanflow_its_steps_trained_guidance_and_quality():
    cfg = load_config(None, [*MEANFLOW, "meanflow.guidance_scale=3", "meanflow.guidance_interval=[0.25,1.0]",
                             "meanflow.guidance_mix=0.5"])
    card = hub.model_card(cfg, 1000, ONE_STEP_ROWS)
    body = _body(card)
    assert "A class-conditional one-step" in body and "This is a **MeanFlow** model" in body
    assert "| sampler defaults | meanflow euler, 1 step, guidance scale 1 |" in body
    assert "samples in **1 step** by default" in body
    assert "| trained guidance | trained in: scale 3 for t in [0.25, 1], mixing 0.5" in body
    assert "**Guidance is trained in**: classifier-free guidance of scale 3, for t in [0.25, 1]" in body
    assert "Do not give guidance again when sampling" in body
    assert "FID 111.33 in 1 step (digit accuracy 0.994), FID 51.55 in 2 steps (digit accuracy 0.997)" in body
    assert "guidance_scale=" not in body.split("## Use")[1]  # the examples guide no second time
    assert "pipe(class_labels=[0, 1, 2], seed=0).images  # 1 step, guidance trained in" in body
    assert "- meanflow" in card.split("\n---\n", 1)[0]


def test_one_step_card_without_trained_guidance_and_a_flow_card_say_so():
    one = _body(hub.model_card(load_config(None, [*MEANFLOW, "sampler.steps=2"]), 1000))
    assert "samples in **2 steps** by default" in one and "No guidance is trained in" in one
    assert "Guidance is trained in" not in one and "| trained guidance | none trained in" in one
    flow = _body(hub.model_card(load_config(None, TINY), 1000, ONE_STEP_ROWS[:1]))
    assert "**MeanFlow**" not in flow and "trained guidance" not in flow and "one-step" not in flow
    assert "| sampler defaults | ode euler, 3 steps, guidance scale 2.5 |" in flow
    assert "pipe(class_labels=[0, 1, 2], guidance_scale=2.5, seed=0).images" in flow


def test_bundled_one_step_demo_card_says_what_it_is():
    """The card the bundled MeanFlow demo gets when written again (its config and metrics.json)."""
    from vit5_sit.hub.files import BUNDLED_MODELS

    body = _body(hub.PretrainedModel.from_pretrained(BUNDLED_MODELS["demo-1step"]).model_card())
    assert "This is an **improved MeanFlow** (iMF) model" in body and "samples in **1 step** by default" in body
    assert "**Guidance is an input of the network**" in body and "trained on scales from 1 to 8" in body
    assert "| started from | the flow model `demo`, converted and fine-tuned (`train.init_from`) |" in body
    rows = {r["settings"]: r for r in json.loads((BUNDLED_MODELS["demo-1step"] / "metrics.json").read_text())}
    one, two = rows["n1000_seed0_meanflow_euler_1steps_cfg3"], rows["n1000_seed0_meanflow_euler_2steps_cfg3"]
    assert f"FID {one['fid']:.2f} in 1 step (digit accuracy {one['digit_accuracy']:.3f})" in body
    assert f"FID {two['fid']:.2f} in 2 steps" in body
    assert "| output | x-prediction (pMF)" in body  # the network gives the data point
    assert "`benchmarks/bench_guidance.py` |" in body  # who measured the rows


def _run_with_metrics(tmp_path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    cfg, old = _tiny(1)
    _, new = _tiny(0)
    save_config(cfg, run / "config.yaml")
    save_checkpoint(run, 10, old.state_dict(), old.state_dict(), {"optimizer": {}})
    save_checkpoint(run, 20, new.state_dict(), new.state_dict(), {"optimizer": {}})
    cache = run / "eval" / "n500_seed0_ode_euler_50steps_cfg1"
    cache.mkdir(parents=True)
    for step, fid in ((10, 250.0), (20, 123.456)):
        key = {"reference": {"path": "/data/refs/mnist.npz"}, "inception": "x", "metrics": ["fid"]}
        result = {"fid": fid, "precision": 0.5, "recall": 0.25, "num_samples": 500, "skipped": {}}
        (cache / f"step_{step:07d}.metrics-abcdef.json").write_text(json.dumps({"key": key, "result": result}))
    return run


def test_card_front_matter_license_task_dataset_and_model_index(tmp_path):
    import yaml

    import vit5_sit

    cfg, model = _tiny()
    metrics = [{"settings": "n1000-s0", "step": 7, "reference": "mnist.npz", "fid": 42.5, "sfid": 50.25,
                "digit_accuracy": 0.975}]
    card = hub.PretrainedModel(model, cfg, metrics=metrics).model_card("me/tiny")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] == "mit" and front["library_name"] == "vit5-sit"
    assert front["pipeline_tag"] == "unconditional-image-generation" and front["datasets"] == ["ylecun/mnist"]
    results = front["model-index"][0]["results"]
    assert {m["type"]: m["value"] for r in results for m in r["metrics"]} == {
        "fid": 42.5, "sfid": 50.25, "digit_accuracy": 0.975}  # every metric key present, sFID included
    assert all(r["dataset"]["type"] == "ylecun/mnist" for r in results)
    for needle in ("arXiv:2401.08740", "arXiv:2602.08071", "Peebles", "## Intended use and limits",
                   "## Training", f"vit5-sit {vit5_sit.__version__}", 'from_pretrained("me/tiny")'):
        assert needle in card, needle
    assert "PATH_OR_REPO_ID" not in card and "replace `OWNER/NAME`" not in card


def test_card_model_index_has_only_metrics_rounded_and_both_ways_to_load(monkeypatch):
    import yaml

    cfg, model = _tiny()
    metrics = [{"settings": "n500", "step": 7, "reference": "mnist.npz", "fid": 445.0503707000177,
                "precision": 0.123456789, "num_samples": 500, "num_reference": 5000, "kid_subset_size": 100}]
    card = hub.PretrainedModel(model, cfg, metrics=metrics).model_card("me/tiny")
    front = yaml.safe_load(card.split("---\n")[1])
    values = {m["type"]: m["value"] for r in front["model-index"][0]["results"] for m in r["metrics"]}
    assert values == {"fid": 445.1, "precision": 0.1235}  # no num_reference / kid_subset_size; 4 digits
    assert "num reference" not in card.split("## Training")[0]  # nor a column of the metrics table
    # both ways to load, the home page from [project.urls]
    assert 'DiffusionPipeline.from_pretrained("me/tiny", trust_remote_code=True)' in card
    assert 'Vit5SitPipeline.from_pretrained("me/tiny")' in card
    assert hub.package_home() == "https://github.com/vit5-sit/vit5-sit" and "github.com/vit5-sit/vit5-sit" in card
    monkeypatch.setattr(hub, "package_home", lambda: None)  # no home page: the folder carries the code
    card = hub.PretrainedModel(model, cfg, metrics=metrics).model_card("me/tiny")
    assert "github.com" not in card and "the folder carries the code diffusers needs" in card


def test_card_without_repo_id_says_how_to_fill_it_and_shows_a_sample_grid_when_present(tmp_path):
    cfg, model = _tiny()
    assert "## Samples" not in hub.PretrainedModel(model, cfg).model_card()
    (tmp_path / hub.SAMPLES_FILE).write_bytes(b"png")
    hub.PretrainedModel(model, cfg).save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert "replace `OWNER/NAME` with the Hub repo id" in card and "None measured" in card
    assert f"![samples of every class row by row]({hub.SAMPLES_FILE})" in card
    assert "license: mit" in card and "model-index" not in card  # nothing measured: no model-index


def test_version_comes_from_the_package_metadata_or_pyproject():
    import tomllib

    import vit5_sit

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert vit5_sit.__version__ == pyproject == vit5_sit.PYPROJECT_VERSION


def test_export_writes_card_with_the_measured_metrics_of_that_step(tmp_path):
    run = _run_with_metrics(tmp_path)
    out = export_model(run, tmp_path / "exported", cfg_scale=3.0, repo_id="me/tiny-vit5")
    cfg = load_config(out / "config.yaml")
    assert cfg.train.max_steps == 20 and cfg.log.sample_cfg_scale == 3.0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [m["fid"] for m in metrics] == [123.456] and metrics[0]["reference"] == "mnist.npz"
    card = (out / "README.md").read_text()
    assert "| samples | FID | precision | recall | measured by |" in card  # the metrics present, no n/a columns
    assert ("| 20 | `n500_seed0_ode_euler_50steps_cfg1` | mnist.npz | 500 | 123.46 | 0.500 | 0.250 | "
            "`eval_fid.py compare` |") in card
    assert "20 steps of batch" in card and "Vit5SitPipeline.from_pretrained(\"me/tiny-vit5\")" in card
    assert {v.dtype for v in load_file(str(out / hub.WEIGHTS_FILE)).values()} == {torch.float16}
    # from_pretrained of the run itself: the newest checkpoint, its step and metrics
    m = hub.PretrainedModel.from_pretrained(run)
    assert m.config.train.max_steps == 20 and [r["fid"] for r in m.metrics] == [123.456]
    again = hub.PretrainedModel.from_pretrained(out)
    assert again.metrics == metrics


def test_collect_metrics_adds_the_studys_digit_accuracy_of_the_same_samples(tmp_path):
    """The study's evaluation caches digit accuracy beside the metrics (step_N.digits-*.json); the card takes it
    when it was measured on the same samples (the same sha256), never another sample set's."""
    cache = tmp_path / "eval" / "n1000_seed0_meanflow_euler_1steps_cfg1"
    cache.mkdir(parents=True)
    key = {"reference": {"path": "/x/reference.npz"}, "samples": "aa"}
    (cache / "step_0000030.metrics-1.json").write_text(json.dumps({"key": key, "result": {"fid": 111.3}}))
    (cache / "step_0000030.digits-1.json").write_text(json.dumps({"key": {"samples": "bb"}, "digit_accuracy": 0.5}))
    assert [set(r) - {"settings", "step", "reference"} for r in hub.collect_metrics(tmp_path, 30)] == [{"fid"}]
    (cache / "step_0000030.digits-2.json").write_text(json.dumps({"key": {"samples": "aa"}, "digit_accuracy": 0.994}))
    (row,) = hub.collect_metrics(tmp_path, 30)
    assert row["fid"] == 111.3 and row["digit_accuracy"] == 0.994


def test_export_draws_the_grid_sample_py_draws_and_the_card_shows_it(tmp_path, capsys):
    from vit5_sit.cli.sample import main as sample_main

    run = _run_with_metrics(tmp_path)
    out = tmp_path / "exported"
    assert demo_main(["export", str(run), "--out", str(out), "--cfg-scale", "3"]) == 0
    assert _plain(_files(out)) == sorted(["README.md", "config.yaml", "metrics.json", "samples.png",
                                *LAYOUT])  # no lock or temporary file left
    assert f"![samples of every class row by row]({hub.SAMPLES_FILE})" in (out / "README.md").read_text()
    assert sample_main(["--ckpt", str(out), "--out", str(tmp_path / "cli.png"), "--no-progress"]) == 0
    exported, cli = Image.open(out / hub.SAMPLES_FILE), Image.open(tmp_path / "cli.png")
    assert exported.size == cli.size and np.array_equal(np.asarray(exported), np.asarray(cli))
    assert "ode/euler 3 steps" in capsys.readouterr().out and exported.size[1] > 10 * 8  # 10 rows of 8px digits
    # exported again without a grid: the earlier one is gone (it showed other weights), and the card says nothing
    assert demo_main(["export", str(run / "checkpoints" / "step_0000010"), "--out", str(out), "--no-samples"]) == 0
    assert not (out / hub.SAMPLES_FILE).exists() and "## Samples" not in (out / "README.md").read_text()



def test_card_recommendation_is_the_generation_studys_report():
    """The numbers and verdicts every card states (vit5_sit.hub.advice) are the study's committed report."""
    from guidance_records import default_guidance_fids

    from vit5_sit.hub.advice import GENERATION_STUDY, GUIDED_PAIRED, GUIDED_STUDY, UNGUIDED_PAIRED, VERDICT
    from vit5_sit.study.intervals import t_interval

    study = json.loads((Path(__file__).parents[1] / "docs/study/generation/study.json").read_text())
    last = max(study["steps"])
    cells = {(a["arm"], a["cfg_scale"]): (round(a["mean"], 1), round(a["sd"], 1), a["n"])
             for a in study["aggregate"]["fid"] if a["step"] == last}
    assert {k: cells[k] for k in GENERATION_STUDY} == GENERATION_STUDY
    picks = {d["cfg_scale"]: d["winner"] if d["resolved"] else d["reference"] for d in study["decisions"]}
    assert picks == VERDICT
    unguided = next(d for d in study["decisions"] if d["cfg_scale"] == 1.0)
    pair = next(c for c in unguided["comparisons"] if (c["arm"], c["against"]) == (VERDICT[1.0], "vit5-nols"))
    fid = {(r["arm"], r["seed"]): r["fid"] for r in study["rows"]
           if r["step"] == last and r["cfg_scale"] == 1.0 and r.get("sample_seed", 0) == 0}
    ahead = sum(fid[(VERDICT[1.0], s)] < fid[("vit5-nols", s)] for s in pair["shared"])
    assert UNGUIDED_PAIRED == (ahead, len(pair["shared"]), tuple(round(x, 1) for x in pair["paired_t"]))
    guided = default_guidance_fids()  # the default guidance's records (issue #52): arm -> {seed: FID}
    for arm, (mean, sd, n) in GUIDED_STUDY.items():
        fids = list(guided[arm].values())
        assert (round(float(np.mean(fids)), 1), round(float(np.std(fids, ddof=1)), 1), len(fids)) == (mean, sd, n)
    shared = sorted(set(guided["sit-rope"]) & set(guided["vit5-nols"]))
    diffs = [guided["sit-rope"][s] - guided["vit5-nols"][s] for s in shared]
    assert GUIDED_PAIRED == (sum(d < 0 for d in diffs), len(shared), tuple(round(x, 1) for x in t_interval(diffs)))
    card = hub.model_card(load_config("configs/mnist/vit5g.yaml"), 1000)
    assert "SiT + 2D RoPE 33.9 ± 1.1 over 3 seeds and ViT5G 38.1 ± 1.0 over 3 seeds" in card
    assert "## Choosing a backbone" in card and "**Without guidance: `SiTRoPE-*`** (SiT + 2D RoPE 55.1 ± 1.9" in card
    assert "bit for bit only with the same vit5-sit version" in card

def test_bundled_demo_loads():
    m = hub.PretrainedModel.from_pretrained()
    assert m.model.cfg.num_classes == 10 and m.num_parameters() > 1_000_000
    assert "# " in m.model_card()


def test_bundled_demo_card_has_its_measured_metrics_and_sample_grid(tmp_path):
    import yaml

    from vit5_sit.hub.model_files import DEMO_MODEL

    m = hub.PretrainedModel.from_pretrained()
    record = json.loads((ROOT / "docs" / "study" / "guidance" / "demo.json").read_text())
    default = next(r for r in record["rows"] if r["cell"] == "auto:folder@3@0-0.5" and r["seed"] == 0)  # as shipped
    assert (m.config.log.sample_cfg_scale, m.config.log.sample_guidance_interval) == (3.0, [0.0, 0.5])
    assert [(r["num_samples"], r["digit_accuracy"]) for r in m.metrics] == [
        (1000, default["digit_accuracy"]), (1000, 0.994), (1000, 0.872), (1000, 1.0)]
    assert all(r["step"] == m.config.train.max_steps == 3600 for r in m.metrics)
    grid = Image.open(DEMO_MODEL / hub.SAMPLES_FILE)
    assert grid.size[1] > grid.size[0] and (DEMO_MODEL / hub.SAMPLES_FILE).stat().st_size < 100_000  # 10 rows x 4
    card = m.model_card("me/vit5-mnist")
    assert "None measured" not in card and "A class-conditional ViT-5 denoiser" in card
    assert f"![samples of every class row by row]({hub.SAMPLES_FILE})" in card
    assert "| sampler defaults | ode euler, 6 steps, autoguidance weight 3 on t in [0, 0.5] with the guide in " in card
    assert "## Guidance: autoguidance" in card
    assert ("| 3600 | `n1000_seed0_ode_euler_6steps_auto3_guide-folder_gi0-0.5` | reference.npz | 1,000 | "
            f"{default['fid']:.2f} | {default['sfid']:.2f} | {default['precision']:.3f} | {default['recall']:.3f} | "
            f"{default['digit_accuracy']:.3f} |") in card
    assert ("| 3600 | `n1000_seed0_ode_euler_6steps_cfg6` | all 5,000 real digits (data/mnist32), torch-fidelity "
            "Inception pool3 | 1,000 | 66.56 | n/a | n/a | n/a | 1.000 | n/a | `benchmarks/bench_frontier.py") in card
    assert ("| 3600 | `n1000_seed0_ode_euler_6steps_cfg2.5` | all 5,000 real digits (data/mnist32), torch-fidelity "
            "Inception pool3 | 1,000 | 48.31 | 86.09 | 0.195 | 0.257 | 0.994 | n/a | `benchmarks/bench_guidance.py") \
        in card
    front = yaml.safe_load(card.split("---\n")[1])
    index = [(x["type"], x["value"], x["config"]) for r in front["model-index"][0]["results"] for x in r["metrics"]]
    auto = "n1000_seed0_ode_euler_6steps_auto3_guide-folder_gi0-0.5"
    assert ("fid", round(default["fid"], 2), auto) in index  # the default's (docs/sampling.md)
    assert ("digit_accuracy", default["digit_accuracy"], auto) in index
    assert ("digit_accuracy", 1.0, "n1000_seed0_ode_euler_6steps_cfg6") in index
    assert ("fid", 66.56, "n1000_seed0_ode_euler_6steps_cfg6") in index
    assert ("fid", 48.31, "n1000_seed0_ode_euler_6steps_cfg2.5") in index
    assert ("digit_accuracy", 0.994, "n1000_seed0_ode_euler_6steps_cfg2.5") in index and len(index) == 18
    # the grid default is the frontier's pick (benchmarks/README.md): the rows measure the folder's own sampler
    assert (m.config.sampler.method, m.config.sampler.steps) == ("euler", 6)
    # saved elsewhere (push_to_hub saves first): the grid and the metrics travel with the weights
    out = m.save_pretrained(tmp_path / "demo")
    assert (out / hub.SAMPLES_FILE).read_bytes() == (DEMO_MODEL / hub.SAMPLES_FILE).read_bytes()
    assert hub.read_metrics(out) == m.metrics and f"]({hub.SAMPLES_FILE})" in (out / "README.md").read_text()


def test_the_readme_picture_of_sample_py_is_what_it_draws():
    """docs/demo_samples.png (the README's `python sample.py`) is the demo folder's samples.png: both are drawn
    by sample.py with the demo's defaults (test_export_draws_the_grid_sample_py_draws... checks that drawing)."""
    from vit5_sit.hub.model_files import DEMO_MODEL

    docs, demo = Image.open(ROOT / "docs" / "demo_samples.png"), Image.open(DEMO_MODEL / hub.SAMPLES_FILE)
    assert docs.size == demo.size and np.array_equal(np.asarray(docs), np.asarray(demo))


# ----------------------------------------------------------------------------------------------------------
# Repo ids: the local cache, offline.

@pytest.mark.parametrize("spec, expect", [
    ("me/tiny-vit5", ("me/tiny-vit5", None)),
    ("me/tiny-vit5@v1.0", ("me/tiny-vit5", "v1.0")),
    ("stabilityai/sd-vae-ft-ema", ("stabilityai/sd-vae-ft-ema", None)),
    ("runs/study/mnist-vit5", None),   # two slashes: a path
    ("./me/tiny", None),
    ("/abs/path", None),
    ("model.pt", None),
])
def test_parse_repo_spec(spec, expect):
    assert hub.parse_repo_spec(spec) == expect


IDS = ["me/tiny-vit5", "me/x_", "_a/b", "me/-x", "me/x.", "me/a..b", "me/a--b", "me/x.git", "me/" + "a" * 96,
       "me/" + "a" * 97, "a.b/c-d.e", "me/x y", "me/é"]


@pytest.mark.parametrize("repo_id", IDS)
def test_repo_id_rules_are_the_hubs(repo_id):
    """Our check refuses exactly what huggingface_hub's own validation refuses (which raised from inside it)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
        valid = repo_id != "me/é"  # the Hub's regex takes any Unicode letter; its servers take ASCII only
    except HFValidationError:
        valid = False
    assert (hub.repo_id_problem(repo_id) is None) == valid


@pytest.mark.parametrize("repo_id", ["me/-x", "me/a..b", "me/x.git"])
def test_invalid_repo_ids_are_one_line_before_any_download(repo_id, tmp_path):
    with pytest.raises(ModelLoadError, match=f"{repo_id}: .*not a valid repo id: a Hub repo id"):
        load_for_sampling(repo_id)  # was huggingface_hub's HFValidationError traceback
    with pytest.raises(hub.HubError, match=f"--push {repo_id}: a Hub repo id"):
        hub.push_folder(tmp_path, repo_id)


def test_model_files_and_hub_import_one_way():
    """checks -> hub_files -> model_files -> hub: the modules that load models never import `vit5_sit.hub.api`
    (not even inside a function), so there is no import cycle to break at call time."""
    import ast

    import vit5_sit.common.checks
    import vit5_sit.hub.files
    import vit5_sit.hub.model_files

    for module in (vit5_sit.hub.files, vit5_sit.hub.model_files):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "vit5_sit.hub.api" not in imported, module.__name__
    assert hub.ModelLoadError is vit5_sit.hub.model_files.ModelLoadError is vit5_sit.common.checks.ModelLoadError
    assert hub.resolve_model_path is vit5_sit.hub.files.resolve_model_path  # the old names still work


def test_cached_repo_loads_offline(hf_cache, model_dir, monkeypatch):
    import huggingface_hub.constants

    want = load_file(str(model_dir / hub.WEIGHTS_FILE))
    for kwargs in ({}, {"revision": REVISION}, {"revision": "main"}):
        m = hub.PretrainedModel.from_pretrained("me/tiny-vit5", cache_dir=hf_cache, **kwargs)
        got = m.model.state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want)
    # what sample.py --ckpt and eval_fid.py use: the cache from HF_HUB_CACHE (huggingface_hub's constant)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf_cache))
    model, cfg = load_for_sampling("me/tiny-vit5")
    assert cfg.name == "tiny-hub" and np.array_equal(_samples(model), _samples(load_for_sampling(model_dir)[0]))
    model, _ = load_for_sampling(f"me/tiny-vit5@{REVISION}")


def test_missing_repo_offline_fails_at_once_with_one_line(tmp_path):
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as err:
        hub.PretrainedModel.from_pretrained("me/not-cached", cache_dir=tmp_path / "empty-cache")
    assert time.perf_counter() - start < 2.0
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("me/not-cached: ")
    assert "HF_HUB_OFFLINE=1" in msg and "hf download me/not-cached" in msg and "local model folder" in msg


@pytest.mark.parametrize("spec, message", [("x" * 300, "a path part of 300 bytes"),
                                           ("me/" + "x" * 300, "a path part of 300 bytes"),
                                           ("a/" * 2100, "4,200 bytes long")], ids=["name", "repo", "path"])
def test_a_path_too_long_for_the_os_is_a_model_load_error(spec, message):
    """Path.exists raised "File name too long" (OSError) out of from_pretrained and load_for_sampling."""
    with pytest.raises(ModelLoadError, match=message):
        hub.PretrainedModel.from_pretrained(spec)


def test_unreachable_hub_uses_the_cache_without_retries(hf_cache, tmp_path, monkeypatch):
    """No HF_HUB_OFFLINE, but no network (the one probe fails): cached repos load, missing ones fail at once."""
    import vit5_sit.data.vae

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(vit5_sit.data.vae, "hub_reachable", lambda: False)
    assert hub.PretrainedModel.from_pretrained("me/tiny-vit5", cache_dir=hf_cache).config.name == "tiny-hub"
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match=r"^me/gone: .*offline \(https://huggingface.co unreachable\) and me/gone"):
        hub.PretrainedModel.from_pretrained("me/gone", cache_dir=hf_cache)
    assert time.perf_counter() - start < 2.0


def test_not_a_model_repo_is_named(hf_cache, tmp_path):
    (hf_cache / "models--me--tiny-vit5" / "snapshots" / REVISION / "config.yaml").unlink()
    with pytest.raises(ModelLoadError, match=r"me/tiny-vit5: not a vit5-sit model repo \(needs config.yaml"):
        hub.PretrainedModel.from_pretrained("me/tiny-vit5", cache_dir=hf_cache)


def _load_sample_cli():
    spec = importlib.util.spec_from_file_location("sample", ROOT / "sample.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sample"] = module
    spec.loader.exec_module(module)
    return module


def test_sample_cli_takes_a_repo_id(hf_cache, model_dir, tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf_cache))
    sample = _load_sample_cli()
    args = ["--classes", "0-2", "--per-class", "2", "--no-progress"]
    assert sample.main(["--ckpt", "me/tiny-vit5", "--out", str(tmp_path / "hub.png"), *args]) == 0
    assert sample.main(["--ckpt", str(model_dir), "--out", str(tmp_path / "dir.png"), *args]) == 0
    assert np.array_equal(np.asarray(Image.open(tmp_path / "hub.png")), np.asarray(Image.open(tmp_path / "dir.png")))
    capsys.readouterr()
    assert sample.main(["--ckpt", "me/missing", "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --ckpt: me/missing: no such file or folder here; as a Hub repo id: offline")
    assert "\n" not in err and not (tmp_path / "x.png").exists()


# ----------------------------------------------------------------------------------------------------------
# push_to_hub, with huggingface_hub's HfApi calls mocked: what would be sent.

@pytest.fixture()
def fake_hub(monkeypatch):
    """HfApi.create_repo / upload_folder replaced: records the repo and the files of each upload."""
    from huggingface_hub import CommitInfo, HfApi, RepoUrl

    monkeypatch.delenv("HF_HUB_OFFLINE")
    sent = {"created": [], "uploads": []}

    def create_repo(self, repo_id, **kwargs):
        sent["created"].append((repo_id, kwargs))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, allow_patterns=None, **kwargs):
        files = {name: (Path(folder_path) / name).read_bytes() for name in _files(Path(folder_path))
                 if allow_patterns is None or any(fnmatch.fnmatch(name, p) for p in allow_patterns)}
        sent["uploads"].append({"repo_id": repo_id, "files": files, **kwargs})
        return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/abc", commit_message="m",
                          commit_description="", oid="abc")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return sent


def test_push_to_hub_sends_config_weights_and_card(fake_hub, tmp_path):
    cfg, model = _tiny(2)
    url = hub.PretrainedModel(model, cfg, metrics=[{"step": 7, "settings": "s", "fid": 42.0}]).push_to_hub(
        "me/pushed", private=True)
    assert url == "https://huggingface.co/me/pushed/commit/abc"
    assert fake_hub["created"] == [("me/pushed", {"repo_type": "model", "private": True, "exist_ok": True})]
    (upload,) = fake_hub["uploads"]
    assert upload["repo_id"] == "me/pushed" and upload["repo_type"] == "model"
    assert _plain(upload["files"]) == sorted(["README.md", "config.yaml", "metrics.json", *LAYOUT])
    card = upload["files"]["README.md"].decode()
    assert "Vit5SitPipeline.from_pretrained(\"me/pushed\")" in card and "| 7 | `s` |  |  | 42.00 |" in card
    (tmp_path / "w.safetensors").write_bytes(upload["files"][hub.WEIGHTS_FILE])
    sent = load_file(str(tmp_path / "w.safetensors"))
    assert all(torch.equal(sent[k], v) for k, v in model.state_dict().items())


def test_demo_export_push(fake_hub, tmp_path, capsys):
    run = _run_with_metrics(tmp_path)
    code = demo_main(["export", str(run), "--out", str(tmp_path / "out"), "--push", "me/exported"])
    assert code == 0 and "pushed" in capsys.readouterr().out
    (upload,) = fake_hub["uploads"]
    assert _plain(upload["files"]) == sorted(["README.md", "config.yaml", "metrics.json", "samples.png",
                                                *LAYOUT])
    assert "123.46" in upload["files"]["README.md"].decode()
    assert demo_main(["export", str(run), "--out", str(tmp_path / "o2"), "--push", "not a repo"]) == 2
    assert "--push not a repo: expected a Hub repo id OWNER/NAME" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists() and len(fake_hub["uploads"]) == 1


def test_push_refused_offline_and_for_incomplete_folders(tmp_path, model_dir, monkeypatch):
    with pytest.raises(hub.HubError, match="cannot push while HF_HUB_OFFLINE=1"):
        hub.push_folder(model_dir, "me/x")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    (tmp_path / "half").mkdir()
    save_file({"a": torch.zeros(1)}, str(tmp_path / "half" / "ema.safetensors"))
    with pytest.raises(hub.HubError, match="no config.yaml"):
        hub.push_folder(tmp_path / "half", "me/x")


@pytest.fixture()
def unreachable_hub(monkeypatch):
    """The Hub endpoint is a closed local port: every request fails to connect at once (huggingface_hub 2.x
    raises httpx2.ConnectError there, not an HfHubHTTPError or OSError)."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")  # a token, so that the request is really sent


def test_push_to_an_unreachable_hub_is_one_line_naming_repo_and_cause(unreachable_hub):
    cfg, model = _tiny()
    with pytest.raises(hub.HubError) as err:
        hub.PretrainedModel(model, cfg).push_to_hub("me/unreachable")
    message = str(err.value)
    assert message.startswith("me/unreachable: push failed: cannot reach http://127.0.0.1:9 (")
    assert "\n" not in message and "hf auth login" not in message  # not a login problem


def test_demo_export_push_to_an_unreachable_hub_exits_2_with_one_line(unreachable_hub, tmp_path, capsys):
    run = _run_with_metrics(tmp_path)
    code = demo_main(["export", str(run), "--out", str(tmp_path / "out"), "--push", "me/exported", "--no-samples"])
    err = capsys.readouterr().err
    assert code == 2 and (tmp_path / "out" / "config.yaml").is_file()  # the export is kept
    assert err.startswith("error: me/exported: push failed: cannot reach http://127.0.0.1:9") and err.count("\n") == 1


def test_download_from_an_unreachable_hub_is_one_line(unreachable_hub, tmp_path, monkeypatch):
    import vit5_sit.data.vae

    monkeypatch.setattr(vit5_sit.data.vae, "hub_reachable", lambda: True)  # past the probe: the request itself fails
    with pytest.raises(ModelLoadError) as err:
        hub.download_model("me/not-cached", cache_dir=tmp_path / "cache")
    assert str(err.value).startswith("me/not-cached: ") and "\n" not in str(err.value)
    assert "127.0.0.1:9" in str(err.value)


def test_network_failure_names_the_cause_and_says_unreachable_only_for_connection_errors():
    import huggingface_hub.constants

    assert hub.network_failure(ConnectionRefusedError(111, "Connection refused")).startswith(
        f"cannot reach {huggingface_hub.constants.ENDPOINT} (ConnectionRefusedError: ")
    assert hub.network_failure(PermissionError("no token")) == "PermissionError: no token"
    errors = hub.network_error_types()
    assert OSError in errors
    for client in ("httpx2", "httpx"):
        if client in sys.modules:  # the HTTP client huggingface_hub uses: its base error class is caught
            assert sys.modules[client].HTTPError in errors


# ----------------------------------------------------------------------------------------------------------
# eval_fid.py compare: a Hub repo id is one more "run" (one checkpoint), cached under the output folder.

@pytest.mark.slow  # Inception on a CPU
@needs_inception
def test_compare_takes_a_repo_id_and_model_folder(hf_cache, model_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    from vit5_sit.eval import compare
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf_cache))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "ref.npz", arr_0=rng.integers(0, 256, (24, 8, 8, 3), dtype=np.uint8))
    settings = compare.CompareSettings(num_samples=16, steps=2, part_size=16, batch_size=16, metrics=("fid",))
    before = sorted(p.relative_to(hf_cache) for p in hf_cache.rglob("*"))
    rows = compare.compare_runs(["me/tiny-vit5", model_dir], tmp_path / "ref.npz", tmp_path / "out", settings,
                                progress=False, log=lambda msg: None)
    step = load_config(model_dir / "config.yaml").train.max_steps
    assert [(r["run"], r["step"], r["run_dir"]) for r in rows] == [("me/tiny-vit5", step, "me/tiny-vit5"),
                                                                   (model_dir.name, step, str(model_dir))]
    assert rows[0]["fid"] == rows[1]["fid"] and np.isfinite(rows[0]["fid"])  # same weights, same seeds
    assert (tmp_path / "out" / "eval" / "me--tiny-vit5" / settings.tag()).is_dir()
    assert sorted(p.relative_to(hf_cache) for p in hf_cache.rglob("*")) == before  # nothing written there
    with pytest.raises(compare.CompareError, match="me/absent: no such file or folder here; as a Hub repo id"):
        compare.compare_runs(["me/absent"], tmp_path / "ref.npz", tmp_path / "out", settings)


def test_old_public_import_paths_still_work():
    """The package is grouped by role (#33); the paths users may have used keep working: `vit5_sit.hub`'s names
    (now in `vit5_sit.hub.api`), `vit5_sit.pipeline`, `vit5_sit.demo`'s export and `python -m vit5_sit.app`."""
    import vit5_sit.app
    import vit5_sit.demo
    import vit5_sit.demo.app
    import vit5_sit.demo.export
    import vit5_sit.hub
    import vit5_sit.hub.api
    from vit5_sit.pipeline import Vit5SitPipeline

    for name in ("PretrainedModel", "HubError", "model_card", "push_folder", "write_model_folder"):
        assert getattr(vit5_sit.hub, name) is getattr(vit5_sit.hub.api, name), name
    assert vit5_sit.demo.export_model is vit5_sit.demo.export.export_model
    assert vit5_sit.app.main is vit5_sit.demo.app.main
    assert Vit5SitPipeline.__module__ == "vit5_sit.pipeline"
    with pytest.raises(AttributeError):
        vit5_sit.hub.no_such_name  # noqa: B018
