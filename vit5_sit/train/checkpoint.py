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
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from vit5_sit.common.checks import first_line, process_alive, tensors_problem
from vit5_sit.common.utils import atomic_write_text, file_digest, save_safetensors, save_torch

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
                    keep: Collection[int] = (),  # steps never deleted (the run's autoguidance guide)
                    ) -> Path:
    """Write checkpoint ``step`` atomically and delete all but the newest ``keep_last`` (0 keeps all) and the
    steps of ``keep``."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:07d}"
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        save_safetensors(_plain(model_state), tmp / "model.safetensors")
        save_safetensors(_plain(ema_state), tmp / "ema.safetensors")
        save_torch({**state, "step": step}, tmp / "state.pt")  # a full disk: OSError ENOSPC, not 'unexpected pos'
        for name, tensors in (extra or {}).items():
            save_safetensors(_plain(tensors), tmp / name)
        files = {}
        for name in (*CHECKPOINT_FILES, *(extra or {})):
            _fsync(tmp / name)
            files[name] = {"bytes": (tmp / name).stat().st_size, "sha256": file_digest(tmp / name)}
        atomic_write_text(tmp / "meta.json", json.dumps({"step": step, "files": files}, indent=1))
    except (OSError, RuntimeError) as e:  # a full disk, a vanished mount: leave no partial folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(root).free if root.is_dir() else 0
        why = f"{e.strerror or e}" if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
        raise CheckpointError(f"writing checkpoint {final} failed ({why}); the partial folder "
                              f"was removed, {free / 2**30:.2f} GiB free in {root}. The previous checkpoints "
                              "are intact: free space, then continue with --resume auto") from None
    if final.exists():  # the same step written before
        try:
            verify_checkpoint(final, check_hash=False)
            shutil.rmtree(final)  # a valid earlier write of this step (training is deterministic): replace it
        except CheckpointError as why:  # damaged: keep its files aside, never delete them
            aside = root / f"{final.name}.invalid-{os.getpid()}"
            os.replace(final, aside)
            print(f"warning: {final.name} did not verify ({why}); moved it to {aside.name}")
    os.replace(tmp, final)
    if keep_last > 0:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            if old.step not in keep:
                shutil.rmtree(old.path, ignore_errors=True)
    return final


def _plain(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def _why_no_meta(path: Path) -> str:
    """What a folder without meta.json is: an unfinished checkpoint, a run folder, or something else."""
    if any((path / name).exists() for name in CHECKPOINT_FILES):
        return "the write did not finish"
    runs = list_checkpoints(path)
    if runs:
        return f"a run folder, not a checkpoint: give one of its checkpoints, e.g. {runs[-1].path}"
    return (f"not a checkpoint folder: train.py writes them as RUN/checkpoints/{PREFIX}N, holding meta.json and "
            f"{', '.join(CHECKPOINT_FILES)}")


def verify_checkpoint(path: str | Path, check_hash: bool = True) -> None:
    """Raise CheckpointError naming what is wrong with the folder, if anything.

    Any damage counts: a missing, unreadable, non-UTF-8 or malformed ``meta.json`` (not an object, no
    ``files``, an entry without ``bytes`` or ``sha256``, a step that is not the folder's), a listed file that
    is missing, of another size or with another sha256, or a checkpoint file that meta.json does not list.
    """
    path = Path(path)
    meta_path = path / "meta.json"
    if not path.is_dir():
        raise CheckpointError(f"{path}: no meta.json ({'not a folder' if path.exists() else 'no such folder'})")
    if not meta_path.is_file():
        raise CheckpointError(f"{path}: no meta.json ({_why_no_meta(path)})")
    try:
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{meta_path}: unreadable ({type(e).__name__}: {e})") from None
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict):
        raise CheckpointError(f"{meta_path}: malformed (expected an object with 'step' and 'files')")
    step = meta.get("step")
    if path.name.startswith(PREFIX) and path.name[len(PREFIX):].isdigit() and step != int(path.name[len(PREFIX):]):
        raise CheckpointError(f"{meta_path}: says step {step!r}, but the folder is {path.name}")
    unlisted = [name for name in CHECKPOINT_FILES if name not in files]
    if unlisted:
        raise CheckpointError(f"{meta_path}: does not list {', '.join(unlisted)}")
    for name, info in files.items():
        if not (isinstance(info, dict) and isinstance(info.get("bytes"), int) and isinstance(info.get("sha256"), str)
                and "/" not in str(name)):
            raise CheckpointError(f"{meta_path}: malformed entry for {name!r} (expected bytes and sha256)")
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing")
        size = f.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{f}: {size} bytes, expected {info['bytes']} (truncated?)")
        if check_hash and file_digest(f) != info["sha256"]:
            raise CheckpointError(f"{f}: sha256 mismatch (corrupted)")


def checkpoint_report(run_dir: str | Path, check_hash: bool = True) -> list[tuple[Checkpoint, str | None]]:
    """Every finished checkpoint folder of a run, newest first, with why it fails verification (None: valid)."""
    report = []
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(ckpt.path, check_hash=check_hash)
            report.append((ckpt, None))
        except CheckpointError as e:
            report.append((ckpt, str(e)))
    return report


def latest_valid_checkpoint(run_dir: str | Path, log=print) -> Checkpoint | None:
    """The newest checkpoint that passes verification; broken newer ones are reported and skipped."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(ckpt.path)
            return ckpt
        except CheckpointError as e:
            log(f"warning: skipping checkpoint {ckpt.path.name}: {e}")
    return None


def stale_temp_folders(run_dir: str | Path) -> list[Path]:
    """``.step_XXXXXXX.tmp-PID`` folders of writers that are no longer running on this machine.

    A writer killed mid-write (SIGKILL, power loss, a full disk) leaves one behind; a folder whose process
    is still alive (another run writing into the same folder) is left alone.
    """
    root = checkpoint_dir(run_dir)
    stale = []
    if root.is_dir():
        for p in root.iterdir():
            head, sep, pid = p.name.rpartition(".tmp-")
            if sep and head.startswith("." + PREFIX) and pid.isdigit() and not process_alive(int(pid)):
                stale.append(p)
    return sorted(stale)


def clean_stale_temp_folders(run_dir: str | Path, log=print) -> list[Path]:
    """Delete `stale_temp_folders` (unfinished writes, never checkpoints) and say so; returns them."""
    stale = stale_temp_folders(run_dir)
    for p in stale:
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        shutil.rmtree(p, ignore_errors=True)
        log(f"removed {p}: an unfinished checkpoint write of a process that is gone ({size / 2**20:.1f} MiB)")
    return stale


def load_checkpoint(path: str | Path) -> tuple[dict, dict, dict]:
    """(model state, EMA state, training state) of a verified checkpoint folder."""
    import pickle

    path = Path(path)
    verify_checkpoint(path)
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"{path / 'state.pt'}: refused: cannot read it with torch.load(weights_only=True) "
                              f"({first_line(e)})") from None
    if not isinstance(state, dict) or "optimizer" not in state or "step" not in state:
        raise CheckpointError(f"{path / 'state.pt'}: not a training state (expected optimizer and step)")
    weights = [_checked_weights(path / name) for name in ("model.safetensors", "ema.safetensors")]
    moments = optimizer_moments(state, with_steps=False)
    problem = tensors_problem(moments) if moments else None
    if problem:
        raise CheckpointError(f"{path / 'state.pt'}: optimizer state: {problem}; {_EARLIER}")
    return weights[0], weights[1], state


