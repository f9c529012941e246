"""Both doors of a model, held to one contract (#53): the package's `Vit5SitPipeline` and the model folder's
`Vit5SitDiffusersPipeline` as diffusers loads it (``trust_remote_code=True``: the folder's own generated code, run
in this process), on a tiny random model. Bad arguments, drawn with hypothesis from bounds STATED HERE (not read from
PIPELINE_ARGS, the table under test), are refused by both with a ValueError naming the keyword before any sampling;
labels of any non-integral type are refused; adaptive solvers stop at MAX_NFE; a model with guidance trained in
refuses a second guidance; a guide gives the same images through both doors and through a saved folder; diffusers'
habits (scheduler swaps, save_pretrained, CPU offload without accelerate) work or are one error."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vit5_sit.config import load_config
from vit5_sit.models import create_model
from vit5_sit.pipeline import Vit5SitPipeline

FAST = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TINY = ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=32", "model.num_heads=2", "data.kind=mnist",
        "data.resolution=8", "sampler.steps=2"]
# The bounds of the pipeline's keywords, as the docs state them (deliberately not read from PIPELINE_ARGS).
INT_BOUNDS = {"num_inference_steps": (1, 10_000), "num_images_per_prompt": (1, 10_000), "batch_size": (1, 65_536),
              "max_nfe": (1, 20_000)}
FLOAT_BOUNDS = {"guidance_scale": (0.0, 1_000.0)}


def _tiny_pipeline(overrides: list[str], seed: int = 0) -> Vit5SitPipeline:
    cfg = load_config(None, overrides)
    torch.manual_seed(seed)
    model = create_model(cfg.model_config())
    with torch.no_grad():  # adaLN-Zero starts at zero: give every layer weights, so images depend on them
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    pipe = Vit5SitPipeline(model, cfg)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _folder_door(folder, monkeypatch_cache):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(folder), trust_remote_code=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def modules_cache(tmp_path_factory):
    """diffusers' remote-code module cache in a temporary folder for this module's in-process loads."""
    from diffusers.utils import dynamic_modules_utils

    mp = pytest.MonkeyPatch()
    mp.setattr(dynamic_modules_utils, "HF_MODULES_CACHE", str(tmp_path_factory.mktemp("modules")))
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield
    mp.undo()


@pytest.fixture(scope="module")
def doors(tmp_path_factory, modules_cache):
    """(the package's pipeline, the folder's pipeline) of one tiny model."""
    pipe = _tiny_pipeline(TINY)
    folder = pipe.save_pretrained(tmp_path_factory.mktemp("tiny") / "model")
    return pipe, _folder_door(folder, modules_cache)


def _no_sampling(monkeypatch, door) -> None:
    """Sampling in ``door`` raises: a refusal must come before it."""
    def never(*a, **k):
        raise AssertionError("sampled")

    if isinstance(door, Vit5SitPipeline):
        from vit5_sit.sampling import call

        monkeypatch.setattr(call, "sample_images", never)
    else:  # the folder's generated module holds its own copy of the call
        monkeypatch.setattr(sys.modules[type(door).__module__], "sample_images", never)


def outside(keyword: str):
    """Values outside a keyword's stated contract: wrong types, NaN / inf, just past a bound, far past it."""
    wrong = st.sampled_from(["3", b"3", [1], {"a": 1}, object(), 1j])
    if keyword in INT_BOUNDS:
        lo, hi = INT_BOUNDS[keyword]
        return st.one_of(wrong, st.sampled_from([1.5, 2.0, math.nan, True, np.float64(3)]),
                         st.integers(-10**30, lo - 1), st.integers(hi + 1, 10**30))
    if keyword in FLOAT_BOUNDS:
        lo, hi = FLOAT_BOUNDS[keyword]
        return st.one_of(wrong, st.sampled_from([math.nan, math.inf, -math.inf, True]),
                         st.floats(max_value=lo, exclude_max=True, allow_nan=False, allow_infinity=False),
                         st.floats(min_value=hi, exclude_min=True, allow_nan=False, allow_infinity=False))
    if keyword == "guidance_interval":
        return st.sampled_from([(0.5, 2.0), (-1.0, 0.5), (math.nan, 1.0), "01", (0.9, 0.1), (0.1, 0.2, 0.3)])
    if keyword == "output_type":
        return st.text(max_size=8).filter(lambda s: s not in ("pil", "np", "pt", "latent"))
    if keyword == "return_dict":
        return st.sampled_from([0, 1, "no", "yes", None, np.bool_(True)])
    raise KeyError(keyword)


KEYWORDS = [*INT_BOUNDS, *FLOAT_BOUNDS, "guidance_interval", "output_type", "return_dict"]


