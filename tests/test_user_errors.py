"""Errors that say what to do (issue #45): a missing run or reference names the command that makes it, `demo
export` without --out writes nothing, a torch / torchvision pair that does not match is one line naming the pair,
and vit5-sit-demo's --help names vit5-sit-demo."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vit5_sit.common.checks import ModelLoadError
from vit5_sit.common.interrupt import stops_cleanly
from vit5_sit.common.versions import matching_torchvision, mismatch

ROOT = Path(__file__).resolve().parent.parent


def test_a_missing_run_names_the_config_that_trains_it(monkeypatch, tmp_path):
    from vit5_sit.hub.files import resolve_model_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as e:
        resolve_model_path("runs/mnist-vit5")
    assert str(e.value) == ("runs/mnist-vit5: no such run or model folder; `python train.py --config "
                            "configs/mnist/vit5.yaml` trains it into runs/mnist-vit5 (docs/training.md)")
    with pytest.raises(ModelLoadError, match="runs/nothing-like-it: no such run or model folder; `python train.py "
                                             "--config CONFIG` trains"):
        resolve_model_path("runs/nothing-like-it")
    with pytest.raises(ModelLoadError, match="hf download me/x"):  # a repo id stays a repo id
        resolve_model_path("me/x")


def test_a_missing_reference_names_eval_fid_ref():
    from vit5_sit.eval.errors import EvalError
    from vit5_sit.eval.sources import _existing_path

    with pytest.raises(EvalError, match=r"file not found: refs/mnist.npz; make a reference with `python eval_fid.py "
                                        r"ref --data IMAGE_FOLDER --out refs/mnist.npz`"):
        _existing_path("refs/mnist.npz", reference=True)
    with pytest.raises(EvalError) as e:  # samples are not made by `eval_fid.py ref`
        _existing_path("samples.npz")
    assert str(e.value) == "file not found: samples.npz"


def test_demo_export_needs_out_and_writes_nothing_without_it(capsys):
    from vit5_sit.demo.export import DEMO_MODEL, main
    from vit5_sit.hub.model_files import DEMO_MODEL as BUNDLED

    assert DEMO_MODEL == BUNDLED  # the bundled model's folder, vit5_sit/assets/demo (it was vit5_sit/demo/assets/demo)
    before = sorted(p.name for p in (ROOT / "vit5_sit" / "demo").iterdir())
    with pytest.raises(SystemExit) as e:
        main(["export", str(BUNDLED)])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err
    assert sorted(p.name for p in (ROOT / "vit5_sit" / "demo").iterdir()) == before


@pytest.mark.parametrize("error", [RuntimeError("operator torchvision::nms does not exist"),
                                   OSError("/x/torchvision/_C.so: undefined symbol: _ZN3c10"),
                                   ImportError("Couldn't load custom C++ ops of torchvision")])
def test_a_torchvision_for_another_torch_is_one_line(error, capsys):
    @stops_cleanly("interrupted")
    def main() -> int:
        raise error

    assert main() == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: torchvision ") and "pip install torch==" in err
    assert matching_torchvision("2.14.1") == "0.29.1" and matching_torchvision("2.4.0+cpu") == "0.19.0"
    assert mismatch(RuntimeError("CUDA out of memory")) is None


def test_vit5_sit_demo_help_names_itself(monkeypatch, capsys):
    from vit5_sit.demo.app import main

    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/vit5-sit-demo", "--help"])
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: vit5-sit-demo")
    monkeypatch.setattr(sys, "argv", ["/x/vit5_sit/app.py", "--help"])
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m vit5_sit.app")
