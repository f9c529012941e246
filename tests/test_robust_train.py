"""Training faults found before the first step: one named line, exit code 2, nothing created, deleted or changed."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from tinydata import TINY_TRAIN as TINY
from tinydata import image_folder, reset_accelerate

from vit5_sit.config import load_config

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _overrides(out: Path, data: Path, name: str = "r", steps: int = 2) -> list[str]:
    return [*TINY, f"output_dir={out}", f"name={name}", "data.kind=images", f"data.path={data}",
            "data.resolution=8", "data.channels=3", "model.num_classes=2", "train.global_batch_size=4",
            f"train.max_steps={steps}"]


def _train_cli():
    spec = importlib.util.spec_from_file_location("train_cli", ROOT / "vit5_sit" / "cli" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _fails(argv: list[str], capsys) -> str:
    """Run train.py's main in-process; it must exit 2 with one 'error: ...' line. Returns that line."""
    reset_accelerate()
    rc = _train_cli()(argv)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert rc == 2, err
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    return errors[0]


def _tree(root: Path) -> dict[str, str]:
    """Every file and folder under root with a digest of its bytes: to compare before and after."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _run(argv: list[str], capsys) -> str:
    reset_accelerate()
    assert _train_cli()(argv) == 0
    return capsys.readouterr().out


def test_resume_auto_with_nothing_valid_refuses_and_changes_nothing(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    run = tmp_path / "runs" / "r"
    _run(_overrides(tmp_path / "runs", data, steps=4), capsys)
    for meta in run.glob("checkpoints/step_*/meta.json"):
        meta.unlink()  # every description lost, the weights intact
    before = _tree(run)
    line = _fails([*_overrides(tmp_path / "runs", data, steps=6), "--resume", "auto"], capsys)
    assert "none of the 2 checkpoint(s)" in line and "step_0000004: " in line and "step_0000002: " in line
    assert "no meta.json" in line and "name=" in line and "Nothing was changed" in line
    assert _tree(run) == before  # byte-identical: nothing deleted, rewritten or added


def test_resume_auto_skips_a_damaged_newest_and_cleans_a_stale_temp_folder(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    run = tmp_path / "runs" / "r"
    _run(_overrides(tmp_path / "runs", data, steps=4), capsys)
    (run / "checkpoints/step_0000004/meta.json").write_text("[]")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = run / f"checkpoints/.step_0000006.tmp-{dead.pid}"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    out = _run([*_overrides(tmp_path / "runs", data, steps=4), "--resume", "auto"], capsys)
    assert "skipping checkpoint step_0000004" in out and "malformed" in out
    assert "resumed from" in out and "step_0000002" in out
    assert not stale.exists() and "unfinished checkpoint write" in out
    assert any(".invalid-" in p.name for p in (run / "checkpoints").iterdir())  # the damaged one kept aside


@pytest.mark.parametrize("change, fields", [
    (["model.depth=2"], ["model.depth: 1 in config.yaml, 2 now"]),
    (["model.preset=SiT-T/2"], ["model.norm", "model.qk_norm"]),
    (["train.global_batch_size=8"], ["train.global_batch_size: 4 in config.yaml, 8 now"]),
    (["train.seed=3"], ["train.seed"]),
])
def test_resume_with_other_settings_names_the_fields(tmp_path, capsys, change, fields):
    data = image_folder(tmp_path / "data")
    run = tmp_path / "runs" / "r"
    _run(_overrides(tmp_path / "runs", data), capsys)
    before = _tree(run)
    line = _fails([*_overrides(tmp_path / "runs", data, steps=4), *change, "--resume", "auto"], capsys)
    assert "resuming with other settings" in line and all(f in line for f in fields), line
    assert _tree(run) == before  # config.yaml not overwritten


@pytest.mark.parametrize("change, named", [
    (["model.preset=SiT-T/2"], ["qkv_bias=False (the config builds True)", "num_registers=4"]),
    (["model.hidden_size=64"], ["hidden_size=32 (the config builds 64)", "of another shape"]),
    (["model.depth=2"], ["depth=1 (the config builds 2)", "missing: blocks.1."]),
])
def test_a_checkpoint_copied_without_its_run_folder_is_checked_against_the_model(tmp_path, capsys, change, named):
    """No config.yaml to compare with (a step folder copied elsewhere): the weights' names and shapes are."""
    data = image_folder(tmp_path / "data")
    _run(_overrides(tmp_path / "runs", data), capsys)
    copied = tmp_path / "elsewhere" / "step_0000002"
    copied.parent.mkdir()
    (tmp_path / "runs/r/checkpoints/step_0000002").rename(copied)
    line = _fails([*_overrides(tmp_path / "runs", data, name="new", steps=4), *change, "--resume", str(copied)],
                  capsys)
    assert "holds another model than this config builds" in line and all(n in line for n in named), line
    assert not (tmp_path / "runs" / "new").exists()  # refused before the run folder is made
    out = _run([*_overrides(tmp_path / "runs", data, name="new", steps=4), "--resume", str(copied)], capsys)
    assert "resumed from" in out  # the right config resumes it