@pytest.mark.parametrize("door", ["package", "folder"])
@pytest.mark.parametrize("keyword", KEYWORDS)
@FAST
@given(data=st.data())
def test_a_keyword_outside_its_stated_bounds_is_refused_by_both_doors(doors, door, keyword, data, monkeypatch):
    pipe = doors[0] if door == "package" else doors[1]
    bad = data.draw(outside(keyword), label=keyword)
    _no_sampling(monkeypatch, pipe)
    with pytest.raises(ValueError, match=keyword):
        pipe([0], **{keyword: bad})


BAD_LABELS = st.sampled_from([
    [1.5], [1.0], 2.0, [True], True, np.bool_(True), [np.float32(3)], torch.tensor([1.7]), torch.tensor([3.0]),
    torch.tensor([True]), torch.tensor(True), np.array([2.5]), np.array([[1, 2]]), [[1, 2]], {1, 2}, {"a": 1},
    None, b"3", [None], [1, "x"], object(), iter([1, 2]), [torch.tensor([1, 2])], 1j,
])


@pytest.mark.parametrize("door", ["package", "folder"])
@FAST
@given(labels=BAD_LABELS)
def test_labels_that_are_not_integers_are_refused_by_both_doors(doors, door, labels, monkeypatch):
    """Any non-integral or bool label, of any type (it sampled label 1 for [1.5], tensor([1.7]), tensor([True]))."""
    pipe = doors[0] if door == "package" else doors[1]
    _no_sampling(monkeypatch, pipe)
    with pytest.raises(ValueError, match="class"):
        pipe(labels)


@pytest.mark.parametrize("door", ["package", "folder"])
def test_integer_labels_of_every_type_and_huge_counts(doors, door, monkeypatch):
    pipe = doors[0] if door == "package" else doors[1]
    want = pipe([3, 4], seed=0, output_type="np").images
    for labels in (np.array([3, 4]), torch.tensor([3, 4]), [np.int64(3), torch.tensor(4)], (3, 4), range(3, 5)):
        assert np.array_equal(pipe(labels, seed=0, output_type="np").images, want)
    assert pipe(np.int64(3), seed=0, output_type="np").class_labels == [3]  # was a traceback in the folder
    _no_sampling(monkeypatch, pipe)
    for kwargs in (dict(class_labels=[1, 2], num_images_per_prompt=10**12), dict(class_labels=range(10**12)),
                   dict(class_labels=[1], seed=range(10**12))):
        with pytest.raises(ValueError, match="10,000|10000|seeds for"):  # refused at once (it hung)
            pipe(**kwargs)
    if door == "folder":
        with pytest.raises(ValueError, match="ImageNet names need the vit5-sit package"):
            pipe(["3"])


def test_both_doors_give_the_same_images_and_count_whole_steps(doors):
    pipe, folder = doors
    for kwargs in (dict(seed=3), dict(seed=3, guidance_scale=2.0, sampler="sde", method="heun")):
        a = pipe([0, 5, 9], output_type="np", **kwargs).images
        b = folder([0, 5, 9], output_type="np", **kwargs).images
        assert np.array_equal(a, b)
    seen = []

    class Bar:
        def __init__(self, total=None, **kw):
            self.total, self.n = total, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, k):
            self.n += k
            seen.append((self.n, self.total, type(k)))

    for door in doors:
        seen.clear()
        door.progress_bar = Bar
        try:
            door([0], guidance_scale=2.0, sampler="sde", method="heun", num_inference_steps=2)
        finally:
            del door.progress_bar
        assert [n for n, _, _ in seen] == [0, 1, 1, 2, 3] and {t for _, t, _ in seen} == {3}  # 2 steps + the last
        assert {k for _, _, k in seen} == {int}  # whole steps: the folder showed 2.0/6 with guidance


def test_dopri5_samples_through_both_doors_and_stops_at_max_nfe(doors, monkeypatch):
    from vit5_sit.transport import samplers
    from vit5_sit.transport.samplers import SolverError

    pipe, folder = doors
    a = pipe([1, 2], seed=0, method="dopri5", output_type="np").images  # the folder died in tqdm here
    b = folder([1, 2], seed=0, method="dopri5", output_type="np").images
    assert np.array_equal(a, b)
    monkeypatch.setattr(samplers, "MAX_NFE", 10)
    monkeypatch.setattr(sys.modules[type(folder).__module__], "MAX_NFE", 10)
    for door in doors:
        with pytest.raises(SolverError.__base__, match="more than 10 network evaluations .*MAX_NFE.* loosen the "
                                                       "tolerance"):
            door([1], method="dopri5")


def test_max_nfe_is_a_named_constant_of_the_contract():
    from vit5_sit.common.contract import MAX_NFE, MAX_STEPS

    assert MAX_NFE == 2 * MAX_STEPS == 20_000  # Heun at the most steps a fixed-step sampler takes


