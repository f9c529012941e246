"""Weights of the wrong type (issue #32): every loader refuses, in one line naming the file and the tensor,
tensors that are not finite floating-point numbers of the model's shapes, instead of casting them."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from vit5_sit.common.checks import ModelLoadError, tensors_problem
from vit5_sit.hub.files import WEIGHTS_FILE
from vit5_sit.hub.model_files import DEMO_MODEL, check_model, load_for_sampling

DEMO_WEIGHTS = DEMO_MODEL / WEIGHTS_FILE


def _spoil(state: dict, kind: str) -> tuple[dict, str]:
    """A copy of ``state`` with one tensor (or all, for 'int') spoiled; returns it and the spoiled key."""
    key = sorted(state)[min(3, len(state) - 1)]
    state = dict(state)
    if kind == "int":  # all of them: the first is named
        state, key = {k: v.to(torch.int64) for k, v in state.items()}, next(iter(state))
    elif kind == "bool":
        state[key] = state[key] > 0
    elif kind == "complex":
        state[key] = state[key].to(torch.complex64)
    elif kind == "nan":
        state[key] = state[key].float().clone()
        state[key].view(-1)[0] = float("nan")
    elif kind == "inf":
        state[key] = state[key].float().clone()
        state[key].view(-1)[-1] = float("-inf")
    elif kind == "shape":
        state[key] = state[key].float().reshape(-1)[:-1].clone() if state[key].numel() > 1 else torch.zeros(2)
    return state, key


@pytest.mark.parametrize("kind, words", [("int", "dtype int64"), ("bool", "dtype bool"),
                                         ("complex", "dtype complex64"), ("nan", "NaN or inf"),
                                         ("inf", "NaN or inf"), ("shape", "does not fit the model")])
def test_tensors_problem_names_the_tensor(kind, words):
    good = {"a.weight": torch.randn(3, 2), "b.bias": torch.zeros(3, dtype=torch.bfloat16),
            "c": torch.ones(4, dtype=torch.float16), "d": torch.ones(2, dtype=torch.float64)}
    expected = {k: torch.empty(v.shape, device="meta") for k, v in good.items()}
    assert tensors_problem(good, expected) is None
    bad, key = _spoil(good, kind)
    problem = tensors_problem(bad, expected)
    assert problem is not None and words in problem and f"'{key}'" in problem


def test_tensors_problem_other_cases():
    assert tensors_problem({}) == "holds no tensors"
    assert "not a tensor" in tensors_problem({"w": [1.0, 2.0]})
    # A model's integer buffer (BatchNorm's num_batches_tracked) must keep its dtype, not become float.
    expected = {"n": torch.zeros((), dtype=torch.int64)}
    assert tensors_problem({"n": torch.tensor(3)}, expected) is None
    assert "the model's is int64" in tensors_problem({"n": torch.tensor(3.0)}, expected)
    assert "sparse" in tensors_problem({"s": torch.ones(2, 2).to_sparse()})


@pytest.fixture(scope="module")
def demo_state():
    return load_file(str(DEMO_WEIGHTS))


@pytest.mark.parametrize("kind, words", [("int", "dtype int64"), ("bool", "dtype bool"), ("nan", "NaN or inf"),
                                         ("complex", "dtype complex64")])
def test_model_folder_of_bad_weights_is_refused_by_every_loader(tmp_path, demo_state, kind, words):
    folder = tmp_path / "model"
    shutil.copytree(DEMO_MODEL, folder)
    state, key = _spoil(demo_state, kind)
    save_file(state, folder / "ema.safetensors")
    for load in (load_for_sampling, check_model):
        with pytest.raises(ModelLoadError) as e:
            load(folder)
        line = str(e.value)
        assert "\n" not in line and str(folder / "ema.safetensors") in line and words in line
        assert "export the model folder again" in line
    # sample.py: one line, exit 2, nothing written
    from vit5_sit.cli.sample import main

    out = tmp_path / "grid.png"
    assert main(["--ckpt", str(folder), "--out", str(out), "--no-progress"]) == 2
    assert not out.exists() and not (tmp_path / "grid.png.lock").exists()


def test_eval_fid_compare_refuses_bad_weights_before_sampling(tmp_path, demo_state, capsys):
    import numpy as np

    from vit5_sit.cli.eval_fid import main

    folder = tmp_path / "nan-model"
    shutil.copytree(DEMO_MODEL, folder)
    save_file(_spoil(demo_state, "nan")[0], folder / "ema.safetensors")
    np.savez(tmp_path / "ref.npz", np.zeros((4, 32, 32, 3), np.uint8))
    out = tmp_path / "cmp"
    rc = main(["compare", str(folder), "--ref", str(tmp_path / "ref.npz"), "--out", str(out), "--num-samples", "2",
               "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "NaN or inf" in err[0] and "ema.safetensors" in err[0]
    assert not out.exists()


def _tiny_official():
    from vit5_sit.models import create_model

    return create_model("SiT-T/2", input_size=8, num_classes=10)


@pytest.mark.parametrize("kind", ["int", "nan"])
def test_official_file_of_bad_weights(tmp_path, kind):
    from vit5_sit.models import load_official_state_dict

    model = _tiny_official()
    state, key = _spoil(model.state_dict(), kind)
    path = tmp_path / "sit.pt"
    torch.save(state, path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"sit.pt: tensor '{key}'"):
        load_official_state_dict(model, path)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing was loaded


@pytest.mark.parametrize("kind", ["int", "nan"])
def test_training_checkpoint_of_bad_weights(tmp_path, kind):
    from vit5_sit.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    good = {"w": torch.randn(4, 4), "b": torch.zeros(4)}
    bad, _ = _spoil(good, kind)
    path = save_checkpoint(tmp_path, 5, bad, good, {"optimizer": {"state": {}, "param_groups": []}})
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor '\w+'.*earlier checkpoint"):
        load_checkpoint(path)
    # the optimizer's moments too
    moments = {0: {"step": torch.tensor(5.0), "exp_avg": torch.ones(4, dtype=torch.int32)}}
    path = save_checkpoint(tmp_path, 6, good, good, {"optimizer": {"state": moments, "param_groups": []}})
    with pytest.raises(CheckpointError, match=r"state.pt: optimizer state: tensor '0.exp_avg' has dtype int32"):
        load_checkpoint(path)


def test_resume_preflight_reads_dtypes_from_the_header(tmp_path):
    from vit5_sit.config import load_config
    from vit5_sit.models import create_model
    from vit5_sit.train.preflight import PreflightError, check_checkpoint_fits

    cfg = load_config(None, ["model.preset=SiT-T/2", "data.resolution=8", "model.num_classes=10"])
    state = {k: v.to(torch.int32) for k, v in create_model(cfg.model_config()).state_dict().items()}
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(PreflightError, match=r"model.safetensors: tensor \S+ \(I32\) and \d+ more is not floating"):
        check_checkpoint_fits(cfg, tmp_path)


def test_export_refuses_nan_and_float16_overflow(tmp_path, demo_state):
    from vit5_sit.config import load_config
    from vit5_sit.hub.api import write_model_folder

    cfg = load_config(DEMO_MODEL / "config.yaml")
    big = {k: v.float() for k, v in demo_state.items()}
    big[sorted(big)[0]] = big[sorted(big)[0]] * 0 + 1e6  # beyond float16's 65504
    with pytest.raises(ModelLoadError, match="as float16: tensor .* holds NaN or inf"):
        write_model_folder(tmp_path / "out", big, cfg, dtype=torch.float16)
    assert not (tmp_path / "out" / "ema.safetensors").exists()


def test_repa_encoder_file_that_is_not_safetensors(tmp_path):
    from vit5_sit.repa import EncoderError, load_encoder

    text = tmp_path / "encoder.safetensors"
    text.write_text("not weights\n")
    with pytest.raises(EncoderError, match=r"repa.encoder=.*encoder.safetensors: not a safetensors file"):
        load_encoder(str(text))
    pickled = tmp_path / "encoder.pt"
    torch.save({"w": torch.ones(1)}, pickled)
    with pytest.raises(EncoderError, match="not a safetensors file"):
        load_encoder(str(pickled))


def test_repa_classifier_file_of_integer_weights(tmp_path):
    from safetensors import safe_open

    from vit5_sit.models import model_config
    from vit5_sit.repa import EncoderError
    from vit5_sit.repa.classifier import DEFAULT_OVERRIDES, DEFAULT_PRESET, Classifier, load_classifier, save_classifier

    cfg = model_config(DEFAULT_PRESET, **{**DEFAULT_OVERRIDES, "input_size": 8, "in_channels": 1})
    path = save_classifier(Classifier(cfg, 10, 1), tmp_path / "enc.safetensors")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    state, key = _spoil(load_file(str(path)), "int")
    save_file(state, path, metadata=meta)
    with pytest.raises(EncoderError, match=r"repa.encoder=.*enc.safetensors: tensor '.*' has dtype int64"):
        load_classifier(path)


def test_digit_classifier_of_integer_weights(tmp_path, capsys):
    from vit5_sit.demo.digit_classifier import CLASSIFIER, load_classifier, main

    shutil.copytree(CLASSIFIER, tmp_path / "clf")
    state, _ = _spoil(load_file(str(tmp_path / "clf" / "model.safetensors")), "int")
    save_file(state, tmp_path / "clf" / "model.safetensors")
    with pytest.raises(ValueError, match="has dtype int64.*train it again"):
        load_classifier(tmp_path / "clf")
    assert main(["check", "--classifier", str(tmp_path / "clf"), "--out", str(tmp_path / "g.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --classifier:") and "int64" in err[0]
