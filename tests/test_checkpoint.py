"""Checkpoints: atomic, verified, keep-last-k, broken newest falls back to the previous one."""

import json

import pytest
import torch

from vit5_sit.train.checkpoint import (
    CheckpointError,
    latest_valid_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


def _save(run, step, keep_last=0, value=None):
    w = {"w": torch.full((4, 4), float(step if value is None else value))}
    return save_checkpoint(run, step, w, {"w": w["w"] * 2}, {"optimizer": {"state": {}, "param_groups": []}},
                           keep_last=keep_last)


def test_round_trip(tmp_path):
    path = _save(tmp_path, 10)
    model, ema, state = load_checkpoint(path)
    assert torch.equal(model["w"], torch.full((4, 4), 10.0))
    assert torch.equal(ema["w"], torch.full((4, 4), 20.0))
    assert state["step"] == 10
    assert json.loads((path / "meta.json").read_text())["step"] == 10


def test_keep_last(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep_last=2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [3, 4]


def test_keep_last_never_deletes_the_kept_guide(tmp_path):
    w = {"w": torch.zeros(2)}
    for step in (1, 2, 3, 4, 5):
        save_checkpoint(tmp_path, step, w, w, {"optimizer": {}}, keep_last=2, keep=(2,))
    assert [c.step for c in list_checkpoints(tmp_path)] == [2, 4, 5]


@pytest.mark.parametrize("max_steps, every, guide_at, want", [
    (3600, 400, 1 / 9, 400), (3600, 400, 0.22, 800), (3600, 400, 0.01, 400),  # at least one ckpt_every
    (800_000, 50_000, 1 / 9, 100_000), (400, 400, 1 / 9, None),            # the last step is the model itself
    (3600, 400, None, None)])
def test_guide_step_is_the_checkpoint_nearest_the_share(max_steps, every, guide_at, want):
    from vit5_sit.config import TrainConfig

    assert TrainConfig(max_steps=max_steps, ckpt_every=every, guide_at=guide_at).guide_step() == want


def test_truncated_newest_is_reported_and_previous_used(tmp_path):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    f = newest / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        verify_checkpoint(newest)
    messages = []
    ckpt = latest_valid_checkpoint(tmp_path, log=messages.append)
    assert ckpt.step == 1
    assert "step_0000002" in messages[0] and "truncated" in messages[0]


def test_corrupt_bytes_detected(tmp_path):
    path = _save(tmp_path, 3)
    f = path / "state.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        verify_checkpoint(path)


def test_unfinished_write_is_not_a_checkpoint(tmp_path):
    _save(tmp_path, 1)
    tmp = tmp_path / "checkpoints" / ".step_0000002.tmp-123"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"partial")
    no_meta = tmp_path / "checkpoints" / "step_0000003"
    no_meta.mkdir()
    assert latest_valid_checkpoint(tmp_path, log=lambda m: None).step == 1