def test_guidance_trained_in_refuses_a_second_guidance_on_both_doors(tmp_path, modules_cache):
    from vit5_sit.transport import GuidanceError

    pipe = _tiny_pipeline([*TINY[:-1], "train.objective=meanflow", "meanflow.guidance_scale=3"])
    folder = _folder_door(pipe.save_pretrained(tmp_path / "one-step"), modules_cache)
    guide = _tiny_pipeline(TINY).model  # wrong kind anyway: refused for the trained guidance first
    for door in (pipe, folder):
        assert door([1, 2], seed=0, output_type="np").images.shape == (2, 8, 8, 3)  # unguided: fine
        for kwargs in (dict(guidance_scale=3.0), dict(guidance_scale=1.5, guidance_interval=(0.5, 1.0))):
            with pytest.raises(GuidanceError.__base__, match=r"guidance .* trained in .*meanflow.guidance_scale=3"):
                door([1], **kwargs)
    with pytest.raises(GuidanceError, match="autoguidance"):
        from vit5_sit.transport.guidance import check_second_guidance

        check_second_guidance(3.0, 1.0, guide)


def test_a_guide_gives_the_same_images_through_both_doors_and_a_saved_folder(tmp_path, modules_cache):
    pipe = _tiny_pipeline(TINY)
    guide = _tiny_pipeline(TINY, seed=1).model
    guided = Vit5SitPipeline(pipe.model, pipe.config, guide=guide)
    guided.set_progress_bar_config(disable=True)
    want = guided([0, 7], seed=2, guidance_scale=2.0, output_type="np").images
    assert not np.array_equal(want, pipe([0, 7], seed=2, guidance_scale=2.0, output_type="np").images)
    saved = guided.save_pretrained(tmp_path / "guided")
    assert (saved / "guide" / "diffusion_pytorch_model.safetensors").is_file()
    again = Vit5SitPipeline.from_pretrained(saved)  # the folder's guide/ comes back
    again.set_progress_bar_config(disable=True)
    assert np.array_equal(again([0, 7], seed=2, guidance_scale=2.0, output_type="np").images, want)
    folder = _folder_door(saved, modules_cache)
    assert folder.guide is not None
    assert np.array_equal(folder([0, 7], seed=2, guidance_scale=2.0, output_type="np").images, want)
    other = Vit5SitPipeline.from_pretrained(saved, guide=saved / "guide")  # a guide given as a path
    other.set_progress_bar_config(disable=True)
    assert np.array_equal(other([0, 7], seed=2, guidance_scale=2.0, output_type="np").images, want)
    from vit5_sit.transport import GuidanceError

    wrong = _tiny_pipeline([*TINY, "data.resolution=16"]).model
    with pytest.raises(GuidanceError, match="data size"):
        Vit5SitPipeline(pipe.model, pipe.config, guide=wrong)


def test_diffusers_habits_on_the_folder_pipeline(doors, tmp_path, modules_cache, monkeypatch):
    from diffusers import DiffusionPipeline, DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler

    pipe, folder = doors
    folder = _folder_door(folder.config._name_or_path, modules_cache)  # a copy: the scheduler is swapped
    own = folder.scheduler
    folder.scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0)  # no attribute 'sampler_config' before
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0)
    try:
        want = pipe([1, 2], seed=0, guidance_scale=1.0, output_type="np").images
    finally:
        pipe.scheduler = None
    assert np.array_equal(folder([1, 2], seed=0, guidance_scale=1.0, output_type="np").images, want)
    with pytest.raises(ValueError, match="samples with its scheduler"):
        folder([1], method="heun")
    at_load = DiffusionPipeline.from_pretrained(folder.config._name_or_path, trust_remote_code=True,
                                                scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0))
    at_load.set_progress_bar_config(disable=True)
    assert np.array_equal(at_load([1, 2], seed=0, guidance_scale=1.0, output_type="np").images, want)
    folder.scheduler = DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction")
    dpm = folder([1, 2], seed=0, num_inference_steps=3, output_type="np").images
    folder.save_pretrained(tmp_path / "saved")  # code files and model_index written: it loads again
    again = _folder_door(tmp_path / "saved", modules_cache)
    assert type(again.scheduler).__name__ == "DPMSolverMultistepScheduler"
    assert np.array_equal(again([1, 2], seed=0, num_inference_steps=3, output_type="np").images, dpm)
    folder.scheduler = own
    folder.save_pretrained(tmp_path / "own")
    assert np.array_equal(_folder_door(tmp_path / "own", modules_cache)([3], seed=1, output_type="np").images,
                          pipe([3], seed=1, output_type="np").images)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else
                        real(name, *a))
    for door in (pipe, folder):
        with pytest.raises(ImportError, match="pip install accelerate"):
            door.enable_model_cpu_offload()


