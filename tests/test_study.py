"""The study runner: spec checks, aggregation (mean ± sd over training seeds, missing seeds named), and a tiny
real study (two arms, two seeds, a few steps) trained, evaluated, reported, and re-run without redoing work."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from tinydata import image_folder, needs_inception, tiny_run_config

from vit5_sit.common.interrupt import sigint_at_default
from vit5_sit.study import Arm, EvalSpec, StudyError, StudySpec, aggregate, load_study, mean_sd, sampling_noise
from vit5_sit.study.__main__ import main
from vit5_sit.study.report import format_report

TINY_CONFIG = "name: x\ntrain: {ckpt_every: 100, keep_last: 0}\n"  # a checkpoint at every study step, all kept


def _spec(arms, steps=(100, 200), noise_seed=None) -> StudySpec:
    return StudySpec(name="t", output_dir="runs", results_dir="out", steps=tuple(steps), arms=tuple(arms),
                     eval=EvalSpec(noise_seed=noise_seed))


def _row(arm, seed, step, fid, sample_seed=0):
    return {"arm": arm, "seed": seed, "step": step, "sample_seed": sample_seed, "fid": fid}


def test_component_deltas_pair_each_ablation_with_its_base_by_seed():
    from vit5_sit.study import component_deltas

    spec = _spec([Arm("base", "c.yaml", seeds=(0, 1, 2)), Arm("off", "c.yaml", ("model.rope=false",), seeds=(0, 1, 3)),
                  Arm("other", "d.yaml", seeds=(0,)), Arm("lone", "e.yaml", ("x=1",), seeds=(0,))])
    rows = [_row("base", 0, 100, 50.0), _row("base", 1, 100, 60.0), _row("base", 2, 100, 70.0),
            _row("off", 0, 100, 40.0), _row("off", 1, 100, 56.0), _row("off", 3, 100, 10.0),
            _row("off", 0, 100, 99.0, sample_seed=7),  # another sample seed: not a training-seed score
            _row("off", 0, 200, 30.0)]
    got = {(d["arm"], d["step"]): d for d in component_deltas(spec, rows)}
    assert set(got) == {("off", 100), ("off", 200)}  # `lone` has no plain arm of its config; `other` changes nothing
    d = got[("off", 100)]
    assert d["base"] == "base" and d["diffs"] == [(0, -10.0), (1, -4.0)] and d["unpaired"] == [3]
    assert d["mean"] == pytest.approx(-7.0) and d["sd"] == pytest.approx(math.sqrt(18.0))
    assert got[("off", 200)]["mean"] is None and got[("off", 200)]["unpaired"] == [0]
    text = format_report(spec, rows)
    assert "| off | `model.rope=false` | `base` | -7.0 ± 4.2 (2 seeds); base lacks s3 | pending |" in text


def test_mean_and_sample_sd():
    mean, sd = mean_sd([10.0, 12.0, 17.0])
    assert mean == pytest.approx(13.0)
    assert sd == pytest.approx(math.sqrt((9 + 1 + 16) / 2))  # n - 1 in the denominator
    assert mean_sd([5.0]) == (5.0, None)


def test_aggregate_names_missing_seeds_instead_of_dropping_them():
    spec = _spec([Arm("a", "c.yaml", seeds=(0, 1, 2)), Arm("b", "c.yaml", seeds=(0, 1))])
    rows = [_row("a", 0, 100, 10.0), _row("a", 1, 100, 12.0), _row("a", 2, 100, 17.0),
            _row("a", 0, 200, 8.0), _row("a", 2, 200, 6.0),   # seed 1 missing at 200
            _row("b", 0, 100, 20.0), _row("b", 0, 100, 99.0, sample_seed=7)]  # other sample seeds: not averaged
    agg = {(e["arm"], e["step"]): e for e in aggregate(spec, rows)}
    assert agg["a", 100]["mean"] == pytest.approx(13.0) and agg["a", 100]["n"] == 3
    assert agg["a", 200]["missing"] == [1] and agg["a", 200]["mean"] == pytest.approx(7.0)
    assert agg["b", 100]["values"] == [20.0] and agg["b", 100]["sd"] is None
    assert agg["b", 200]["n"] == 0 and agg["b", 200]["mean"] is None
    table = format_report(spec, rows)
    assert "13.0 ± 3.6 (3 seeds) |" in table
    assert "7.0 ± 1.4 (2/3 seeds; missing s1)" in table
    assert "20.0 (1/2 seeds; missing s1)" in table
    assert "pending" in table


def _decision_spec(steps=(100, 200)):
    from vit5_sit.study import DecisionSpec

    arms = [Arm(n, "c.yaml", seeds=(0, 1, 2)) for n in ("base", "paper", "g", "h")]
    return StudySpec(name="t", output_dir="runs", results_dir="out", steps=tuple(steps), arms=tuple(arms),
                     decision=DecisionSpec(reference="paper", candidates=("paper", "g", "h"), baseline="base"))


def test_decision_rule_picks_a_winner_only_beyond_the_combined_seed_sd():
    from vit5_sit.study import decide

    spec = _decision_spec()
    rows = [_row("paper", s, 100, v) for s, v in enumerate((230.0, 234.0))]   # mean 232, sd 2.83
    rows += [_row("g", s, 100, v) for s, v in enumerate((204.0, 208.0))]      # mean 206, sd 2.83
    rows += [_row("base", s, 100, v) for s, v in enumerate((236.0, 240.0))]
    rows += [_row("h", 0, 100, 150.0)]  # one seed only: reported as not included, however good it looks
    rows += [_row("paper", 0, 200, 160.0), _row("g", 0, 200, 140.0)]          # step 200: one seed each
    d = decide(spec, rows)
    assert d["step"] == 100 and d["winner"] == "g" and d["resolved"]
    assert d["lead"] == pytest.approx(26.0) and d["margin"] == pytest.approx(math.hypot(2 * 2**0.5, 2 * 2**0.5))
    assert [r[0] for r in d["ranking"]] == ["g", "paper"] and d["excluded"] == ["h"]
    assert d["baseline"][0] == "base" and d["baseline"][1] == pytest.approx(238.0)
    table = format_report(spec, rows)
    assert "**`g` wins**: 26.0 FID ahead of `paper`" in table and "Not included" in table

    close = [r if r["arm"] != "g" else {**r, "fid": r["fid"] + 24.0} for r in rows]  # g: 228, 232 -> lead 2
    d = decide(spec, close)
    assert d["winner"] == "paper" and not d["resolved"] and d["lead"] == pytest.approx(2.0)
    assert "**Not resolved**" in format_report(spec, close)

    d = decide(spec, [_row("paper", 0, 100, 1.0), _row("g", 0, 100, 2.0)])  # nothing with two seeds yet
    assert d["step"] is None and d["winner"] == "paper" and not d["resolved"]
    assert "Not decidable yet" in format_report(spec, [_row("paper", 0, 100, 1.0)])
    assert decide(_spec([Arm("a", "c.yaml", seeds=(0,))]), rows) is None  # a study without a rule


def test_sampling_noise_is_the_pooled_sd_of_paired_differences():
    spec = _spec([Arm("a", "c.yaml", seeds=(0, 1))], steps=(100,), noise_seed=7)
    rows = [_row("a", 0, 100, 10.0), _row("a", 0, 100, 12.0, 7), _row("a", 1, 100, 20.0), _row("a", 1, 100, 16.0, 7)]
    (noise,) = sampling_noise(spec, rows)
    assert noise["sd"] == pytest.approx(math.sqrt((4 + 16) / 2 / 2))


def _write_spec(tmp_path: Path, body: dict) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.mark.parametrize("change, message", [
    ({"steps": [200, 100]}, "increasing"),
    ({"steps": []}, "steps"),
    ({"seeds": [0, 0]}, "twice"),
    ({"colour": 1}, "unknown key(s) colour"),
    ({"arms": [{"name": "a b", "config": "CFG"}]}, "arms[0].name"),
    ({"arms": [{"name": "a", "config": "missing.yaml"}]},
     "arms[0].config: 'missing.yaml' is not a config file (relative paths are read from the current folder"),
    ({"arms": [{"name": "a", "config": 3}]}, "arms[0].config: 3 is not a config file"),
    ({"arms": [{"name": "a"}]}, "arms[0].config: None is not a config file"),
    ({"arms": [{"name": "a", "config": "CFG"}, {"name": "a", "config": "CFG"}]}, "listed twice"),
    ({"arms": [{"name": "a", "config": "CFG", "overrides": ["model.rope"]}]}, "key=value"),
    ({"eval": {"num_samples": 0}}, "eval.num_samples"),
    ({"eval": {"samples": 10}}, "unknown key(s) samples"),
    ({"decision": {"reference": "b", "candidates": ["a"]}}, "decision.reference: 'b' is not an arm"),
    ({"decision": {"reference": "a", "candidates": ["a", "z"]}}, "decision.candidates: 'z' is not an arm"),
    ({"decision": {"reference": "a", "candidates": ["a"], "min_seeds": 1}}, "decision.min_seeds: 1"),
    ({"decision": {"reference": "a", "candidates": []}}, "decision.candidates"),
    ({"decision": {"reference": "a", "candidates": ["a"], "rule": 1}}, "unknown key(s) rule"),
    # found when the file is read, not after hours of training: the sampler, the metrics, the seeds, ...
    ({"eval": {"mode": "odee"}}, "eval.mode / eval.method: SamplerConfig.mode='odee': must be one of 'ode', 'sde'"),
    ({"eval": {"mode": "sde", "method": "dopri5"}}, "method='dopri5': must be one of 'euler', 'heun'"),
    ({"eval": {"metrics": ["fid", "fdd"]}}, "eval.metrics: unknown metric 'fdd'"),
    ({"eval": {"cfg_scale": "high"}}, "eval.cfg_scale 'high': must be >= 0"),
    ({"eval": {"sample_seed": -1}}, "eval.sample_seed: expected an integer >= 0, got -1"),
    ({"eval": {"num_samples": 100, "sample_seed": 4294967200}}, "eval.sample_seed=4294967200: sample seeds must lie"),
    ({"eval": {"num_samples": 100, "noise_seed": 4294967200}}, "eval.noise_seed=4294967200: sample seeds must lie"),
    ({"eval": {"noise_seed": "b"}}, "eval.noise_seed: expected an integer >= 0 or null"),
    ({"eval": {"num_samples": 100, "noise_seed": 50}}, "eval.noise_seed: 50 gives sample seeds 50..149, which overlap"),
    ({"eval": {"noise_training_seeds": [3]}}, "eval.noise_training_seeds: 3 is not a training seed of any arm"),
    ({"eval": {"reference_data": 5}}, "eval.reference_data: expected a string"),
    ({"name": ["x"]}, "name: expected a non-empty string"),
    ({"output_dir": 3}, "output_dir: expected a non-empty string, got 3"),
    ({"arms": [{"name": "a", "config": "CFG", "label": {"x": 1}}]}, "arms[0].label: expected a short text"),
    # paths too long for the OS ("File name too long" from Path.is_file, or when the run folder is made)
    ({"arms": [{"name": "a", "config": "c/" * 2100}]}, "arms[0].config: 4,200 bytes long"),
    ({"arms": [{"name": "a" * 254, "config": "CFG"}]}, "arms[0].name: the run folder <name>-s<seed> is a path part"),
    ({"results_dir": "r" * 256}, "results_dir: a path part of 256 bytes"),
    ({"output_dir": " "}, "output_dir: expected a non-empty string, got ' '"),
    ({"eval": {"reference_data": "d" * 300}}, "eval.reference_data: a path part of 300 bytes"),
    # ... and each arm's config with its overrides, and that every evaluated checkpoint is saved and kept
    ({"arms": [{"name": "a", "config": "CFG", "overrides": ["model.ropee=false"]}]},
     "arms[0] (a): unknown config key 'model.ropee'. Did you mean model.rope?"),
    ({"arms": [{"name": "a", "config": "CFG", "overrides": ["model.rope=maybe"]}]}, "arms[0] (a): model.rope='maybe'"),
    ({"arms": [{"name": "a", "config": "CFG", "overrides": ["train.ckpt_every=150"]}]},
     "arms[0] (a): train.ckpt_every=150 saves no checkpoint at step 100, which the study evaluates"),
    ({"arms": [{"name": "a", "config": "CFG", "overrides": ["train.keep_last=5"]}]},
     "arms[0] (a): train.keep_last=5 deletes older checkpoints"),
])
def test_bad_study_files_are_named_errors(tmp_path, change, message, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    body = {"name": "t", "steps": [100, 200], "seeds": [0], "arms": [{"name": "a", "config": str(cfg)}], **change}
    body["arms"] = [{**a, "config": str(cfg) if a.get("config") == "CFG" else a.get("config")} for a in body["arms"]]
    path = _write_spec(tmp_path, body)
    with pytest.raises(StudyError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_study(path)
    assert main(["status", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


@pytest.mark.parametrize("content, message", [(b"name: t\nsteps: [\xff]\n", "not a text file"),
                                              (b"name: t\nsteps: [" + b"9" * 5000 + b"]\n", "unreadable value")])
def test_unreadable_study_files_are_one_line(tmp_path, content, message, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes(content)
    assert main(["status", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and str(path) in err[0]


def _file(folder: Path, text: str) -> Path:
    (folder / "s.yaml").write_text(text)
    return folder / "s.yaml"


@pytest.mark.parametrize("make, message", [
    # a second `arms:` silently replaced the first list (PyYAML keeps the last key): half a study dropped
    (lambda d: _file(d, "name: t\nsteps: [10]\narms: [{name: a, config: c.yaml}]\narms: [{name: b, config: c.yaml}]\n"),
     "key 'arms' is given twice in one section (lines 3 and 4); keep one"),
    (lambda d: d, "is a folder; give a study YAML file"),  # was "study file not found"
    (lambda d: d / ("x" * 300 + ".yaml"), "more than the OS allows for one file or folder name"),  # a traceback
    (lambda d: _file(d, ""), "expected a mapping with name, steps, seeds, arms"),
])
def test_study_files_are_read_like_configs(tmp_path, make, message, capsys):
    path = make(tmp_path)
    with pytest.raises(StudyError, match=re.escape(message)):
        load_study(path)
    try:
        assert main(["status", str(path)]) == 2
    except SystemExit as e:  # the long name is refused by the argument parser already
        assert e.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(("error: ", "python -m vit5_sit.study: error: ")) and message in err[-1]


def test_part_of_a_study_is_chosen_by_arm_and_seed_and_bad_names_are_named(tmp_path, capsys):
    from vit5_sit.study.runner import select_pairs, train_command

    spec = _spec([Arm("a", "c.yaml", seeds=(0, 1, 2)), Arm("b", "c.yaml", seeds=(0, 1))])
    pairs = [(a.name, s) for a, s in select_pairs(spec, ["b"], None)]
    assert pairs == [("b", 0), ("b", 1)]
    assert [(a.name, s) for a, s in select_pairs(spec, None, [1])] == [("a", 1), ("b", 1)]
    assert len(select_pairs(spec)) == 5
    with pytest.raises(StudyError, match="--arms 'c'.*arms: a, b"):
        select_pairs(spec, ["c"])
    with pytest.raises(StudyError, match="--seeds 5.*seeds: 0, 1, 2"):
        select_pairs(spec, None, [5])
    cmd = train_command(spec, spec.arms[0], 1, 100)  # the installed trainer, not a file beside the package
    assert cmd[1:3] == ["-m", "vit5_sit.cli.train"] and "train.seed=1" in cmd
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    body = {"name": "t", "steps": [100], "seeds": [0], "arms": [{"name": "a", "config": str(cfg)}]}
    path = _write_spec(tmp_path, body)
    assert main(["train", str(path), "--arms", "zz"]) == 2
    assert "--arms 'zz': no such arm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", str(path), "--seeds", "x"])
    assert "whole-number seeds" in capsys.readouterr().err
    for flag, value in [("--until", "0"), ("--until", "-5"), ("--jobs", "0"), ("--threads", "-1")]:
        with pytest.raises(SystemExit):  # once `--until 0` meant "to the end" and `--until -5` "nothing to do"
            main(["train", str(path), flag, value])
        assert f"argument {flag}: must be at least 1, got {value}" in capsys.readouterr().err
    assert main(["train", str(path), "--until", "150"]) == 2
    assert "--until 150: beyond the study's last step 100" in capsys.readouterr().err
    # a flag the command does not act on is refused, not ignored (`train --steps 100` trained to the end)
    for argv, flag in [(["train", "--steps", "100"], "--steps"), (["status", "--until", "100"], "--until"),
                       (["report", "--arms", "a"], "--arms"), (["eval", "--jobs", "2"], "--jobs")]:
        with pytest.raises(SystemExit):
            main([argv[0], str(path), *argv[1:]])
        assert f"{flag} does nothing for '{argv[0]}'" in capsys.readouterr().err
    assert main(["status", str(path), "--seeds", "0"]) == 0  # status takes the filters
    assert "a s0: step" in capsys.readouterr().out
    assert main(["status", str(path), "--arms", "zz"]) == 2


def test_run_refuses_a_missing_reference_before_training(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    path = _write_spec(tmp_path, {"name": "t", "steps": [100], "seeds": [0], "output_dir": str(tmp_path / "runs"),
                                  "eval": {"reference_data": str(tmp_path / "no-digits")},
                                  "arms": [{"name": "a", "config": str(cfg)}]})
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "eval.reference_data:" in err and "no-digits is not a folder of real images" in err
    assert not (tmp_path / "runs").exists()  # nothing was trained


def test_evaluation_plan_with_and_without_the_sampling_noise_rescoring():
    from vit5_sit.study.runner import evaluation_plan

    spec = _spec([Arm("a", "c.yaml", seeds=(0, 1))], steps=(100, 200), noise_seed=7)
    full = [(a.name, seed, step, s) for a, seed, step, s, _ in evaluation_plan(spec)]
    assert ("a", 0, 100, 7) in full and ("a", 1, 100, 7) not in full  # noise_training_seeds defaults to [0]
    assert len(full) == 6
    main_only = [(a.name, seed, step, s) for a, seed, step, s, _ in evaluation_plan(spec, noise=False)]
    assert main_only == [x for x in full if x[3] == 0] and len(main_only) == 4
    part = [(a.name, seed, step, s, c) for a, seed, step, s, c in evaluation_plan(spec, False, None, [1], [200])]
    assert part == [("a", 1, 200, 0, 1.0)]
    guided = dataclasses.replace(spec, eval=dataclasses.replace(spec.eval, cfg_scales=(1.0, 6.0)))
    both = [(a.name, seed, step, s, c) for a, seed, step, s, c in evaluation_plan(guided, False, None, [1], [200])]
    assert both == [("a", 1, 200, 0, 1.0), ("a", 1, 200, 0, 6.0)]  # each checkpoint unguided and guided
    assert len(evaluation_plan(guided)) == 12  # the sampling noise at both scales too
    with pytest.raises(StudyError, match="--steps 300: not a step the study evaluates; steps: 100, 200"):
        evaluation_plan(spec, steps=[300])


def test_the_bundled_study_file_is_valid():
    spec = load_study(Path(__file__).resolve().parent.parent / "configs" / "study" / "mnist.yaml")
    assert {"sit", "vit5", "vit5-nols"} <= {a.name for a in spec.arms}
    assert all(len(a.seeds) >= 2 for a in spec.arms)
    assert spec.eval.num_samples >= 1000


def test_the_generation_study_shares_the_component_studys_runs_and_samples_like_the_demo():
    """configs/study/generation.yaml (#28) trains into the component study's run folders: an arm of both files must
    be the same training (config, overrides), and its sampler is the demo's default (the frontier's pick)."""
    from vit5_sit.config import load_config

    root = Path(__file__).resolve().parent.parent
    gen = load_study(root / "configs" / "study" / "generation.yaml")
    comp = load_study(root / "configs" / "study" / "mnist.yaml")
    assert gen.output_dir == comp.output_dir and gen.results_dir != comp.results_dir
    component_arms = {a.name: a for a in comp.arms}
    for arm in gen.arms:
        assert arm.name in component_arms, arm.name
        other = component_arms[arm.name]
        assert (arm.config, arm.overrides) == (other.config, other.overrides), arm.name
        assert len(arm.seeds) >= 3
    assert gen.max_steps == 3600 and gen.eval.cfg_scales == (1.0, 6.0)
    demo = load_config(root / "vit5_sit" / "assets" / "demo" / "config.yaml")
    assert (gen.eval.mode, gen.eval.method, gen.eval.steps) == (demo.sampler.mode, demo.sampler.method,
                                                                 demo.sampler.steps)
    # Guided at 6: the demo's guidance when the study was scored; the demo's default is autoguidance 3 on t in
    # [0, 0.5] since the guidance frontier (issue #52, docs/study/guidance/), which the studies' records predate.
    assert (demo.log.sample_cfg_scale, demo.log.sample_guidance_interval) == (3.0, [0.0, 0.5])
    assert {"sfid", "precision", "recall", "digit_accuracy"} <= set(gen.eval.metrics)
    assert set(gen.decision.candidates) == {a.name for a in gen.arms}


# ----------------------------------------------------------------------------------------------------------
# A real tiny study: train.py subprocesses, Inception features, the report.

@pytest.mark.slow
@needs_inception
def test_tiny_study_trains_evaluates_reports_and_resumes(tmp_path, monkeypatch):
    import vit5_sit.sampling.generate as generate
    from vit5_sit.study import runner
    from vit5_sit.study.report import write_report

    data = image_folder(tmp_path / "data", per_class=8, prefix="c")
    cfg = tiny_run_config(tmp_path / "tiny.yaml", data, max_steps=4)
    spec_path = _write_spec(tmp_path, {
        "name": "tiny", "output_dir": str(tmp_path / "runs"), "results_dir": str(tmp_path / "results"),
        "steps": [2, 4], "seeds": [0, 1],
        "eval": {"num_samples": 16, "noise_seed": 1000, "noise_training_seeds": [0], "steps": 2, "method": "euler",
                 "metrics": ["fid", "precision", "recall"], "reference_data": str(data), "batch_size": 8},
        "arms": [{"name": "vit5", "config": str(cfg)},
                 {"name": "sit", "config": str(cfg), "overrides": ["model.preset=SiT-T/2"]}]})
    spec = load_study(spec_path)
    results = runner.train_all(spec, jobs=2, poll_s=0.5)
    assert sorted(results) == [("sit", 0, 0), ("sit", 1, 0), ("vit5", 0, 0), ("vit5", 1, 0)]
    assert runner.train_all(spec, poll_s=0.5) == []  # re-run: everything is at its step, nothing starts
    shutil.rmtree(spec.run_dir(spec.arms[1], 1) / "checkpoints" / "step_0000004")  # sit seed 1: only step 2
    with pytest.raises(StudyError, match="nothing is evaluated yet"):
        runner.evaluate_all(spec, cached_only=True)  # `report` before any `eval`: one named line

    first = runner.evaluate_all(spec, progress=False, noise=False, log=lambda *_: None)  # main sample seed only
    assert len(first) == 7 and {r["sample_seed"] for r in first} == {0}
    rows = runner.evaluate_all(spec, progress=False, log=lambda *_: None)
    # 2 arms x 2 seeds x 2 steps, less the missing checkpoint, plus the second sample seeds of seed 0 (2 x 2).
    assert len(rows) == 7 + 4
    assert all(np.isfinite(r["fid"]) for r in rows)
    path = write_report(spec, rows)
    table = path.read_text()
    assert "(1/2 seeds; missing s1)" in table and "Sampling noise" in table
    payload = json.loads((path.parent / "study.json").read_text())
    fid = {(a["arm"], a["step"]): a for a in payload["aggregate"]["fid"]}
    vals = [r["fid"] for r in rows if r["arm"] == "vit5" and r["step"] == 4 and r["sample_seed"] == 0]
    assert fid["vit5", 4]["mean"] == pytest.approx(np.mean(vals)) and fid["vit5", 4]["sd"] == pytest.approx(
        np.std(vals, ddof=1))
    assert (path.parent / "fid_vs_step.png").is_file() and (path.parent / "grid_sit.png").is_file()

    def no_sampling(*args, **kwargs):
        raise AssertionError("sampled again")

    monkeypatch.setattr(generate, "sample_to_npz", no_sampling)
    again = runner.evaluate_all(spec, progress=False, log=lambda *_: None)  # served from the caches
    assert [r["fid"] for r in again] == [r["fid"] for r in rows]
    assert [r["fid"] for r in first] == [r["fid"] for r in rows if r["sample_seed"] == 0]
    damaged = spec.run_dir(spec.arms[0], 1) / "config.yaml"  # vit5 seed 1: its checkpoints cannot be read
    good = damaged.read_bytes()
    damaged.write_text("model: [not, a, mapping\n")
    failures: list[str] = []
    partial = runner.evaluate_all(spec, progress=False, log=lambda *_: None, failures=failures)
    assert failures == ["vit5-s1 step 2", "vit5-s1 step 4"] and len(partial) == len(rows) - 2  # the rest: done
    assert main(["eval", str(spec_path), "--no-progress"]) == 1  # the report is written, the failure said
    damaged.write_bytes(good)
    assert main(["eval", str(spec_path), "--no-noise", "--arms", "sit", "--no-progress"]) == 0  # all cached
    assert "Sampling noise" in (tmp_path / "results" / "study.md").read_text()  # the report keeps every row

    def no_scoring(*args, **kwargs):
        raise AssertionError("scored again")

    monkeypatch.setattr(runner, "ensure_reference", no_scoring)
    for metrics in (spec.run_dir(spec.arms[0], 1) / "eval").rglob("step_0000004.metrics-*.json"):
        metrics.unlink()  # vit5 seed 1 at step 4: samples cached, metrics not
    cached = runner.evaluate_all(spec, progress=False, cached_only=True)  # `report`: computes nothing
    assert len(cached) == len(rows) - 1
    assert ("vit5", 1, 4) not in {(r["arm"], r["seed"], r["step"]) for r in cached}


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "launch"), [("SIGINT", "foreground"), ("SIGTERM", "foreground"),
                                            ("SIGINT", "background")])
def test_stopping_the_runner_stops_its_runs_with_a_checkpoint_and_the_rerun_continues(tmp_path, sig, launch):
    """Ctrl-C (or SIGTERM) sent to the runner alone: each running training finishes its step, saves a
    checkpoint and exits (it is not killed mid-run), the runner says so and exits 130; re-run, it continues.
    "background": the runner starts with SIGINT ignored, as ``nohup cmd &`` leaves it; ``kill -INT`` still works."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from vit5_sit.study import runner
    from vit5_sit.train.checkpoint import list_checkpoints

    data = image_folder(tmp_path / "data", prefix="c")
    steps = 400
    cfg = tiny_run_config(tmp_path / "tiny.yaml", data, max_steps=steps, ckpt_every=steps)
    spec_path = _write_spec(tmp_path, {"name": "tiny", "output_dir": str(tmp_path / "runs"), "steps": [steps],
                                       "seeds": [0], "arms": [{"name": "a", "config": str(cfg)}]})
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "vit5_sit.study", "train", str(spec_path)]

    def sigint_ignored() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_at_default if launch == "foreground" else sigint_ignored)
    log = tmp_path / "runs" / "a-s0.log"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # the run's bar has moved: it is in its loop
        if log.is_file() and re.search(rf"\| *[1-9][0-9]*/{steps}\b", log.read_text(errors="replace")):
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "stopping a-s0 after the current step" in out and "Traceback" not in err, (out, err)
    saved = [c.step for c in list_checkpoints(tmp_path / "runs" / "a-s0")]
    assert len(saved) == 1 and 0 < saved[0] < steps, saved  # the step it stopped at, not lost work
    assert "interrupted at step" in log.read_text(errors="replace")

    spec = load_study(spec_path)
    assert runner.train_all(spec, poll_s=0.2, log=lambda *_: None) == [("a", 0, 0)]  # continued to the end
    assert [c.step for c in list_checkpoints(tmp_path / "runs" / "a-s0")][-1] == steps


@pytest.mark.parametrize("command", ["report", "eval", "train"])
def test_where_the_study_writes_is_checked_before_any_work(tmp_path, capsys, command):
    """A results_dir (or output_dir) that cannot be written failed only when the report was written, after
    the evaluations; now the command stops at once."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    (tmp_path / "afile").write_text("x")
    key = "output_dir" if command == "train" else "results_dir"
    path = _write_spec(tmp_path, {"name": "t", "steps": [100], "seeds": [0], key: str(tmp_path / "afile" / "x"),
                                  "arms": [{"name": "a", "config": str(cfg)}]})
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {key} {tmp_path / 'afile' / 'x'}: {tmp_path / 'afile'} is a file, not a folder; "
                   "choose another location"]
