"""Training checkpoints: written atomically, validated on read, kept to the last k.

A checkpoint is a folder ``RUN/checkpoints/step_0001000`` holding ``model.safetensors``, ``ema.safetensors``,
``state.pt`` (optimizer, step, counters; read with ``weights_only=True``), with REPA ``projector.safetensors``
(trained with the model, not part of the exported EMA model), and ``meta.json``. The folder is
written under a temporary name, every file is fsynced, ``meta.json`` (sizes and sha256 of the other files)
is written last, and only then is the folder renamed into place: a crash mid-write leaves a ``.tmp`` folder
that is never mistaken for a checkpoint, and a truncated or corrupted file fails the meta check.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vit5_sit.utils import atomic_write_text, file_digest

CHECKPOINT_FILES = ("model.safetensors", "ema.safetensors", "state.pt")
PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or corrupt."""


@dataclass
class Checkpoint:
    step: int
    path: Path


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Checkpoint]:
    """Finished checkpoint folders of a run (not checked for corruption), oldest first."""
    root = checkpoint_dir(run_dir)
    found = []
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit():
                found.append(Checkpoint(int(p.name[len(PREFIX):]), p))
    return sorted(found, key=lambda c: c.step)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def save_checkpoint(run_dir: str | Path, step: int, model_state: dict[str, torch.Tensor],
                    ema_state: dict[str, torch.Tensor], state: dict[str, Any], keep_last: int = 0,
                    extra: dict[str, dict[str, torch.Tensor]] | None = None,  # file name -> tensors
                    ) -> Path:
    """Write checkpoint ``step`` atomically and delete all but the newest ``keep_last`` (0 keeps all)."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:07d}"
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(_plain(model_state), str(tmp / "model.safetensors"))
    save_file(_plain(ema_state), str(tmp / "ema.safetensors"))
    torch.save({**state, "step": step}, tmp / "state.pt")
    for name, tensors in (extra or {}).items():
        save_file(_plain(tensors), str(tmp / name))
    files = {}
    for name in (*CHECKPOINT_FILES, *(extra or {})):
        _fsync(tmp / name)
        files[name] = {"bytes": (tmp / name).stat().st_size, "sha256": file_digest(tmp / name)}
    atomic_write_text(tmp / "meta.json", json.dumps({"step": step, "files": files}, indent=1))
    if final.exists():  # an older write of the same step (e.g. a re-run): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep_last > 0:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old.path, ignore_errors=True)
    return final


def _plain(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def verify_checkpoint(path: str | Path, check_hash: bool = True) -> None:
    """Raise CheckpointError naming what is wrong with the folder, if anything."""
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise CheckpointError(f"{path}: no meta.json (the write did not finish)")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{meta_path}: unreadable ({e})") from None
    for name, info in meta.get("files", {}).items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing")
        size = f.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{f}: {size} bytes, expected {info['bytes']} (truncated?)")
        if check_hash and file_digest(f) != info["sha256"]:
            raise CheckpointError(f"{f}: sha256 mismatch (corrupted)")


def latest_valid_checkpoint(run_dir: str | Path, log=print) -> Checkpoint | None:
    """The newest checkpoint that passes verification; broken newer ones are reported and skipped."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(ckpt.path)
            return ckpt
        except CheckpointError as e:
            log(f"warning: skipping checkpoint {ckpt.path.name}: {e}")
    return None


def load_checkpoint(path: str | Path) -> tuple[dict, dict, dict]:
    """(model state, EMA state, training state) of a verified checkpoint folder."""
    path = Path(path)
    verify_checkpoint(path)
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    return load_file(str(path / "model.safetensors")), load_file(str(path / "ema.safetensors")), state


def load_extra(path: str | Path, name: str) -> dict[str, torch.Tensor] | None:
    """The tensors of an extra file of a verified checkpoint (``projector.safetensors``), None if absent."""
    f = Path(path) / name
    return load_file(str(f)) if f.is_file() else None