def test_both_doors_have_a_scheduler_whose_config_builds_diffusers_ones(doors, modules_cache, tmp_path):
    """diffusers' habit ``Other.from_config(pipe.scheduler.config, ...)``: the package's scheduler is ours too (it was
    None), with the folder's config; a flow-mode DPM built that way gives the same images through both doors, and our
    scheduler with other settings set on either door changes its default sampler alike; the package door's folder
    keeps the model's own sampler, with a warning when a diffusers scheduler is set."""
    from diffusers import DPMSolverMultistepScheduler

    pipe, folder = doors
    folder = _folder_door(folder.config._name_or_path, modules_cache)  # a copy: its scheduler is swapped
    own = pipe.scheduler
    assert type(own).__name__ == type(folder.scheduler).__name__ == "Vit5SitScheduler"
    assert {k: v for k, v in own.config.items() if not k.startswith("_")} == \
        {k: v for k, v in folder.scheduler.config.items() if not k.startswith("_")}
    assert pipe.components["scheduler"].config == own.config
    assert pipe.scheduler is own  # one object, so set_timesteps' state stays between reads
    flow = {"use_flow_sigmas": True, "prediction_type": "flow_prediction"}
    try:
        pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, **flow)
        folder.scheduler = DPMSolverMultistepScheduler.from_config(folder.scheduler.config, **flow)
        assert np.array_equal(pipe([1, 2], seed=0, num_inference_steps=3, output_type="np").images,
                              folder([1, 2], seed=0, num_inference_steps=3, output_type="np").images)
        with pytest.raises(ValueError, match="flow mode"):
            pipe.scheduler = DPMSolverMultistepScheduler.from_config(own.config)
        with pytest.warns(UserWarning, match="DPMSolverMultistepScheduler. is not saved"):
            saved = pipe.save_pretrained(tmp_path / "saved")
        assert json.loads((saved / "scheduler" / "scheduler_config.json").read_text())["_class_name"] == \
            "Vit5SitScheduler"
        three = type(own).from_config(own.config, steps=3)
        pipe.scheduler = three
        folder.scheduler = type(folder.own_scheduler()).from_config(folder.own_scheduler().config, steps=3)
        assert pipe.scheduler.config["steps"] == 3 and pipe.components["scheduler"].config["steps"] == 3
        want = pipe([1, 2], seed=0, output_type="np").images
        assert np.array_equal(folder([1, 2], seed=0, output_type="np").images, want)
        pipe.scheduler = None
        assert np.array_equal(pipe([1, 2], seed=0, num_inference_steps=3, output_type="np").images, want)
        with pytest.raises(ValueError, match="transport"):
            pipe.scheduler = type(own).from_config(own.config, path="gvp")
    finally:
        pipe.scheduler = own


def test_the_pipeline_is_a_lazy_export_of_the_package():
    code = ("import sys, vit5_sit; assert 'torch' not in sys.modules; "
            "from vit5_sit import Vit5SitPipeline; print(Vit5SitPipeline.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "vit5_sit.pipeline"


@pytest.mark.slow
def test_demo_export_puts_a_guide_in_the_folder(tmp_path, capsys):
    from vit5_sit.demo.export import main as demo_main
    from vit5_sit.hub.files import BUNDLED_MODELS
    from vit5_sit.hub.model_files import DEMO_MODEL

    out = tmp_path / "with-guide"
    assert demo_main(["export", str(DEMO_MODEL), "--out", str(out), "--no-samples", "--guide", str(DEMO_MODEL)]) == 0
    assert all((out / "guide" / name).is_file() for name in ("config.json", "diffusion_pytorch_model.safetensors"))
    index = json.loads((out / "model_index.json").read_text())
    assert index["guide"] == index["transformer"] and (out / "guide" / f"{index['guide'][0]}.py").is_file()
    assert Vit5SitPipeline.from_pretrained(out).guide is not None
    capsys.readouterr()
    wrong = tmp_path / "wrong"
    assert demo_main(["export", str(DEMO_MODEL), "--out", str(wrong), "--no-samples", "--guide",
                      str(BUNDLED_MODELS["demo-1step"])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot guide this model" in err and "mean_flow" in err
    assert not wrong.exists()  # refused before anything was written


def test_both_doors_take_the_keywords_of_the_contract():
    import inspect

    from vit5_sit.hub.components import Vit5SitDiffusersPipeline
    from vit5_sit.sampling.call import PIPELINE_ARGS

    for cls in (Vit5SitPipeline, Vit5SitDiffusersPipeline):
        assert set(inspect.signature(cls.__call__).parameters) - {"self"} == set(PIPELINE_ARGS), cls
