"""The committed study.json is the study's durable record: run folders (checkpoints, evaluation caches) stay
out of git and may be gone (a new machine), and neither the report nor the trainer may then lose or redo the
scores that study.json holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vit5_sit.study import StudyError, load_study, runner
from vit5_sit.study.__main__ import main
from vit5_sit.study.report import merge_rows, saved_rows, write_report

TINY_CONFIG = "name: x\ntrain: {ckpt_every: 100, keep_last: 0}\n"


def _study(tmp_path: Path, **change) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY_CONFIG)
    body = {"name": "t", "output_dir": str(tmp_path / "runs"), "results_dir": str(tmp_path / "results"),
            "steps": [100, 200], "seeds": [0, 1], "eval": {"metrics": ["fid"], "noise_seed": None},
            "arms": [{"name": "a", "config": str(cfg)}, {"name": "b", "config": str(cfg)}], **change}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _row(arm, seed, step, fid):
    return {"arm": arm, "seed": seed, "step": step, "sample_seed": 0, "fid": fid}


def _all_rows(fid=100.0):
    return [_row(a, s, step, fid + 10 * s + step / 100) for a in "ab" for s in (0, 1) for step in (100, 200)]


def _fids(results: Path) -> dict:
    rows = json.loads((results / "study.json").read_text())["rows"]
    return {(r["arm"], r["seed"], r["step"]): r["fid"] for r in rows}


def test_a_report_keeps_the_saved_scores_it_does_not_redo(tmp_path):
    spec = load_study(_study(tmp_path))
    results = Path(spec.results_dir)
    write_report(spec, _all_rows(), log=lambda *_: None)
    before = _fids(results)
    assert len(before) == 8

    # A new machine: only b-s1 is evaluated again (its run folder is here); everything else is gone.
    write_report(spec, [_row("b", 1, 200, 55.0)], log=lambda *_: None)
    after = _fids(results)
    assert after == {**before, ("b", 1, 200): 55.0}  # nothing lost, the new score replaces the old one
    payload = json.loads((results / "study.json").read_text())
    kept = {(r["arm"], r["seed"], r["step"]) for r in payload["rows"] if r.get("kept_from")}
    assert kept == set(before) - {("b", 1, 200)}
    fid = {(a["arm"], a["step"]): a for a in payload["aggregate"]["fid"]}
    assert fid["b", 200]["n"] == 2 and fid["b", 200]["mean"] == pytest.approx((102.0 + 55.0) / 2)
    table = (results / "study.md").read_text()
    assert "7 of the 8 scores are kept from the earlier `study.json`" in table
    assert [(r["arm"], r["seed"], r["step"]) for r in payload["rows"]] == sorted(after)  # the study's order

    write_report(spec, [], log=lambda *_: None)  # again, with nothing evaluated: the same scores
    assert _fids(results) == after


def test_merge_prefers_the_new_score():
    old = [_row("a", 0, 100, 1.0), _row("a", 0, 200, 2.0)]
    merged = merge_rows([_row("a", 0, 200, 9.0)], old)
    assert [(r["step"], r["fid"], r.get("kept_from")) for r in merged] == [(200, 9.0, None), (100, 1.0, "study.json")]


@pytest.mark.parametrize("content", ["{not json", '{"rows": 3}', '{"rows": [{"arm": "a", "seed": "0"}]}',
                                     "[1, 2]", b"\xff\xfe"])
def test_an_unreadable_results_file_is_refused_not_replaced(tmp_path, content, capsys):
    spec = load_study(_study(tmp_path))
    results = Path(spec.results_dir)
    results.mkdir()
    target = results / "study.json"
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(StudyError, match=r"study\.json: not a (readable )?study results file .*move it away"):
        write_report(spec, _all_rows(), log=lambda *_: None)
    assert target.read_bytes() == (content if isinstance(content, bytes) else content.encode())  # untouched
    assert main(["report", str(tmp_path / "study.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study.json" in err[0] and "move it away" in err[0]


def test_a_results_file_with_eval_settings_of_another_shape_is_not_mixed_in(tmp_path):
    spec = load_study(_study(tmp_path))
    write_report(spec, _all_rows(), log=lambda *_: None)
    target = Path(spec.results_dir) / "study.json"
    payload = json.loads(target.read_text())
    target.write_text(json.dumps({**payload, "eval": [1, 2]}))
    notes = []
    assert saved_rows(spec, target, log=notes.append) == [] and "other evaluation settings" in notes[0]


@pytest.mark.parametrize("change, why", [({"eval": {"metrics": ["fid"], "noise_seed": None, "num_samples": 500}},
                                          "other evaluation settings"),
                                         ({"name": "other"}, "study 't', not 'other'")])
def test_scores_of_other_settings_or_another_study_are_not_mixed_in(tmp_path, change, why):
    spec = load_study(_study(tmp_path))
    write_report(spec, _all_rows(), log=lambda *_: None)
    changed = load_study(_study(tmp_path, **change))
    notes = []
    assert saved_rows(changed, Path(changed.results_dir) / "study.json", log=notes.append) == []
    assert len(notes) == 1 and why in notes[0] and "8 scores" in notes[0]
    batch = load_study(_study(tmp_path, eval={"metrics": ["fid"], "noise_seed": None, "batch_size": 7}))
    assert len(saved_rows(batch, Path(batch.results_dir) / "study.json")) == 8  # the batch size changes nothing


def test_scores_of_arms_and_seeds_the_study_no_longer_has_are_left_out(tmp_path):
    spec = load_study(_study(tmp_path))
    write_report(spec, _all_rows(), log=lambda *_: None)
    fewer = load_study(_study(tmp_path, seeds=[0], steps=[100, 200]))
    notes = []
    rows = saved_rows(fewer, Path(fewer.results_dir) / "study.json", log=notes.append)
    assert {(r["arm"], r["seed"]) for r in rows} == {("a", 0), ("b", 0)} and "4 scores" in notes[0]


def test_scored_runs_whose_folders_are_gone_are_not_trained_again(tmp_path, capsys):
    spec = load_study(_study(tmp_path))
    rows = [r for r in _all_rows() if not (r["arm"] == "b" and r["seed"] == 1 and r["step"] == 200)]
    write_report(spec, rows, log=lambda *_: None)
    launched = []

    class FakePopen:  # records what would train; exits at once
        def __init__(self, cmd, **kwargs):
            launched.append(cmd)
            self.returncode = 0

        def poll(self):
            return 0

    import subprocess

    monkey = pytest.MonkeyPatch()
    monkey.setattr(subprocess, "Popen", FakePopen)
    try:
        logs = []
        assert runner.train_all(spec, until=100, poll_s=0, log=logs.append) == []  # all scored at 100
        assert "not trained again: a-s0, b-s0, a-s1, b-s1" in "\n".join(logs)
        assert runner.train_all(spec, poll_s=0, log=lambda *_: None) == [("b", 1, 0)]  # b-s1 lacks step 200
        assert len(launched) == 1
        assert len(runner.train_all(spec, poll_s=0, retrain_scored=True, log=lambda *_: None)) == 4
    finally:
        monkey.undo()
    status = {(s["arm"], s["seed"]): s["scored_steps"] for s in runner.status(spec)}
    assert status["a", 0] == [100, 200] and status["b", 1] == [100]
    assert main(["status", str(tmp_path / "study.yaml")]) == 0
    assert "scored steps [100, 200]" in capsys.readouterr().out


def test_report_on_a_machine_without_any_evaluation(tmp_path, capsys):
    """No reference and no run folders here, only the committed study.json: `report` rewrites the same table
    (before, it refused: "nothing is evaluated yet")."""
    spec = load_study(_study(tmp_path))
    write_report(spec, _all_rows(), log=lambda *_: None)
    before = _fids(Path(spec.results_dir))
    assert main(["report", str(tmp_path / "study.yaml")]) == 0
    assert _fids(Path(spec.results_dir)) == before
    assert "8 of the 8 scores are kept" in capsys.readouterr().out
    (Path(spec.results_dir) / "study.json").unlink()
    assert main(["report", str(tmp_path / "study.yaml")]) == 2  # nothing at all: the named error as before
    assert "nothing is evaluated yet" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["folder", "text"])
def test_a_damaged_results_file_stops_eval_and_run_before_any_work(tmp_path, capsys, monkeypatch, damage):
    spec = load_study(_study(tmp_path))
    target = Path(spec.results_dir) / "study.json"
    if damage == "folder":
        target.mkdir(parents=True)
    else:
        target.parent.mkdir(parents=True)
        target.write_text("{half a file")

    def no_work(*args, **kwargs):
        raise AssertionError("started work")

    monkeypatch.setattr(runner, "ensure_reference", no_work)
    monkeypatch.setattr(runner, "check_reference_source", lambda spec: None)
    monkeypatch.setattr(runner, "train_all", no_work)
    for command in ("eval", "run", "report"):
        assert main([command, str(tmp_path / "study.yaml")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {target}: not a") and "move it away" in err[0]
