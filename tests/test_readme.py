"""The README stays true: every config key and every preset family it promises exist, and vice versa."""

import dataclasses
from pathlib import Path

from vit5_sit.config import ExperimentConfig, ModelSection
from vit5_sit.models import ModelConfig

README = (Path(__file__).parent.parent / "README.md").read_text()


def _keys():
    cfg = ExperimentConfig()
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, ModelSection):
            yield from (f"model.{m.name}" for m in dataclasses.fields(ModelConfig))
        elif dataclasses.is_dataclass(value):
            yield from (f"{f.name}.{g.name}" for g in dataclasses.fields(value))
        else:
            yield f.name


def test_every_config_key_is_documented():
    missing = [k for k in _keys() if f"`{k}`" not in README]
    assert not missing, f"README config reference lacks {missing}"


def test_quickstart_commands_are_present():
    assert "pip install -e . && python sample.py" in README
    assert "python -m pytest" in README