def test_resume_may_change_the_schedule(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    _run(_overrides(tmp_path / "runs", data), capsys)
    out = _run([*_overrides(tmp_path / "runs", data, steps=4), "train.lr=5e-4", "train.grad_accum=2",
                "--resume", "auto"], capsys)
    assert "resumed from" in out
    assert load_config(tmp_path / "runs/r/config.yaml").train.lr == 5e-4


@pytest.mark.parametrize("setup, extra, message", [
    ("two_classes", ["model.num_classes=1"], "has 2 classes but model.num_classes=1"),
    ("two_classes", ["log.sample_every=2", "log.sample_classes=[0,5]"], "log.sample_classes=[0, 5]"),
    ("two_classes", ["model.input_size=16"], "model.in_channels=3 model.input_size=8"),
    # the grid's 2 x 2 images have seeds sample_seed .. sample_seed + 3, all below 2**32 (found at the first grid)
    ("two_classes", ["log.sample_every=2", "log.sample_classes=[0,1]", "log.sample_per_class=2",
                     "log.sample_seed=4294967294"], "log.sample_seed=4294967294: sample seeds must lie"),
    # a grid larger than PIL opens would be drawn (and fail) only at the first grid, after the training work
    ("two_classes", ["log.sample_every=2", "log.sample_classes=[0,1]", "log.sample_per_class=100000"],
     "log.sample_classes/log.sample_per_class: a grid of 2 x 100000 images"),
    ("unreadable", [], "none of the 3 images"),
    ("no_images", [], "no images found"),
])
def test_a_failed_start_leaves_no_run_folder(tmp_path, capsys, setup, extra, message):
    data = tmp_path / "data"
    if setup == "two_classes":
        image_folder(data)
    elif setup == "unreadable":
        (data / "a").mkdir(parents=True)
        for i in range(3):
            (data / "a" / f"{i}.png").write_bytes(b"\x89PNG not an image " + bytes([i]))
    else:
        (data / "a").mkdir(parents=True)
    before = _tree(tmp_path)
    line = _fails([*_overrides(tmp_path / "runs", data), *extra], capsys)
    assert message in line, line
    assert not (tmp_path / "runs").exists()
    assert _tree(tmp_path) == before


def test_a_run_folder_in_use_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path, capsys):
    """Two trainings of one run folder (the same command started twice, two study runners) would write one
    folder's checkpoints and delete each other's temp folders as stale: the second is refused before any work."""
    import os
    import socket

    data = image_folder(tmp_path / "data")
    lock = tmp_path / "runs" / "r.lock"
    lock.parent.mkdir()
    lock.write_text(f"{socket.gethostname()} {os.getpid()}\n")  # held by a live process: this one
    before = _tree(tmp_path)
    line = _fails(_overrides(tmp_path / "runs", data), capsys)
    assert f"run folder {tmp_path / 'runs' / 'r'}: another run (process {os.getpid()}" in line
    assert str(lock) in line and "name=" in line
    assert _tree(tmp_path) == before  # nothing read, written or removed
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock.write_text(f"{socket.gethostname()} {gone.pid}\n")  # left by a run that was killed
    _run(_overrides(tmp_path / "runs", data), capsys)
    assert (tmp_path / "runs" / "r" / "checkpoints" / "step_0000002").is_dir()
    assert not lock.exists()  # released when the training ends


