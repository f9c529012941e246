"""Issue #53: a study report takes only scores that can be scores. Every metric value where study.json or an
evaluation cache is read is checked against its metric's range (contract.METRIC_RANGES: FID >= 0, precision /
recall / digit accuracy in [0, 1], finite), and an evaluation given twice is refused, naming it (the arm table and
the paired comparison counted a duplicate differently)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_study_saved import _all_rows, _row, _study

from vit5_sit.common.contract import METRIC_RANGES, metric_problem
from vit5_sit.study import StudyError, load_study
from vit5_sit.study.__main__ import main
from vit5_sit.study.report import saved_rows, write_report

# The bounds every score must keep, stated here (not read from METRIC_RANGES): loosening one there fails a test.
OUTSIDE = {"fid": [-0.1, -30.0, math.nan, math.inf], "sfid": [-1.0, math.nan], "precision": [-0.01, 1.01, 2.0],
           "recall": [-0.5, 1.5], "digit_accuracy": [-0.1, 1.1], "is": [0.5, -2.0], "kid_std": [-0.1],
           "is_std": [-1.0]}
INSIDE = {"fid": [0.0, 3.5, 1e4], "precision": [0.0, 1.0], "recall": [0.5], "digit_accuracy": [1.0], "is": [1.0, 9.0],
          "kid": [-0.001, 0.2]}


def test_the_stated_bounds_hold():
    for metric, values in OUTSIDE.items():
        for v in values:
            assert metric_problem(metric, v), (metric, v)
    for metric, values in INSIDE.items():
        for v in values:
            assert metric_problem(metric, v) is None, (metric, v)
    assert set(OUTSIDE) | set(INSIDE) <= set(METRIC_RANGES)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A study and a study.json as its report writes it (the fields `saved_rows` reads; a report itself draws plots
    and grids, seconds on this CPU)."""
    tmp_path = tmp_path_factory.mktemp("study")
    spec = load_study(_study(tmp_path))
    payload = {"study": spec.name, "eval": spec.eval.__dict__, "rows": [{**r, "cfg_scale": 1.0} for r in _all_rows()]}
    return spec, json.loads(json.dumps(payload, default=str))


def _saved_with(tmp_path: Path, payload: dict, change) -> Path:
    payload = json.loads(json.dumps(payload))
    change(payload["rows"])
    path = tmp_path / "study.json"
    path.write_text(json.dumps(payload))
    return path


@settings(max_examples=20, deadline=None)
@given(metric=st.sampled_from(sorted(OUTSIDE)), row=st.integers(0, 7), data=st.data())
def test_a_saved_score_outside_its_range_is_refused(saved, tmp_path_factory, metric, row, data):
    spec, payload = saved
    bad = data.draw(st.sampled_from(OUTSIDE[metric]))
    path = _saved_with(tmp_path_factory.mktemp("s"), payload, lambda rows: rows[row].update({metric: bad}))
    with pytest.raises(StudyError, match=rf"study.json: .* {metric}=.*: must be"):
        saved_rows(spec, path, log=lambda *_: None)


@settings(max_examples=10, deadline=None)
@given(row=st.integers(0, 7), data=st.data())
def test_a_saved_row_given_twice_is_refused_naming_it(saved, tmp_path_factory, row, data):
    spec, payload = saved
    again = dict(payload["rows"][row])
    if data.draw(st.booleans()):
        again["fid"] = 1.0  # the same evaluation with another score
    path = _saved_with(tmp_path_factory.mktemp("s"), payload, lambda rows: rows.append(again))
    named = f"{again['arm']} seed {again['seed']} step {again['step']} sample seed 0 cfg 1.0"
    with pytest.raises(StudyError, match=rf"study.json: 1 evaluation\(s\) given more than once \({named}\)"):
        saved_rows(spec, path, log=lambda *_: None)


def test_study_report_with_a_negative_fid_is_one_line_and_writes_nothing(saved, tmp_path, capsys):
    spec = load_study(_study(tmp_path))
    results = Path(spec.results_dir)
    results.mkdir()
    payload = json.loads(json.dumps(saved[1]))
    payload["rows"][0]["fid"] = -50.0  # would make arm a the winner
    (results / "study.json").write_text(json.dumps(payload))
    before = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}
    assert main(["report", str(tmp_path / "study.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fid=-50.0: must be >= 0" in err[0] and "a seed 0 step 100" in err[0], err
    assert {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()} == before


def test_new_rows_given_twice_are_refused_before_anything_is_written(tmp_path):
    spec = load_study(_study(tmp_path))
    with pytest.raises(StudyError, match=r"the evaluations: 1 evaluation\(s\) given more than once \(b seed 1 "
                                         r"step 200 sample seed 0 cfg 1.0\)"):
        write_report(spec, [*_all_rows(), _row("b", 1, 200, 3.0)], log=lambda *_: None)
    assert not Path(spec.results_dir).exists()


def test_new_scores_outside_their_range_are_refused_before_anything_is_written(tmp_path):
    spec = load_study(_study(tmp_path))
    with pytest.raises(StudyError, match="the evaluations: a seed 0 step 100 .*: fid=-1.0: must be >= 0"):
        write_report(spec, [_row("a", 0, 100, -1.0)], log=lambda *_: None)
    assert not Path(spec.results_dir).exists()


def test_a_damaged_cached_score_is_not_taken(tmp_path, monkeypatch):
    """The evaluation caches: a cached result with a score outside its range is damaged, computed again."""
    from vit5_sit.eval import compare

    class Evaluator:
        key = {"reference": "r"}

        def __call__(self, samples):
            return {"fid": 7.0}

    samples, manifest = tmp_path / "s.npz", tmp_path / "s.manifest.json"
    manifest.write_text("{}")
    first = compare._cached_metrics(samples, manifest, Evaluator(), log=lambda *_: None)
    assert first == {"fid": 7.0}
    cache = next(tmp_path.glob("s.metrics-*.json"))
    cache.write_text(cache.read_text().replace("7.0", "-7.0"))
    assert compare._cached_metrics(samples, manifest, Evaluator(), log=lambda *_: None, compute=False) is None
    assert compare._cached_metrics(samples, manifest, Evaluator(), log=lambda *_: None) == {"fid": 7.0}
