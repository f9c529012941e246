"""Integer settings given as floats (issue #32): a whole number such as 1e3 is that integer; 1.5, nan and
anything beyond 2**53 (train.max_steps=1e30 ran, writing checkpoints, until stopped) are refused in one line
naming the key or flag and the value, for every integer config key and CLI flag."""

import argparse
import dataclasses
import typing

import pytest

from vit5_sit.common.checks import MAX_INTEGER, integer, nonnegative_int, positive_int
from vit5_sit.config import ConfigError, ExperimentConfig, load_config
from vit5_sit.models.config import ModelConfig


def _int_keys() -> list[str]:
    """Every integer config key, model fields included (found from the dataclasses, not listed by hand)."""
    keys = []
    for section in dataclasses.fields(ExperimentConfig):
        hint = typing.get_type_hints(ExperimentConfig)[section.name]
        if section.name == "model":
            hint, prefix = ModelConfig, "model."
        elif dataclasses.is_dataclass(hint):
            prefix = section.name + "."
        else:
            continue
        for name, field_hint in typing.get_type_hints(hint).items():
            if field_hint is int or field_hint == int | None or typing.get_args(field_hint) == (int,):
                keys.append(prefix + name)
    return keys


INT_KEYS = _int_keys()


def test_the_integer_keys_are_found():
    assert {"train.max_steps", "train.global_batch_size", "train.ckpt_every", "train.seed", "log.sample_seed",
            "data.resolution", "sampler.steps", "model.depth", "log.sample_classes"} <= set(INT_KEYS)


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value, words", [("1e30", "out of range"), ("1.5", "expected an integer"),
                                          ("nan", "expected an integer"), ("-inf", "out of range"),
                                          (str(2**53 + 1), "out of range")])
def test_every_integer_key_refuses_floats_that_are_not_exact_integers(key, value, words):
    if key == "log.sample_classes":
        value = f"[0,{value}]"
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={value}"])
    line = str(e.value)
    assert line.startswith(f"{key}=") and "\n" not in line
    assert words in line or "must be" in line, line  # a key's own narrower range (seeds) may answer first


def test_whole_numbers_written_as_floats_are_those_integers():
    cfg = load_config(None, ["train.max_steps=1e3", "train.ckpt_every=5.0", "log.sample_classes=[0,1e0]"])
    assert cfg.train.max_steps == 1000 and isinstance(cfg.train.max_steps, int)
    assert cfg.train.ckpt_every == 5 and cfg.log.sample_classes == [0, 1]


def test_a_config_file_too(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  max_steps: 1.0e+30\n")
    with pytest.raises(ConfigError, match=r"train.max_steps=1e\+30: out of range: .* 2\*\*53"):
        load_config(path)


@pytest.mark.parametrize("parse", [integer, positive_int, nonnegative_int])
def test_argparse_integer_types(parse):
    assert parse("12") == 12 and parse("1e3") == 1000 and parse(str(MAX_INTEGER)) == MAX_INTEGER
    for text, words in [("1.5", "expected an integer"), ("1e30", "out of range"), ("nan", "expected an integer"),
                        ("inf", "out of range"), ("x", "expected an integer"), ("9" * 5000, "out of range")]:
        with pytest.raises(argparse.ArgumentTypeError, match=words) as e:
            parse(text)
        assert len(str(e.value)) < 200


@pytest.mark.parametrize("flags, named", [
    (["--num-samples", "1e30", "--out", "x.npz"], "--num-samples"),
    (["--steps", "2.5"], "--steps"),
    (["--seed", "1e30"], "--seed"),
    (["--batch-size", "1e400"], "--batch-size"),
    (["--per-class", "nan"], "--per-class"),
])
def test_sample_flags(tmp_path, monkeypatch, capsys, flags, named):
    from vit5_sit.cli.sample import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and named in err[-1] and list(tmp_path.iterdir()) == []
