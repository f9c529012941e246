"""A full disk (or a read-only, failing filesystem) while writing: one ``error:`` line naming the file and the
free space, nothing partial left behind, the finished work kept, and the same command continues.

The first tests fill a real 64 KiB tmpfs (they need root and may be skipped where mounting is not allowed);
the others simulate the failure at each writer, so the behaviour is checked everywhere.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_robust_train import _overrides, _train_cli
from test_sample import _run, model_dir  # noqa: F401 (a fixture)
from tinydata import image_folder, reset_accelerate

from vit5_sit.common import checks, interrupt, utils


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.decode().strip()[:80]}); the simulated cases "
                    "below cover the same paths")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _grow(mount: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=4m", str(mount)], check=True)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith((".tmp", ".lock")) or ".tmp-" in p.name)


def test_sampling_onto_a_full_disk_keeps_the_parts_and_continues(small_disk, model_dir, tmp_path, capsys):  # noqa: F811
    args = ["--ckpt", model_dir, "--num-samples", 600, "--part-size", 100, "--steps", 1, "--sampler", "ode",
            "--method", "euler", "--no-progress"]
    assert _run(*args, "--out", tmp_path / "whole.npz") == 0
    out = small_disk / "s.npz"
    capsys.readouterr()
    assert _run(*args, "--out", out) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: could not write ") and "No space left on device" in err[0]
    assert "MiB free there" in err[0] and f"every finished part is kept in {out}.parts" in err[0]
    assert not out.exists() and _leftovers(small_disk) == []  # no lock, no temporary file
    parts = sorted((small_disk / "s.npz.parts").glob("part_*.npz"))
    assert parts and all(len(np.load(p)["images"]) == 100 for p in parts)  # every part kept is whole

    _grow(small_disk)
    assert _run(*args, "--out", out) == 0
    assert f"{len(parts) * 100} of 600 images already done" in capsys.readouterr().out
    with np.load(tmp_path / "whole.npz") as a, np.load(out) as b:
        np.testing.assert_array_equal(a["arr_0"], b["arr_0"])


def test_a_checkpoint_onto_a_full_disk_is_one_line_and_leaves_no_partial_folder(small_disk, tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    reset_accelerate()
    rc = _train_cli()([*_overrides(small_disk, data), "model.hidden_size=256", "log.tracker=none"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(err) == 1, err
    assert "No space left on device" in err[0] and "the partial folder was removed" in err[0]
    assert "continue with --resume auto" in err[0]
    assert _leftovers(small_disk) == [] and list((small_disk / "r/checkpoints").iterdir()) == []


# ---- the same failures, simulated at each writer -------------------------------------------------------

def test_safetensors_io_failures_are_oserrors_naming_the_file(tmp_path, monkeypatch):
    import safetensors.torch
    import torch
    from safetensors import SafetensorError

    def full(*a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(OSError) as e:
        utils.save_safetensors({"w": torch.zeros(2)}, tmp_path / "w.safetensors")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "w.safetensors")

    monkeypatch.setattr(safetensors.torch, "save_file", lambda *a, **k: (_ for _ in ()).throw(
        SafetensorError("invalid tensor")))  # not an I/O failure: left as it is
    with pytest.raises(SafetensorError):
        utils.save_safetensors({"w": torch.zeros(2)}, tmp_path / "w.safetensors")


def test_an_atomic_write_that_fails_names_its_file_and_leaves_nothing(tmp_path, monkeypatch):
    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as f.write raises it: no file name

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError) as e:
        utils.atomic_write_bytes(tmp_path / "a.json", b"{}")
    assert e.value.filename == str(tmp_path / "a.json") and list(tmp_path.iterdir()) == []
    line = checks.storage_error(e.value)
    assert line.startswith(f"could not write {tmp_path / 'a.json'}: No space left on device (")
    assert checks.storage_error(FileNotFoundError(errno.ENOENT, "No such file", "x")) is None


def test_a_lock_that_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    """An empty lock file reads as held by an unknown process: every later run would be refused."""
    real = os.fdopen

    class Full:
        def __init__(self, fd, *a):
            self.f = real(fd, *a)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdopen", Full)
    out = tmp_path / "new" / "g.png"
    with pytest.raises(OSError) as e:
        checks.OutputLock(out).acquire()
    assert e.value.filename == str(out) + ".lock"
    assert list(tmp_path.iterdir()) == []  # neither the lock nor the folder made for it
    monkeypatch.undo()
    with checks.OutputLock(out):
        pass


@pytest.mark.parametrize("error, advice", [
    (OSError(errno.ENOSPC, "No space left on device", "/x/y.npz"), " MiB free there); free space or choose"),
    (OSError(errno.EROFS, "Read-only file system", "/x/y.npz"), "Read-only file system; choose")])
def test_commands_report_a_refused_write_with_what_was_kept(error, advice, capsys):
    @interrupt.stops_cleanly("interrupted: nothing half-written is left; run the same command again")
    def main() -> int:
        raise error

    assert main() == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: could not write /x/y.npz: {error.strerror}")
    assert advice in err[0]
    assert err[0].endswith(" another location; nothing half-written is left; run the same command again")


def test_demo_export_checks_its_output_folder_first(tmp_path, capsys):
    from vit5_sit.demo import export as demo

    (tmp_path / "afile").write_text("x")
    assert demo.main(["export", str(tmp_path / "no-run"), "--out", str(tmp_path / "afile")]) == 2
    assert "--out " + str(tmp_path / "afile") + ": is a file, not a folder" in capsys.readouterr().err


def test_other_os_errors_are_not_taken_for_a_full_disk():
    @interrupt.stops_cleanly("interrupted")
    def main() -> int:
        raise PermissionError(errno.EACCES, "Permission denied", "/x")

    with pytest.raises(PermissionError):
        main()


def _fill(mount: Path) -> None:
    with open(mount / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_a_full_disk_is_refused_by_the_up_front_write_probe(small_disk):
    _fill(small_disk)
    with pytest.raises(checks.UsageError, match=r"--out x: cannot write in .*\(No space left on device\); free "
                                                 "space or choose another location"):
        checks.writable_folder(small_disk / "new", "--out x")
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]  # the probe is not left behind


def test_a_reference_that_would_not_fit_is_refused_before_any_inception_work(small_disk, tmp_path, capsys,
                                                                              monkeypatch):
    """`eval_fid ref` computed every feature (minutes for real data) and only then failed to write the file."""
    from vit5_sit.cli import eval_fid

    def no_inception(*args, **kwargs):
        raise AssertionError("Inception loaded")

    monkeypatch.setattr(eval_fid, "_load_inception", no_inception)
    data = image_folder(tmp_path / "imgs", classes=2, per_class=10)
    out = small_disk / "ref.npz"  # 20 images: features and FID/sFID statistics (63 MiB), on a 64 KiB disk
    assert eval_fid.main(["ref", "--data", str(data), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --out {out}: needs about 63.4 MiB, and only ")
    assert err[0].endswith(f"MiB are free in {small_disk}; free space or choose another location")
    assert list(small_disk.iterdir()) == []


def test_room_for_compares_with_the_free_space(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * 2**20, 9 * 2**20, 2**20))
    checks.room_for(tmp_path / "a" / "b", 2**20, "--out f")  # exactly enough
    with pytest.raises(checks.UsageError, match=r"--out f: needs about 2.0 MiB, and only 1.0 MiB are free in "):
        checks.room_for(tmp_path / "a" / "b", 2 * 2**20, "--out f")
