"""Property-based (hypothesis): values from outside the Python entry points' contracts — pipeline keywords
(PIPELINE_ARGS), config keys (RANGES), study-spec keys (STUDY_FIELDS), reference-file fields (REFERENCE_FIELDS),
scheduler fields (SCHEDULER_FIELDS) — each refused with its documented exception naming the key, before any work:
no sampling, no Inception pass, the files unchanged. Plus the one-off regressions of issue #44."""

from __future__ import annotations

import contextlib
import io
import math
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
import stated_bounds as stated
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from test_property_cli import assert_one_line_usage_error, run_main, tree

from vit5_sit.common.contract import Arg
from vit5_sit.config import RANGES, ConfigError, load_config, save_config
from vit5_sit.models import create_model

ROOT = Path(__file__).resolve().parent.parent
FAST = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TINY = ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=32", "model.num_heads=2", "data.kind=mnist",
        "data.resolution=8", "sampler.steps=2"]


def outside_value(entry: Arg, line: str | None = None):
    """Python values an entry refuses: wrong types, NaN / inf, out of range (``line``: the stated bound,
    tests/stated_bounds.py, not the entry's own range), huge."""
    wrong = st.sampled_from(["3", b"3", None.__class__, [1], {"a": 1}, object(), 1j])
    options = [wrong.filter(lambda v: v is not None)]
    r = stated.parse(line) if line is not None else None
    if entry.kind in ("int", "float"):
        options.append(st.sampled_from([math.nan, math.inf, -math.inf]) if entry.kind == "float" else
                       st.sampled_from([1.5, math.nan, True]))
        if r is not None and r.lo is not None:
            options.append(st.integers(-10**30, math.ceil(r.lo) - 1) if entry.kind == "int" else
                           st.floats(max_value=r.lo, exclude_max=not r.lo_open, allow_nan=False, allow_infinity=False))
        if r is not None and r.hi is not None:
            options.append(st.integers(math.floor(r.hi) + 1, 10**30) if entry.kind == "int" else
                           st.floats(min_value=r.hi, exclude_min=not r.hi_open, allow_nan=False, allow_infinity=False))
    elif entry.kind == "choice":
        options.append(st.text(max_size=8).filter(lambda s: s not in entry.choices))
    elif entry.kind == "switch":
        options.append(st.sampled_from([0, 1, "yes"]))
    elif entry.kind == "list":
        options.append(st.sampled_from([(0.5, 2.0), (-1.0, 0.5), (math.nan, 1.0), "01"]))
    return st.one_of(*options)


# ----------------------------------------------------------------------------------------------------------
# The pipeline: ValueError (or its subclasses) before any image is sampled.

@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    from vit5_sit.pipeline import Vit5SitPipeline

    folder = tmp_path_factory.mktemp("model")
    cfg = load_config(None, TINY)
    torch.manual_seed(0)
    save_config(cfg, folder / "config.yaml")
    save_file({k: v.contiguous() for k, v in create_model(cfg.model_config()).state_dict().items()},
              str(folder / "ema.safetensors"))
    p = Vit5SitPipeline.from_pretrained(folder)
    p.set_progress_bar_config(disable=True)
    return p


def _checked_keywords():
    from vit5_sit.pipeline import PIPELINE_ARGS

    return [k for k, e in PIPELINE_ARGS.items() if e.kind in ("int", "float", "choice", "switch", "list")]


@pytest.mark.parametrize("keyword", _checked_keywords())
@FAST
@given(data=st.data())
def test_a_pipeline_keyword_outside_its_contract_raises_before_sampling(pipe, keyword, data, monkeypatch):
    from vit5_sit import pipeline
    from vit5_sit.sampling import call

    entry = pipeline.PIPELINE_ARGS[keyword]
    if entry.kind in ("int", "float", "list"):
        assert keyword in stated.PIPELINE, f"{keyword}: add its stated bound to tests/stated_bounds.py PIPELINE"
    bad = data.draw(outside_value(entry, stated.PIPELINE.get(keyword)), label=keyword)

    def never(*a, **k):
        raise AssertionError("sampled")

    monkeypatch.setattr(call, "sample_images", never)
    with pytest.raises(ValueError, match=keyword):
        pipe([0], **{keyword: bad})


