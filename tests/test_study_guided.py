"""The widened study (issue #28): every checkpoint at several guidance scales, the digit classifier's accuracy as a
study metric, per-guidance tables and decisions, saved unguided scores carried over; and the study's silent
failures of issue #32: arm overrides of the keys the runner owns, and command arguments checked before any work."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from tinydata import image_folder, needs_inception, tiny_run_config

from vit5_sit.study import Arm, DecisionSpec, EvalSpec, StudyError, StudySpec, decide, load_study, runner
from vit5_sit.study.__main__ import main
from vit5_sit.study.report import aggregate, format_report, saved_rows, write_report

TINY_CONFIG = "name: x\ntrain: {ckpt_every: 100, keep_last: 0}\n"  # the default config: 32x32 MNIST, 10 classes


def _study(tmp_path: Path, eval_=None, arms=None, **change) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    body = {"name": "t", "output_dir": str(tmp_path / "runs"), "results_dir": str(tmp_path / "results"),
            "steps": [100, 200], "seeds": [0, 1],
            "eval": eval_ or {"metrics": ["fid"], "noise_seed": None, "reference_data": str(tmp_path / "digits")},
            "arms": arms or [{"name": "a", "config": str(cfg)}, {"name": "b", "config": str(cfg)}], **change}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ----------------------------------------------------------------------------------------------------------
# #32: the runner's own settings are not an arm's to change.

@pytest.mark.parametrize("override, key", [
    ("train.seed=7", "train.seed"),            # every "seed" trained with seed 7: the ± was sampling noise
    ("name=shared", "name"),                   # two seeds in one folder: the second resumed the first
    ("output_dir=elsewhere", "output_dir"),    # trained where the study never looks
    ("train.max_steps=3", "train.max_steps"),  # never reached an evaluated step
    ("log.sample_every=400", "log.sample_every"),
    (" train.seed = 7", "train.seed"),         # spaces around the key: the same key to the config reader
    ("train={seed: 7}", "train.seed"),         # a whole section replaces the runner's key too
    ("log={}", "log.sample_every"),
])
def test_an_arm_may_not_override_what_the_runner_sets_per_arm_and_seed(tmp_path, capsys, override, key):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    path = _study(tmp_path, arms=[{"name": "a", "config": str(cfg)},
                                  {"name": "odd", "config": str(cfg), "overrides": ["model.rope=false", override]}])
    with pytest.raises(StudyError, match=rf"arms\[1\] \(odd\): override .* sets {re.escape(key)}, which the study "
                                         r"runner sets for each \(arm, seed\)"):
        load_study(path)
    for command in ("status", "train", "eval", "report"):  # every command that reads the study file
        assert main([command, str(path)]) == 2
        line = _one_error_line(capsys)
        assert "(odd)" in line and key in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


def test_overrides_of_other_keys_in_the_same_sections_stay_allowed(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    path = _study(tmp_path, arms=[{"name": "a", "config": str(cfg),
                                   "overrides": ["train.lr=1e-4", "log.every=10"]}])
    spec = load_study(path)
    over = spec.train_overrides(spec.arms[0], 1, 200)
    assert over[:5] == spec.runner_overrides(spec.arms[0], 1, 200) and over[5:] == ["train.lr=1e-4", "log.every=10"]


# ----------------------------------------------------------------------------------------------------------
# #32: every argument of every command is checked before any work, nothing written.

@pytest.mark.parametrize("argv, message", [
    (["eval", "--steps", "7"], "--steps 7: not a step the study evaluates; steps: 100, 200"),
    (["run", "--steps", "7"], "--steps 7: not a step the study evaluates"),
    (["eval", "--arms", "zzz"], "--arms 'zzz': no such arm"),
    (["eval", "--seeds", "9"], "--seeds 9: no arm of"),
    (["eval", "--arms", "b", "--seeds", "0"], "--arms b --seeds 0: no run of the study has them (seeds of those "
                                              "arms: b: 1)"),
    (["status", "--arms", "b", "--seeds", "0"], "--arms b --seeds 0: no run of the study has them"),
    (["run", "--until", "100", "--steps", "200"], "--steps 200: beyond --until 100"),
    (["run", "--until", "300"], "--until 300: beyond the study's last step 200"),
    (["eval", "--device", "tpu"], "--device tpu:"),
])
def test_bad_arguments_are_refused_before_the_reference_or_any_training(tmp_path, capsys, monkeypatch, argv,
                                                                          message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    path = _study(tmp_path, arms=[{"name": "a", "config": str(cfg)}, {"name": "b", "config": str(cfg), "seeds": [1]}])

    def no_work(*args, **kwargs):
        raise AssertionError("started work")

    import vit5_sit.eval as eval_pkg

    monkeypatch.setattr(eval_pkg, "compute_reference", no_work)  # the 5,000-image reference: never started
    monkeypatch.setattr(runner, "train_all", no_work)
    monkeypatch.setattr(runner, "check_reference_source", lambda spec: None)
    assert main([argv[0], str(path), *argv[1:]]) == 2
    assert message in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "study.yaml"]  # nothing written


def test_evaluate_all_checks_the_steps_before_the_reference(tmp_path, monkeypatch):
    spec = load_study(_study(tmp_path))
    monkeypatch.setattr(runner, "ensure_reference", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ref")))
    with pytest.raises(StudyError, match="--steps 7: not a step"):
        runner.evaluate_all(spec, steps=[7])


# ----------------------------------------------------------------------------------------------------------
# The evaluation settings: guidance scales and the study's own metric.

@pytest.mark.parametrize("eval_, message", [
    ({"cfg_scale": 1.0, "cfg_scales": [1.0, 6.0]}, "eval: give cfg_scales (a list) or cfg_scale (one value), not both"),
    ({"cfg_scales": []}, "eval.cfg_scales: expected at least one guidance scale"),
    ({"cfg_scales": 6.0}, "eval.cfg_scales: expected a list, got 6.0"),
    ({"cfg_scales": [1.0, -2]}, "eval.cfg_scales -2: must be >= 0"),
    ({"cfg_scales": [6, 6.0]}, "eval.cfg_scales: [6, 6.0] lists a scale twice"),
    ({"metrics": ["digit_accuracy"]}, "eval.metrics: no metrics chosen"),
    ({"metrics": ["fid", "fid"]}, "eval.metrics: ['fid', 'fid'] must be metric names, each once"),
])
def test_bad_guidance_and_metric_settings_are_named(tmp_path, eval_, message):
    with pytest.raises(StudyError, match=re.escape(message)):
        load_study(_study(tmp_path, eval_))


def test_guidance_needs_label_dropout_and_digit_accuracy_needs_mnist_models(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    arms = [{"name": "nodrop", "config": str(cfg), "overrides": ["model.class_dropout_prob=0"]}]
    with pytest.raises(StudyError, match=r"eval.cfg_scales \(arms\[0\], nodrop\): cfg_scale=6 needs the null"):
        load_study(_study(tmp_path, {"cfg_scales": [1.0, 6.0]}, arms))
    assert load_study(_study(tmp_path, {"cfg_scales": [1.0]}, arms)).eval.cfg_scales == (1.0,)  # unguided: fine
    arms = [{"name": "big", "config": str(cfg), "overrides": ["data.resolution=64"]}]
    with pytest.raises(StudyError, match=r"digit_accuracy reads 32x32 digits .* arms\[0\] \(big\) makes 64x64"):
        load_study(_study(tmp_path, {"metrics": ["fid", "digit_accuracy"]}, arms))
    spec = load_study(_study(tmp_path, {"cfg_scale": 4, "metrics": ["fid", "pr", "digit_accuracy"]}))
    assert spec.eval.cfg_scales == (4.0,) and spec.eval.inception_metrics == ("fid", "pr")


def test_digit_accuracy_reads_the_evaluation_samples_and_is_cached(tmp_path):
    from vit5_sit.demo.digit_classifier import classify, mnist_32

    images, labels = mnist_32()
    pick = np.concatenate([np.flatnonzero(labels == c)[-5:] for c in range(10)])  # held-out digits
    shown = images[pick].copy()
    asked = labels[pick].copy()
    asked[:10] = (asked[:10] + 1) % 10  # 10 of 50 asked for another digit than drawn
    samples = tmp_path / "step_0000100.npz"
    np.savez(samples, arr_0=np.repeat(shown[..., None], 3, axis=-1), arr_1=asked)
    (tmp_path / "step_0000100.npz.json").write_text('{"settings": 1}')
    assert runner.digit_accuracy(samples, cached_only=True) is None
    accuracy = runner.digit_accuracy(samples)
    read = classify(shown)
    assert accuracy == pytest.approx(np.mean(read == asked)) and accuracy <= 0.8  # 40 of 50 drawn as asked
    assert np.mean(read == labels[pick]) >= 0.9  # the classifier reads these held-out digits
    np.savez(samples, arr_0=np.zeros((50, 32, 32, 3), np.uint8), arr_1=asked)  # same manifest: served from cache
    assert runner.digit_accuracy(samples, cached_only=True) == accuracy
    (tmp_path / "step_0000100.npz.json").write_text('{"settings": 2}')  # other samples: computed again
    assert runner.digit_accuracy(samples, cached_only=True) is None
    assert runner.digit_accuracy(samples) < 0.5


# ----------------------------------------------------------------------------------------------------------
# The report: per guidance scale, with the earlier unguided scores kept.

def _row(arm, seed, step, fid, cfg=1.0, sample_seed=0, **more):
    return {"arm": arm, "seed": seed, "step": step, "sample_seed": sample_seed, "cfg_scale": cfg, "fid": fid, **more}


def _guided_spec(min_seeds=2) -> StudySpec:
    arms = [Arm(name, "c.yaml", seeds=seeds, label=name)
            for name, seeds in (("paper", (0, 1)), ("g", (0, 1)), ("r", (0, 1)), ("few", (0,)))]
    return StudySpec(name="t", output_dir="runs", results_dir="out", steps=(100, 200), arms=tuple(arms),
                     eval=EvalSpec(noise_seed=None, cfg_scales=(1.0, 6.0), metrics=("fid", "digit_accuracy")),
                     decision=DecisionSpec(reference="paper", candidates=("paper", "g", "r", "few"),
                                           min_seeds=min_seeds))


def test_decisions_are_taken_separately_unguided_and_guided():
    spec = _guided_spec()
    rows = [_row("paper", s, 200, v) for s, v in enumerate((100.0, 102.0))]
    rows += [_row("g", s, 200, v) for s, v in enumerate((80.0, 82.0))]       # wins unguided
    rows += [_row("r", s, 200, v) for s, v in enumerate((99.0, 101.0))]
    rows += [_row("paper", s, 200, v, 6.0, digit_accuracy=0.9) for s, v in enumerate((30.0, 31.0))]
    rows += [_row("g", s, 200, v, 6.0, digit_accuracy=0.8) for s, v in enumerate((40.0, 41.0))]
    rows += [_row("r", s, 200, v, 6.0, digit_accuracy=0.95) for s, v in enumerate((20.0, 21.0))]  # wins guided
    unguided, guided = decide(spec, rows, 1.0), decide(spec, rows, 6.0)
    assert unguided["winner"] == "g" and unguided["resolved"] and unguided["cfg_scale"] == 1.0
    assert guided["winner"] == "r" and guided["resolved"] and guided["lead"] == pytest.approx(10.0)
    assert decide(spec, rows)["winner"] == "g"  # the first scale by default
    assert guided["needs"] == [] and guided["too_few_planned"] == [("few", 1)]
    text = format_report(spec, rows)
    assert "## Unguided (cfg 1)" in text and "## Guided (cfg 6)" in text
    assert "- Unguided (cfg 1): `g` replaces `paper`: 20.0 FID ahead at step 200" in text
    assert "- Guided (cfg 6): `r` replaces `paper`: 10.0 FID ahead at step 200" in text
    assert "Not compared at all (their arms list fewer than 2 training seeds; add seeds to compare them): `few` (1)" \
        in text
    acc = {(a["arm"], a["step"]): a for a in aggregate(spec, rows, "digit_accuracy", 6.0)}
    assert acc["r", 200]["mean"] == pytest.approx(0.95) and acc["r", 200]["n"] == 2
    assert "| r | c.yaml  | pending | 0.950 ± 0.000 (2 seeds) |" in text
    assert "| r | c.yaml  | pending | not measured (s0, s1 scored without it) |" in text  # unguided


def test_not_decided_yet_says_which_seeds_are_needed_where():
    spec = _guided_spec(min_seeds=2)
    rows = [_row("paper", s, 100, 50.0 + s) for s in (0, 1)] + [_row("g", s, 100, 40.0 + s) for s in (0, 1)]
    rows += [_row("paper", 0, 200, 30.0)]
    d = decide(spec, rows, 1.0)
    assert d["step"] == 100 and d["needs"] == [("paper", 1), ("g", 0), ("r", 0)]
    text = format_report(spec, rows)
    assert ("provisional, not decided yet: needs 2 seeds at step 200 of `paper` (has 1), `g` (has 0), `r` (has 0)"
            in text)
    assert "- Guided (cfg 6): not decided yet: needs 2 seeds at step 200 of `paper` (has 0)" in text


def _old_results(tmp_path: Path, spec) -> Path:
    """A study.json as the study wrote it before guidance scales: one eval.cfg_scale, rows without one."""
    results = Path(spec.results_dir)
    results.mkdir(parents=True)
    rows = [{"arm": a, "seed": s, "step": st, "sample_seed": 0, "fid": 100.0 + s, "precision": 0.1,
             "kept_from": "study.json"} for a in "ab" for s in (0, 1) for st in (100, 200)]
    payload = {"study": "t", "steps": [100, 200],
               "eval": {"num_samples": 1000, "sample_seed": 0, "noise_seed": None, "noise_training_seeds": [0],
                        "mode": "ode", "method": "heun", "steps": 15, "cfg_scale": 1.0,
                        "metrics": ["fid", "precision"], "reference_data": spec.eval.reference_data,
                        "batch_size": 125},
               "rows": rows}
    (results / "study.json").write_text(json.dumps(payload))
    return results / "study.json"


def test_scores_saved_before_guidance_are_kept_as_unguided_and_new_metrics_read_not_measured(tmp_path):
    spec = load_study(_study(tmp_path, {"metrics": ["fid", "precision", "digit_accuracy"], "noise_seed": None,
                                        "cfg_scales": [1.0, 6.0], "reference_data": "data/mnist32"}))
    path = _old_results(tmp_path, spec)
    kept = saved_rows(spec, path)
    assert len(kept) == 8 and {r["cfg_scale"] for r in kept} == {1.0}
    new = [_row("a", 0, 200, 55.0, 6.0, digit_accuracy=0.97, precision=0.5)]  # a guided evaluation comes in
    write_report(spec, new, log=lambda *_: None)
    payload = json.loads(path.read_text())
    assert len(payload["rows"]) == 9 and payload["eval"]["cfg_scales"] == [1.0, 6.0]
    fid = {(a["arm"], a["step"], a["cfg_scale"]): a for a in payload["aggregate"]["fid"]}
    assert fid["a", 200, 1.0]["mean"] == pytest.approx(100.5) and fid["a", 200, 6.0]["values"] == [55.0]
    text = (path.parent / "study.md").read_text()
    assert "8 of the 9 scores are kept" in text
    assert "| a | c.yaml  | 100.5 ± 0.7 (2 seeds) | 100.5 ± 0.7 (2 seeds) |" in text  # unguided FID: unchanged
    assert "| a | c.yaml  | pending | 55.0 (1/2 seeds; missing s1) |" in text       # guided FID
    assert "not measured (s0, s1 scored without it)" in text             # unguided digit accuracy
    # written again in the new format, and read back: the same rows, nothing lost or duplicated
    write_report(spec, [], log=lambda *_: None)
    assert len(json.loads(path.read_text())["rows"]) == 9
    # a scale the study no longer evaluates: those rows are left out, with a note
    unguided = load_study(_study(tmp_path, {"metrics": ["fid"], "noise_seed": None, "cfg_scales": [1.0],
                                            "reference_data": "data/mnist32"}))
    notes = []
    assert len(saved_rows(unguided, path, log=notes.append)) == 8 and "guidance scales" in notes[0]
    other = load_study(_study(tmp_path, {"metrics": ["fid"], "noise_seed": None, "steps": 20,
                                         "reference_data": "data/mnist32"}))
    assert saved_rows(other, path, log=notes.append) == [] and "other evaluation settings" in notes[-1]


def test_a_run_scored_unguided_only_is_trained_again_for_its_guided_scores(tmp_path, capsys):
    spec = load_study(_study(tmp_path, {"metrics": ["fid"], "noise_seed": None, "cfg_scales": [1.0, 6.0],
                                        "reference_data": "data/mnist32"}))
    _old_results(tmp_path, spec)
    saved = saved_rows(spec, Path(spec.results_dir) / "study.json")
    assert runner.scored_steps(spec, spec.arms[0], 0, saved) == []
    assert runner.scored_steps(spec, spec.arms[0], 0, saved, 1.0) == [100, 200]
    assert main(["status", str(tmp_path / "study.yaml"), "--arms", "a", "--seeds", "0"]) == 0
    assert "scored steps [] (cfg 1: [100, 200]; cfg 6: [])" in capsys.readouterr().out


def test_the_bundled_study_evaluates_unguided_and_at_the_demos_guidance():
    root = Path(__file__).resolve().parent.parent
    spec = load_study(root / "configs" / "study" / "mnist.yaml")
    demo = yaml.safe_load((root / "vit5_sit" / "assets" / "demo" / "config.yaml").read_text())
    # Guided at 6, the demo's guidance when these cells were scored (since issue #52's frontier: classifier-free
    # 2.5, then autoguidance 3 on t in [0, 0.5] with the folder's guide)
    assert spec.eval.cfg_scales == (1.0, 6.0)
    assert (demo["log"]["sample_cfg_scale"], demo["log"]["sample_guidance_interval"]) == (3.0, [0.0, 0.5])
    assert (spec.eval.mode, spec.eval.method, spec.eval.steps) == ("ode", "heun", 15)  # as every saved cell
    seeds = {a.name: a.seeds for a in spec.arms}
    for arm in ("sit", "vit5-nols", "nols-no-registers", "sit-rope"):  # issue #28's arms, 3 seeds each
        assert len(seeds[arm]) == 3 and arm in spec.decision.candidates
    assert spec.decision.min_seeds == 3 and "digit_accuracy" in spec.eval.metrics
    saved = saved_rows(spec, root / "docs" / "study" / "study.json", log=lambda *_: None)
    assert len(saved) >= 49 and {1.0} <= {r["cfg_scale"] for r in saved}  # every earlier score still counts


def test_a_damaged_digit_classifier_is_one_named_error(tmp_path, monkeypatch):
    import vit5_sit.demo.digit_classifier as dc

    samples = tmp_path / "s.npz"
    np.savez(samples, arr_0=np.zeros((4, 32, 32, 3), np.uint8), arr_1=np.arange(4))
    (tmp_path / "s.npz.json").write_text("{}")
    bad = tmp_path / "classifier"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"not safetensors")
    monkeypatch.setattr(dc, "CLASSIFIER", bad)
    with pytest.raises(StudyError, match="eval.metrics: digit_accuracy: .*model.safetensors"):
        runner.digit_accuracy(samples)
    monkeypatch.setattr(dc, "CLASSIFIER", tmp_path / "none")
    with pytest.raises(StudyError, match="digit_accuracy needs the digit classifier"):
        runner.digit_accuracy(samples)
    with pytest.raises(StudyError, match="digit_accuracy needs the digit classifier, and .* is missing"):
        load_study(_study(tmp_path, {"metrics": ["fid", "digit_accuracy"]}))


@pytest.mark.slow
@needs_inception
def test_a_tiny_study_is_evaluated_unguided_and_guided_end_to_end(tmp_path, monkeypatch):
    """Real training and Inception: each checkpoint sampled at both scales (own cache folders), both scored,
    the report with both sections, and a re-run served from the caches."""
    data = image_folder(tmp_path / "data", per_class=8, prefix="c")
    cfg = tiny_run_config(tmp_path / "tiny.yaml", data, max_steps=2)
    path = _study(tmp_path, {"num_samples": 16, "noise_seed": None, "steps": 2, "method": "euler",
                             "cfg_scales": [1.0, 3.0], "metrics": ["fid"], "reference_data": str(data),
                             "batch_size": 8},
                  arms=[{"name": "a", "config": str(cfg)}], steps=[2], seeds=[0])
    spec = load_study(path)
    assert runner.train_all(spec, poll_s=0.5, log=lambda *_: None) == [("a", 0, 0)]
    rows = runner.evaluate_all(spec, progress=False, log=lambda *_: None)
    assert [(r["step"], r["cfg_scale"]) for r in rows] == [(2, 1.0), (2, 3.0)]
    assert Path(rows[0]["samples"]).parent.name.endswith("cfg1") and Path(rows[1]["samples"]).parent.name.endswith(
        "cfg3")
    # (after 2 steps the zero-initialised adaLN ignores the label, so the images may agree: the manifests tell)
    made = [json.loads(Path(r["samples"] + ".json").read_text()) for r in rows]
    assert [m["cfg_scale"] for m in made] == [1.0, 3.0]
    assert main(["report", str(path)]) == 0
    text = (tmp_path / "results" / "study.md").read_text()
    assert "### FID, unguided (cfg 1)" in text and "### FID, guided (cfg 3)" in text
    assert (tmp_path / "results" / "fid_vs_step_cfg3.png").is_file() and (tmp_path / "results" / "grid_a_cfg3.png")\
        .is_file()
    import vit5_sit.sampling.generate as generate

    monkeypatch.setattr(generate, "sample_to_npz", lambda *a, **k: (_ for _ in ()).throw(AssertionError("again")))
    again = runner.evaluate_all(spec, progress=False, log=lambda *_: None)
    assert [r["fid"] for r in again] == [r["fid"] for r in rows]
    saved = saved_rows(spec, tmp_path / "results" / "study.json")
    assert runner.scored_steps(spec, spec.arms[0], 0, saved) == [2]


# ----------------------------------------------------------------------------------------------------------
# #52: autoguidance in the study's evaluation: a guide per arm (the same run at a step, another run, or none).

def test_guides_in_a_study_file_are_checked_where_they_enter(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    arms = [{"name": "a", "config": str(cfg)}]
    base = {"metrics": ["fid"], "noise_seed": None, "reference_data": str(tmp_path / "digits"),
            "cfg_scales": [1.0, 2.0]}
    for guide, message in [("step:150", "no checkpoint at step 150"), ("step:0", "positive whole step"),
                           ("step:x", "positive whole step"), (7, "expected step:N"), ("none", "leave eval.guide out"),
                           ("runs/g-{arm}", "only placeholder")]:
        with pytest.raises(StudyError, match=re.escape(message)):
            load_study(_study(tmp_path, {**base, "guide": guide}, arms=arms))
    with pytest.raises(StudyError, match="no guided scale"):
        load_study(_study(tmp_path, {**base, "guide": "step:100", "cfg_scales": [1.0]}, arms=arms))
    with pytest.raises(StudyError, match=r"arms\[0\].guide: 'step:-1'"):
        load_study(_study(tmp_path, base, arms=[{**arms[0], "guide": "step:-1"}]))
    spec = load_study(_study(tmp_path, {**base, "guide": "step:100"},
                             arms=[*arms, {"name": "b", "config": str(cfg), "guide": "none"},
                                   {"name": "c", "config": str(cfg), "guide": "runs/small-s{seed}"}]))
    a, b, c = spec.arms
    assert [spec.guide_for(x, 1, 2.0) for x in (a, b, c)] == ["step:100", None, "runs/small-s1"]
    assert spec.guide_for(a, 1, 1.0) is None and spec.guide_text == "per arm"


@pytest.mark.slow
@needs_inception
def test_a_tiny_study_is_evaluated_with_autoguidance(tmp_path):
    """Real training and Inception: the arm is guided by its own step-2 checkpoint (eval.guide: step:2); rows say
    which guide they used, the samples' manifest names it, the report says autoguided, and saved scores of another
    guide are not kept (its unguided ones are)."""
    data = image_folder(tmp_path / "data", per_class=8, prefix="c")
    cfg = tiny_run_config(tmp_path / "tiny.yaml", data, max_steps=4)
    eval_ = {"num_samples": 16, "noise_seed": None, "steps": 2, "method": "euler", "cfg_scales": [1.0, 2.0],
             "metrics": ["fid"], "reference_data": str(data), "batch_size": 8, "guide": "step:2"}
    arms = [{"name": "a", "config": str(cfg)}]
    path = _study(tmp_path, eval_, arms=arms, steps=[4], seeds=[0])
    spec = load_study(path)
    assert runner.train_all(spec, poll_s=0.5, log=lambda *_: None) == [("a", 0, 0)]
    rows = runner.evaluate_all(spec, progress=False, log=lambda *_: None)
    assert [(r["cfg_scale"], r.get("guide")) for r in rows] == [(1.0, None), (2.0, "step:2")]
    made = [json.loads(Path(r["samples"] + ".json").read_text()) for r in rows]
    from vit5_sit.hub.model_files import model_identity

    step2 = tmp_path / "runs" / "a-s0" / "checkpoints" / "step_0000002"
    assert made[1]["guide"] == json.loads(json.dumps(model_identity(step2)))  # the run's own step-2 checkpoint
    assert made[0].get("guide") is None
    assert main(["report", str(path)]) == 0
    text = (tmp_path / "results" / "study.md").read_text()
    assert "### FID, autoguided (weight 2, guide step:2)" in text and "### FID, unguided (cfg 1)" in text
    assert len(saved_rows(spec, tmp_path / "results" / "study.json")) == 2
    other = load_study(_study(tmp_path, {**eval_, "guide": "step:4"}, arms=arms, steps=[4], seeds=[0]))
    kept = saved_rows(other, tmp_path / "results" / "study.json", log=lambda *_: None)
    assert [(r["arm"], r["cfg_scale"]) for r in kept] == [("a", 1.0)]
