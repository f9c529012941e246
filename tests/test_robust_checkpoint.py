"""Any damage to a checkpoint means "invalid, use the previous one"; nothing is ever deleted that verifies."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vit5_sit.train.checkpoint import (
    CheckpointError,
    clean_stale_temp_folders,
    latest_valid_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    stale_temp_folders,
    verify_checkpoint,
)


def _save(run, step):
    sd = {"w": torch.full((4, 4), float(step))}
    return save_checkpoint(run, step, sd, sd, {"optimizer": {"state": {}, "param_groups": []}})


def _meta_list(meta):
    meta.write_text("[]")


def _meta_empty(meta):
    meta.write_text("{}")


def _meta_no_bytes(meta):
    m = json.loads(meta.read_text())
    del m["files"]["ema.safetensors"]["bytes"]
    meta.write_text(json.dumps(m))


def _meta_bytes_string(meta):
    m = json.loads(meta.read_text())
    m["files"]["state.pt"]["bytes"] = "many"
    meta.write_text(json.dumps(m))


def _meta_not_utf8(meta):
    meta.write_bytes(b"\xff\xfe{\x00")


def _meta_not_json(meta):
    meta.write_text('{"step": 4, "files": ')


def _meta_drops_a_file(meta):
    m = json.loads(meta.read_text())
    del m["files"]["model.safetensors"]
    meta.write_text(json.dumps(m))


def _meta_other_step(meta):
    m = json.loads(meta.read_text())
    m["step"] = 2
    meta.write_text(json.dumps(m))


def _meta_files_null(meta):
    meta.write_text('{"step": 4, "files": null}')


def _meta_is_a_folder(meta):
    meta.unlink()
    meta.mkdir()


def _truncated(meta):
    f = meta.parent / "model.safetensors"
    f.write_bytes(f.read_bytes()[:10])


def _flipped_byte(meta):
    f = meta.parent / "state.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


def _file_missing(meta):
    (meta.parent / "ema.safetensors").unlink()


def _meta_missing(meta):
    meta.unlink()


DAMAGE = [_meta_list, _meta_empty, _meta_no_bytes, _meta_bytes_string, _meta_not_utf8, _meta_not_json,
          _meta_drops_a_file, _meta_other_step, _meta_files_null, _meta_is_a_folder, _truncated, _flipped_byte,
          _file_missing, _meta_missing]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__.strip("_"))
def test_damaged_checkpoint_is_invalid_and_the_previous_one_is_used(tmp_path, damage):
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    damage(newest / "meta.json")
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(newest)
    assert "\n" not in str(e.value) and "step_0000004" in str(e.value)
    logs = []
    assert latest_valid_checkpoint(tmp_path, log=logs.append).step == 2
    assert len(logs) == 1 and "skipping checkpoint step_0000004" in logs[0]


def test_pickle_payload_in_state_pt_is_one_line_refusal(tmp_path):
    path = _save(tmp_path, 2)

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"optimizer": Payload(), "step": 2}, path / "state.pt")  # a crafted file, meta.json rewritten
    meta = json.loads((path / "meta.json").read_text())
    from vit5_sit.common.utils import file_digest

    meta["files"]["state.pt"] = {"bytes": (path / "state.pt").stat().st_size,
                                 "sha256": file_digest(path / "state.pt")}
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    assert "\n" not in msg and "state.pt: refused" in msg and "weights_only=True" in msg


def test_garbage_safetensors_with_matching_meta_is_a_checkpoint_error(tmp_path):
    from vit5_sit.common.utils import file_digest

    path = _save(tmp_path, 2)
    f = path / "ema.safetensors"
    f.write_bytes(b"\xff" * 64)
    meta = json.loads((path / "meta.json").read_text())
    meta["files"]["ema.safetensors"] = {"bytes": 64, "sha256": file_digest(f)}
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="ema.safetensors: not a readable safetensors file"):
        load_checkpoint(path)


def test_stale_temp_folders_of_dead_writers_are_cleaned_live_ones_kept(tmp_path):
    _save(tmp_path, 2)
    root = tmp_path / "checkpoints"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = root / f".step_0000004.tmp-{dead.pid}"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x" * 1000)
    live = root / f".step_0000004.tmp-{os.getpid()}"
    live.mkdir()
    assert stale_temp_folders(tmp_path) == [stale]
    logs = []
    assert clean_stale_temp_folders(tmp_path, log=logs.append) == [stale]
    assert not stale.exists() and live.exists() and (root / "step_0000002").is_dir()
    assert "unfinished checkpoint write" in logs[0]


def test_a_failed_write_leaves_no_partial_folder(tmp_path, monkeypatch):
    _save(tmp_path, 2)

    import safetensors.torch
    from safetensors import SafetensorError

    def disk_full(*args, **kwargs):  # what safetensors raises on a full disk (not an OSError)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(CheckpointError) as e:
        _save(tmp_path, 4)
    msg = str(e.value)
    assert "No space left" in msg and "partial folder was removed" in msg and "GiB free" in msg
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000002"]


def test_writing_over_a_damaged_step_folder_keeps_its_files_aside(tmp_path, capsys):
    _save(tmp_path, 2)
    old = _save(tmp_path, 4)
    (old / "meta.json").unlink()  # the weights are intact; only the description is lost
    weights = (old / "model.safetensors").read_bytes()
    _save(tmp_path, 4)
    aside = [p for p in (tmp_path / "checkpoints").iterdir() if ".invalid-" in p.name]
    assert len(aside) == 1 and (aside[0] / "model.safetensors").read_bytes() == weights
    assert [c.step for c in list_checkpoints(tmp_path)] == [2, 4]
    verify_checkpoint(tmp_path / "checkpoints" / "step_0000004")
    assert "moved it to" in capsys.readouterr().out
