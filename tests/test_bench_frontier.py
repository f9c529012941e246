"""The frontier's default rule (benchmarks/bench_frontier.py): which cells are the reference, and the pick."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("bench_frontier", Path(__file__).parents[1] / "benchmarks" /
                                              "bench_frontier.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def row(cell, nfe, fid, accuracy=1.0):
    return {"cell": cell, "nfe": nfe, "cfg": float(cell.split("@")[1]), "fid": fid, "accuracy": accuracy}


ROWS = [
    row("sde/euler/249@6", 250, 101.5, 0.999), row("dopri5/tol/1e-5@6", 158, 64.8),
    row("dopri5/tol/1e-3@6", 50, 60.0),             # loose: a candidate, never the reference
    row("dpm++2m/uniform/4@6", 4, 66.0, 0.999),    # within 5% but a digit wrong: out
    row("dpm++2m/uniform/5@6", 5, 68.8),           # +6.2%: out
    row("dpm++2m/uniform/6@6", 6, 67.1), row("euler/uniform/6@6", 6, 66.6),
    row("dpm++2m/uniform/10@6", 10, 64.8), row("dpm++2m/uniform/10@1", 10, 70.0, 0.8),
]


def test_reference_is_the_best_of_sde_250_and_tight_dopri5_per_guidance():
    assert bench.reference_fids(ROWS) == {1.0: None, 6.0: 64.8}


def test_pick_is_the_fewest_nfe_within_5_percent_with_no_digit_lost_ties_best_fid_first():
    picks = bench.recommend(ROWS, 6.0, 64.8)
    assert [r["cell"] for r in picks] == ["euler/uniform/6@6", "dpm++2m/uniform/6@6"]
    assert bench.recommend(ROWS, 1.0, None) == []
    # the floor is the reference cell's own accuracy: with the SDE (99.9%) as the reference, 4 steps qualify
    assert [r["cell"] for r in bench.recommend(ROWS, 6.0, 101.5, tolerance=0.0)] == ["dpm++2m/uniform/4@6"]


@pytest.mark.parametrize("cell", ["dpm++2m/uniform@6", "dpm++2m/uniform/ten@6", "euler/uniform/10"])
def test_a_malformed_cell_is_one_line(cell):
    with pytest.raises(SystemExit, match="METHOD/GRID/STEPS@CFG"):
        bench.parse_cell(cell)