def optimizer_moments(state: dict, with_steps: bool = True) -> dict:
    """The optimizer's per-parameter values of a training state, keyed 'param.name' (AdamW: exp_avg,
    exp_avg_sq, and the step counts unless ``with_steps`` is False), as stored (unchecked)."""
    optimizer = state.get("optimizer")
    entries = optimizer.get("state") if isinstance(optimizer, dict) else None
    return {f"{i}.{k}": v
            for i, entry in (entries or {}).items() if isinstance(entry, dict)
            for k, v in entry.items() if with_steps or k != "step"}


_EARLIER = "resume from an earlier checkpoint (--resume RUN/checkpoints/step_N) or start a new run"


def _checked_weights(f: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint's weights file, refused unless all are finite floating-point numbers."""
    from safetensors import SafetensorError

    try:
        weights = load_file(str(f))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{f}: not a readable safetensors file ({first_line(e)})") from None
    problem = tensors_problem(weights)
    if problem:
        raise CheckpointError(f"{f}: {problem}; {_EARLIER}")
    return weights


def load_extra(path: str | Path, name: str) -> dict[str, torch.Tensor] | None:
    """The tensors of an extra file of a verified checkpoint (``projector.safetensors``), None if absent."""
    f = Path(path) / name
    return _checked_weights(f) if f.is_file() else None