@pytest.mark.parametrize("keyword", sorted(stated.PIPELINE))
def test_a_pipeline_keyword_takes_the_ends_of_its_stated_bound_and_nothing_beyond(keyword):
    from vit5_sit.common.contract import value_problem
    from vit5_sit.pipeline import PIPELINE_ARGS

    entry = PIPELINE_ARGS[keyword]
    refused, accepted = stated.edges(stated.parse(stated.PIPELINE[keyword]))

    def given(v):
        return (accepted[0], v) if entry.kind == "list" else v

    for value in refused:
        assert value_problem(given(value), entry), (keyword, value)
    for value in accepted:
        assert value_problem(given(value), entry) is None, (keyword, value)


def test_num_inference_steps_zero_is_refused_with_and_without_a_scheduler(pipe):
    pytest.importorskip("diffusers")
    from vit5_sit.transport.diffusers_schedulers import make_scheduler

    for scheduler in (None, make_scheduler("flow-euler")):
        pipe.scheduler = scheduler
        try:
            with pytest.raises(ValueError, match="num_inference_steps=0"):
                pipe([0], num_inference_steps=0)
        finally:
            pipe.scheduler = None


# ----------------------------------------------------------------------------------------------------------
# The config: ConfigError naming the key.

# The bounds each key must keep, stated in tests/stated_bounds.py (not read from RANGES, the table under test).
BOUNDED = sorted(k for k, line in stated.CONFIG.items() if line != "any")


def test_every_config_range_has_a_stated_bound_and_no_stated_bound_is_stale():
    assert set(RANGES) == set(stated.CONFIG), (sorted(set(RANGES) - set(stated.CONFIG)),
                                               sorted(set(stated.CONFIG) - set(RANGES)))


@pytest.mark.parametrize("key", sorted(stated.CONFIG))
def test_a_config_range_takes_the_ends_of_its_stated_bound_and_nothing_beyond(key):
    refused, accepted = stated.edges(stated.parse(stated.CONFIG[key]))
    for value in refused:
        assert RANGES[key].problem(value), (key, value)
    for value in accepted:
        assert RANGES[key].problem(value) is None, (key, value)


@pytest.mark.parametrize("key", BOUNDED)
@FAST
@given(data=st.data())
def test_a_config_value_outside_its_range_names_the_key(key, data):
    r = stated.parse(stated.CONFIG[key])
    values = [st.sampled_from(["nan", "inf", "-inf", "abc", "1e400", "٣", "１２"])]
    if r.lo is not None:
        values.append(st.floats(max_value=r.lo, exclude_max=not r.lo_open, allow_nan=False,
                                allow_infinity=False).map(repr))
    if r.hi is not None:
        values.append(st.floats(min_value=r.hi, exclude_min=not r.hi_open, allow_nan=False,
                                allow_infinity=False).map(repr))
    bad = data.draw(st.one_of(*values), label=key)
    with pytest.raises(ConfigError, match=key.split(".")[-1]):
        load_config(None, [*TINY, f"{key}=[{bad}]" if key == "log.sample_classes" else f"{key}={bad}"])


# ----------------------------------------------------------------------------------------------------------
# The study spec: StudyError naming the key, when the file is read.

def _study_file(tmp: Path, change: dict) -> Path:
    spec = {"name": "t", "output_dir": str(tmp / "runs"), "results_dir": str(tmp / "res"), "steps": [2],
            "seeds": [0, 1], "eval": {"num_samples": 16, "noise_seed": None, "metrics": ["fid"]},
            "arms": [{"name": "a", "config": str(ROOT / "configs/mnist/sit.yaml")},
                     {"name": "b", "config": str(ROOT / "configs/mnist/sit.yaml")}],
            "decision": {"reference": "a", "candidates": ["b"]}}
    for key, value in change.items():
        section, _, leaf = key.partition(".")
        if leaf:
            spec[section][leaf] = value
        else:
            spec[section] = value
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


