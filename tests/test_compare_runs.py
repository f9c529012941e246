"""benchmarks/compare_runs.py (issue #46's resume experiment): two runs' checkpoints at one step are compared
tensor by tensor (weights, EMA, AdamW moments); equal ones exit 0, any difference 1, a missing checkpoint 2."""

import importlib.util
from pathlib import Path

import torch

from vit5_sit.train.checkpoint import save_checkpoint

SPEC = importlib.util.spec_from_file_location("compare_runs", Path(__file__).parents[1] / "benchmarks" /
                                              "compare_runs.py")
compare_runs = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare_runs)


def _run(root: Path, name: str, nudge: str | None = None) -> Path:
    torch.manual_seed(0)
    model = {"w": torch.randn(3, 4), "b": torch.randn(4)}
    ema = {k: v * 0.5 for k, v in model.items()}
    moments = {0: {"step": torch.tensor(7.0), "exp_avg": torch.randn(3, 4), "exp_avg_sq": torch.rand(3, 4)}}
    if nudge == "ema":
        ema["b"] = ema["b"].clone()
        ema["b"][0] = torch.nextafter(ema["b"][0], torch.tensor(1e9))  # one ulp: exact means exact
    if nudge == "moments":
        moments[0]["exp_avg_sq"] = moments[0]["exp_avg_sq"] + 1e-3
    state = {"step": 5, "optimizer": {"state": moments, "param_groups": [{"params": [0]}]}}
    save_checkpoint(root / name, 5, model, ema, state)
    return root / name


def test_equal_runs_are_bit_identical_and_one_ulp_is_a_difference(tmp_path, capsys):
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    assert compare_runs.main([str(a), str(b), "--step", "5"]) == 0
    assert "bit-identical" in capsys.readouterr().out
    ema = _run(tmp_path, "ema", nudge="ema")
    assert compare_runs.main([str(a), str(ema), "--step", "5"]) == 1
    out = capsys.readouterr().out
    assert "| EMA weights | 2 | 1 |" in out and "| model weights | 2 | 0 | 0 |" in out
    moments = _run(tmp_path, "m", nudge="moments")
    assert compare_runs.main([str(a), str(moments), "--step", "5"]) == 1
    assert "| AdamW moments | 3 | 1 | 0.001 |" in capsys.readouterr().out


def test_a_missing_checkpoint_is_named(tmp_path, capsys):
    a = _run(tmp_path, "a")
    assert compare_runs.main([str(a), str(tmp_path / "nothing"), "--step", "5"]) == 2
    assert compare_runs.main([str(a), str(a), "--step", "6"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint at step 5" in err and "no checkpoint at step 6" in err