def test_run_folder_under_a_file_fails_before_any_compute(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    (tmp_path / "afile").write_text("not a folder")
    before = _tree(tmp_path)
    line = _fails(_overrides(tmp_path / "afile", data), capsys)
    assert "afile is a file, not a folder" in line
    assert _tree(tmp_path) == before


def test_checkpoints_path_that_is_a_file(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    (tmp_path / "runs/r").mkdir(parents=True)
    (tmp_path / "runs/r/checkpoints").write_text("oops")
    before = _tree(tmp_path)
    line = _fails(_overrides(tmp_path / "runs", data), capsys)
    assert "checkpoints is a file" in line
    assert _tree(tmp_path) == before


@pytest.mark.skipif(hasattr(__import__("os"), "geteuid") and __import__("os").geteuid() == 0,
                    reason="root writes into read-only folders: the chmod case cannot be made as root")
def test_read_only_output_dir(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        line = _fails(_overrides(ro, data), capsys)
        assert "cannot write in" in line and str(ro) in line
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_low_free_space_is_a_warning_before_the_first_step(tmp_path, monkeypatch):
    import shutil as _shutil

    from vit5_sit.train import preflight

    cfg = load_config(None, [*TINY, f"output_dir={tmp_path}"])
    usage = _shutil.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    logs = []
    preflight.check_run_folder(cfg, log=logs.append)
    assert len(logs) == 1 and "GiB free" in logs[0] and "each checkpoint takes about" in logs[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_unreadable_files_are_reported_once_with_workers_and_summarised(tmp_path):
    data = image_folder(tmp_path / "data", per_class=6)
    bad = data / "class0" / "truncated.png"
    good = (data / "class0" / "0.png").read_bytes()
    bad.write_bytes(good[: len(good) // 2])  # passes the header, fails to decode
    res = subprocess.run([sys.executable, str(ROOT / "train.py"), *_overrides(tmp_path / "runs", data, steps=8),
                          "data.num_workers=2", "train.ckpt_every=8"], capture_output=True, text=True,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    both = res.stdout + res.stderr
    assert both.count("skipping unreadable image") == 1, both  # once, not once per worker
    assert "1 unreadable image(s) skipped during the run: class0/truncated.png" in both


def test_resume_from_a_run_folder_or_any_folder_says_what_to_pass(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    run = tmp_path / "runs" / "r"
    _run(_overrides(tmp_path / "runs", data, steps=4), capsys)
    before = _tree(run)
    line = _fails([*_overrides(tmp_path / "runs", data, steps=6), "--resume", str(run)], capsys)
    assert "a run folder, not a checkpoint" in line and "step_0000004" in line, line
    line = _fails([*_overrides(tmp_path / "runs", data, steps=6), "--resume", str(data)], capsys)
    assert "not a checkpoint folder" in line and "did not finish" not in line, line
    assert _tree(run) == before


def test_a_latent_run_whose_vae_cannot_load_is_one_line(tmp_path, capsys):
    argv = [*TINY, f"output_dir={tmp_path / 'runs'}", "name=lat", "data.kind=latents", f"data.path={tmp_path}",
            "log.sample_every=5", f"data.vae={tmp_path / 'no-vae'}", "train.max_steps=2"]
    line = _fails(argv, capsys)
    assert "data.vae=" in line and "no such folder" in line and "log.sample_every=0" in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_resume_is_refused_not_taken_for_a_new_run(tmp_path, value, capsys):
    # `--resume "$CKPT"` with CKPT unset once started a fresh run beside (or instead of) the one meant
    with pytest.raises(SystemExit):
        _train_cli()([*TINY, f"output_dir={tmp_path / 'runs'}", "--resume", value])
    err = capsys.readouterr().err
    assert "--resume" in err and "is empty" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("world", ["abc", "0", "-2", " ", "٣"])
def test_a_bad_world_size_in_the_environment_is_named(tmp_path, capsys, monkeypatch, world):
    """WORLD_SIZE=abc was 'error: invalid literal for int() with base 10' with no hint of where it came from."""
    monkeypatch.setenv("WORLD_SIZE", world)
    before = _tree(tmp_path)
    line = _fails(_overrides(tmp_path / "runs", tmp_path / "data"), capsys)
    assert f"WORLD_SIZE={world.strip()!r} in the environment" in line
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_digits_exported_onto_a_file_are_refused_before_any_image(tmp_path, capsys, where):
    """data.kind=mnist with data.path a file (or under one) was a NotADirectoryError traceback."""
    (tmp_path / "afile").write_text("not a folder")
    path = tmp_path / "afile" if where == "file" else tmp_path / "afile" / "digits"
    before = _tree(tmp_path)
    line = _fails([*_overrides(tmp_path / "runs", path), "data.kind=mnist", "data.channels=1",
                   "model.in_channels=1", "model.num_classes=10"], capsys)
    assert line.startswith(f"error: data folder {path}: ") and "is a file, not a folder" in line, line
    assert _tree(tmp_path) == before