STUDY_CASES = st.one_of(
    st.integers(2**32, 10**20).map(lambda v: {"seeds": [0, v]}),
    st.integers(-10**6, -1).map(lambda v: {"seeds": [v, 1]}),
    st.integers(-5, 1).map(lambda v: {"eval.num_samples": v}),        # FID needs 2 images (1 was accepted)
    st.integers(10_001, 10**9).map(lambda v: {"eval.steps": v}),
    st.integers(2**32, 10**20).map(lambda v: {"eval.sample_seed": v}),
    st.sampled_from([math.nan, math.inf, -1.0, 1e9]).map(lambda v: {"eval.cfg_scales": [1.0, v]}),
    st.integers(3, 100).map(lambda v: {"decision.min_seeds": v}),     # above the 2 seeds: could never decide
    st.sampled_from(["x", 1.5, None, [2]]).map(lambda v: {"eval.batch_size": v}),
)


@FAST
@given(change=STUDY_CASES)
def test_a_study_value_outside_its_contract_is_refused_when_read(change):
    from vit5_sit.study.spec import StudyError, load_study

    with tempfile.TemporaryDirectory() as tmp:
        path = _study_file(Path(tmp), change)
        before = tree(Path(tmp))
        key = next(iter(change)).split(".")[-1]
        with pytest.raises(StudyError, match=key):
            load_study(path)
        assert tree(Path(tmp)) == before


# ----------------------------------------------------------------------------------------------------------
# Reference files: EvalError naming the field, before any Inception work; through eval_fid.py calc, one line.

RNG = np.random.default_rng(0)
_F = RNG.standard_normal((64, 8))
GOOD = {"mu": np.zeros(2048), "sigma": np.eye(2048), "mu_s": np.zeros(2023), "sigma_s": np.eye(2023)}


def _broken(field: str, how: str):
    good = GOOD[field]
    if how == "complex":
        return good + 1j
    if how == "object":
        return np.array([object()] * 3, dtype=object)
    if how == "text":
        return np.array(["x"] * good.shape[0])
    if how == "shape":
        return good[..., :-1]
    if how == "nan":
        bad = good.copy()
        bad.flat[0] = np.nan
        return bad
    if how == "integer":
        return good.astype(np.int64)
    if how == "asymmetric" and good.ndim == 2:
        bad = good.copy()
        bad[0, 1] = 0.5
        return bad
    if how == "negative" and good.ndim == 2:
        return -good
    return None


@FAST
@given(field=st.sampled_from(sorted(GOOD)), how=st.sampled_from(["complex", "object", "text", "shape", "nan", "integer",
                                                                 "asymmetric", "negative"]))
def test_a_reference_field_outside_its_contract_is_refused_on_open(field, how, monkeypatch):
    from vit5_sit import eval as ev
    from vit5_sit.eval import EvalError, open_reference

    bad = _broken(field, how)
    if bad is None:
        return
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        ref = tmp / "ref.npz"
        np.savez(ref, **{**GOOD, field: bad})  # allow_pickle: np.savez writes the object array as a pickle
        np.savez(tmp / "s.npz", arr_0=np.zeros((4, 8, 8, 3), np.uint8))
        before = tree(tmp)
        with pytest.raises(EvalError, match=field):
            open_reference(ref)
        monkeypatch.setattr(ev, "load_inception", lambda *a, **k: pytest.fail("Inception loaded"))
        code, err = run_main("eval_fid", ["calc", "--samples", str(tmp / "s.npz"), "--ref", str(ref),
                                          "--metrics", "fid,sfid"])
        assert tree(tmp) == before
    assert_one_line_usage_error(code, err, field)


