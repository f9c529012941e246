"""Every numeric setting has a range checked when the config is read; YAML and name faults are named."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from vit5_sit.config import RANGES, ConfigError, ExperimentConfig, load_config
from vit5_sit.models import ModelConfig

BAD_VALUES = {  # key -> values that must be refused (each would train the wrong way or crash later)
    "train.lr": ["0", "-1e-4", "inf", "nan", "-inf"],
    "train.warmup_steps": ["-10", "1.5"],
    "train.grad_clip": ["0", "-1", "nan"],
    "train.weight_decay": ["-1", "inf"],
    "train.beta1": ["2", "1", "-0.1"],
    "train.beta2": ["1", "1.5"],
    "train.ema_decay": ["1", "-0.5", "nan"],
    "train.global_batch_size": ["0", "-4", "2.5"],
    "train.grad_accum": ["0"],
    "train.max_steps": ["0", "-1"],
    "train.ckpt_every": ["0"],
    "train.keep_last": ["-1"],
    "train.max_nonfinite": ["0"],
    "train.seed": ["-1", "4294967296"],
    "data.num_workers": ["-1"],
    "data.resolution": ["0", "-32"],
    "log.every": ["0", "-5"],
    "log.sample_every": ["-1"],
    "log.sample_per_class": ["0"],
    "log.sample_seed": ["-3"],
    "log.sample_cfg_scale": ["nan", "inf", "-1"],
    "log.sample_classes": ["[-1]", "[0,-2]"],
    "transport.logit_normal_std": ["0", "-1", "nan"],
    "transport.logit_normal_mean": ["nan", "inf"],
    "transport.train_eps": ["-0.1", "0.5", "nan"],
    "sampler.steps": ["0"],
    "sampler.atol": ["0", "-1e-6"],
    "sampler.last_step_size": ["0", "1", "nan"],
    "sampler.diffusion_norm": ["-1", "inf"],
    "model.depth": ["0"],
    "model.mlp_ratio": ["0", "nan"],
    "model.class_dropout_prob": ["1", "-0.1"],
    "model.layer_scale_init": ["0", "-1e-4", "inf"],
    "model.gate_init": ["nan", "inf"],
    "model.rope_base": ["0", "nan"],
    "model.num_registers": ["-1"],
}
CASES = [(key, value) for key, values in BAD_VALUES.items() for value in values]


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("key, value", CASES)
def test_bad_value_is_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={value}"])
    assert key in _one_line(e)


@pytest.mark.parametrize("key, value", [("train.grad_clip", "none"), ("train.warmup_steps", "0"),
                                        ("train.lr", "2e-4"), ("log.sample_every", "0"),
                                        ("model.layer_scale_init", "none"), ("data.num_workers", "0"),
                                        ("transport.train_eps", "0"), ("train.beta1", "0")])
def test_edge_values_that_are_fine(key, value):
    load_config(None, [f"{key}={value}"])


def test_zero_layer_scale_is_fine_only_with_a_nonzero_gate():
    load_config(None, ["model.layer_scale_init=0", "model.gate_init=0.1"])


def _numeric(hint) -> bool:
    args = typing.get_args(hint)
    return hint in (int, float) or any(a in (int, float) for a in args) or \
        (typing.get_origin(hint) is list and args and args[0] in (int, float))


@pytest.mark.parametrize("section", ["data", "train", "log", "transport", "sampler", "model"])
def test_every_numeric_setting_has_a_range(section):
    cls = ModelConfig if section == "model" else type(getattr(ExperimentConfig(), section))
    hints = typing.get_type_hints(cls)
    missing = [f"{section}.{f.name}" for f in dataclasses.fields(cls)
               if _numeric(hints[f.name]) and f"{section}.{f.name}" not in RANGES]
    assert not missing, f"numeric settings without a range in vit5_sit.config.RANGES: {missing}"


def test_yaml_values_are_checked_like_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: .nan\n")
    with pytest.raises(ConfigError, match="train.lr"):
        load_config(path)
    path.write_text("train:\n  warmup_steps: -10\n")
    with pytest.raises(ConfigError, match="train.warmup_steps=-10"):
        load_config(path)


def test_duplicate_yaml_key_is_refused_with_its_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1.0e-4\n  max_steps: 10\n  lr: 5.0e-4\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = _one_line(e)
    assert "'lr' is given twice" in msg and "lines 2 and 4" in msg and str(path) in msg


def test_non_utf8_config_is_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"train:\n  lr: \xff\xfe\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in _one_line(e)


def test_an_integer_too_long_to_read_is_a_config_error(tmp_path):
    huge = "9" * 5000  # past Python's 4300-digit int() limit: a bare ValueError from the YAML reader
    path = tmp_path / "c.yaml"
    path.write_text(f"train:\n  max_steps: {huge}\n")
    with pytest.raises(ConfigError, match="unreadable value"):
        load_config(path)
    with pytest.raises(ConfigError, match="train.max_steps="):
        load_config(None, [f"train.max_steps={huge}"])


@pytest.mark.parametrize("override, message", [
    ("name=", "name is empty"),
    ("name=  ", "name is empty"),
    ("name=..", "must be a folder name"),
    ("name=../elsewhere", "must be a folder name"),
    ("name=/abs/run", "must be a folder name"),
    ("output_dir=", "output_dir is empty"),
    ("data.path=", "data.path is empty"),
    ("log.sample_classes=[]", "log.sample_classes=[]"),
])
def test_names_and_paths_that_would_put_the_run_elsewhere(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in _one_line(e)


@pytest.mark.parametrize("overrides, message", [
    (["data.resolution=30"], "data.resolution=30: it is not divisible by the model's patch_size=4; choose a "
                             "multiple of 4 (e.g. 28 or 32)"),
    (["data.resolution=36", "model.patch_size=8"], "patch_size=8; choose a multiple of 8 (e.g. 32 or 40)"),
    (["model.preset=ViT5-T/8", "data.kind=latents", "data.resolution=100", "log.sample_every=0"],
     "data.resolution=100: its latents (100 // 8 = 12 per side) are not divisible by the model's patch_size=8; "
     "choose a multiple of 64 (e.g. 64 or 128)"),
    (["model.input_size=30"], "model (ViT5-T/4 with {'input_size': 30}): input_size=30 is not divisible"),
])
def test_a_resolution_the_model_cannot_patchify_names_the_setting_the_user_chose(overrides, message):
    """It said `model (ViT5G-T/4 with {}): input_size=30 ...`: a key the user never wrote, and no fix."""
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.preset=ViT5-T/4", *overrides])
    assert message in str(e.value)


def test_batch_must_divide_by_accumulation():
    with pytest.raises(ConfigError, match="train.global_batch_size=10 is not divisible by train.grad_accum=4"):
        load_config(None, ["train.global_batch_size=10", "train.grad_accum=4"])


@pytest.mark.parametrize("override, message", [
    ("name=" + "x" * 300, "name: a path part of 300 bytes"),
    ("output_dir=" + "d/" * 2100, "output_dir: 4,200 bytes long"),
    ("data.path=data/" + "x" * 256, "data.path: a path part of 256 bytes"),
    ("name=" + "x" * 250, None),  # 250 bytes: a valid name; with output_dir 'runs' still under PATH_MAX
    ("model.rope_base=" + "9" * 400, "model.rope_base=" + "9" * 60 + "... (400 characters): must be a finite"),
    ("train.seed=" + "9" * 4000, "train.seed=" + "9" * 60 + "... (4,000 characters): must be in [0, 4294967295]"),
], ids=["name", "output_dir", "data.path", "name-250", "float-400-digits", "int-4000-digits"])
def test_paths_too_long_and_huge_numbers_are_named_errors(override, message):
    """A float field given a 400-digit integer was an OverflowError traceback; a run name over 255 bytes was
    "File name too long" from the run folder's first check; long values are echoed cut to one line."""
    if message is None:
        load_config(None, [override])
        return
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value) and len(str(e.value)) < 300, str(e.value)