def test_a_header_declaring_more_data_than_the_file_holds_is_refused(tmp_path):
    from vit5_sit.eval import EvalError, open_reference

    ref = tmp_path / "ref.npz"
    np.savez(ref, **GOOD, features=np.zeros((4, 2048), np.float32))
    import zipfile

    with zipfile.ZipFile(ref) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["features.npy"] = members["features.npy"].replace(b"(4, 2048)", b"(99999, 2048)", 1)  # same length
    with zipfile.ZipFile(ref, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    with pytest.raises(EvalError, match="features's header declares .* more than the file holds"):
        open_reference(ref)


# ----------------------------------------------------------------------------------------------------------
# Scheduler objects: SchedulerError before use.

class FlowMatchEulerDiscreteScheduler:  # the interface check_scheduler reads, with a config to draw
    def __init__(self, **config):
        self.config, self.timesteps = {"num_train_timesteps": 1000, "shift": 1.0, **config}, []

    def set_timesteps(self, *a, **k):
        raise AssertionError("used")

    def step(self, *a, **k):
        raise AssertionError("used")


SCHEDULER_CASES = st.one_of(
    st.integers(-10, 1).map(lambda v: {"num_train_timesteps": v}),
    st.sampled_from([1.5, "1000", None.__class__, True]).map(lambda v: {"num_train_timesteps": v}),
    st.floats(max_value=0.0, allow_nan=False).map(lambda v: {"shift": v}),
    st.sampled_from([math.nan, math.inf, 1e9, "3"]).map(lambda v: {"shift": v}),
    st.just({"use_dynamic_shifting": True}),
)


@FAST
@given(change=SCHEDULER_CASES)
def test_a_scheduler_outside_its_contract_is_refused_before_use(change):
    from vit5_sit.transport import Transport, TransportConfig
    from vit5_sit.transport.diffusers_schedulers import SchedulerError, check_scheduler

    with pytest.raises(SchedulerError, match=next(iter(change))):
        check_scheduler(FlowMatchEulerDiscreteScheduler(**change), Transport(TransportConfig()))


# ----------------------------------------------------------------------------------------------------------
# One-off regressions of issue #44.

def test_dopri5_underflow_is_one_line_naming_the_tolerance():
    from vit5_sit.transport import SamplerConfig, Transport, TransportConfig, sample
    from vit5_sit.transport.samplers import SolverError

    def exploding(x, t, y):
        return torch.full_like(x, math.nan)  # the error estimate never falls: dt shrinks until it underflows

    with pytest.raises(SolverError, match="loosen the tolerance .*--tol"):
        sample(exploding, torch.zeros(1, 1, 2, 2), torch.zeros(1, dtype=torch.long), Transport(TransportConfig()),
               SamplerConfig(method="dopri5", atol=1e-6, rtol=1e-6))


def test_grid_with_an_adaptive_method_is_refused(tmp_path):
    code, err = run_main("sample", ["--method", "dopri5", "--grid", "shift", "--out", str(tmp_path / "x.png")])
    assert_one_line_usage_error(code, err, "time grid is for fixed-step methods")
    assert not list(tmp_path.iterdir())


def test_an_ignored_sigint_stays_ignored_in_the_training_loop():
    from vit5_sit.common.interrupt import deferred_sigint

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with deferred_sigint():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # SIGTERM is still taken over
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_folder_at_the_export_lock_is_one_line(tmp_path):
    (tmp_path / "m" / ".export.lock").mkdir(parents=True)
    code, err = run_main("data", ["mnist", str(tmp_path / "m"), "--limit-per-class", "1"])
    assert_one_line_usage_error(code, err, ".export.lock: is a folder")


def test_a_full_disk_under_torch_save_is_named(tmp_path, monkeypatch):
    from vit5_sit.common.utils import save_torch

    def full(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 1088 vs 1026")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match="No space left on device"):
        save_torch({}, tmp_path / "state.pt")


def test_a_folder_with_only_a_bin_and_compare_on_a_file_are_named(tmp_path):
    from vit5_sit.hub.model_files import ModelLoadError, resolve_checkpoint

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text("name: x\n")
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="holds pytorch_model.bin but no weights this project reads"):
        resolve_checkpoint(tmp_path / "m")
    (tmp_path / "w.pt").write_bytes(b"x")
    np.savez(tmp_path / "r.npz", **GOOD)
    with contextlib.redirect_stdout(io.StringIO()):
        code, err = run_main("eval_fid", ["compare", str(tmp_path / "w.pt"), "--ref", str(tmp_path / "r.npz"),
                                          "--out", str(tmp_path / "o")])
    assert_one_line_usage_error(code, err, "is a file, not a run folder")
