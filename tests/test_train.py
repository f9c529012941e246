"""Training: pixel and latent space, the loss falls on real digits, exact resume after SIGKILL, two processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tinydata import TINY_TRAIN as TINY
from tinydata import image_folder, reset_accelerate

from vit5_sit.config import load_config
from vit5_sit.train.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _image_folder(root: Path, size: int = 8, corrupt: bool = False) -> Path:
    """Images 2 pixels taller than wide: training center-crops them."""
    return image_folder(root, size=size, height=size + 2, corrupt=corrupt)


def _small_classifier(channels: int = 3, size: int = 8):
    """A tiny random REPA encoder (the project's classifier) for 8x8 images."""
    from vit5_sit.models import model_config
    from vit5_sit.repa.classifier import Classifier

    torch.manual_seed(0)
    cfg = model_config("ViT5-T/2", input_size=size, in_channels=channels, depth=1, hidden_size=16, num_heads=2,
                       learn_sigma=False, class_dropout_prob=0.0, num_classes=1, layer_scale_init=None)
    return Classifier(cfg, num_classes=2, channels=channels)


def _repa_overrides(tmp_path: Path) -> list[str]:
    """REPA on, aligned to a tiny random encoder file written into tmp_path."""
    from vit5_sit.repa.classifier import save_classifier

    path = tmp_path / "encoder.safetensors"
    if not path.exists():
        save_classifier(_small_classifier(), path)
    return ["repa.weight=0.5", "repa.depth=1", f"repa.encoder={path}", "repa.projector_dim=16"]


def _train(overrides: list[str], resume: str | None = None):
    from vit5_sit.train.loop import train

    return train(load_config(None, overrides), resume=resume)


def test_pixel_space_few_steps_with_a_corrupt_image(tmp_path, capsys, caplog):
    data = _image_folder(tmp_path / "data", corrupt=True)
    run = _train([*TINY, f"output_dir={tmp_path}", "name=px", "data.kind=images", f"data.path={data}",
                  "data.resolution=8", "data.channels=3", "model.num_classes=2", "train.global_batch_size=4",
                  "train.max_steps=3", "log.sample_every=3", "log.sample_classes=[0,1]", "log.sample_per_class=2",
                  "sampler.steps=2", "log.sample_at_start=true"])
    assert [c.step for c in list_checkpoints(run)] == [2, 3]
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step_0000000.png", "step_0000003.png"]
    assert (run / "config.yaml").is_file()
    assert any("broken.png" in r.getMessage() for r in caplog.records)  # warned when met
    out = capsys.readouterr().out
    assert "1 unreadable image(s) skipped" in out  # and counted at the end
    threads = torch.get_num_threads()  # part of what reproduces a CPU run bit for bit: named at the start
    assert f"1 process (CPU, {threads} thread{'s' if threads > 1 else ''}), per-process batch 4" in out, out[:500]


def test_latent_space_from_a_local_vae(tmp_path):
    pytest.importorskip("diffusers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from diffusers import AutoencoderKL

    from vit5_sit.data.latents import encode_dataset

    vae_dir = tmp_path / "vae"
    AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
                  latent_channels=4, norm_num_groups=8, sample_size=16).save_pretrained(vae_dir)
    data = _image_folder(tmp_path / "data", size=16)
    encode_dataset(data, tmp_path / "latents", vae=str(vae_dir), resolution=16, batch_size=4, device="cpu")
    run = _train([*TINY, f"output_dir={tmp_path}", "name=lat", "data.kind=latents",
                  f"data.path={tmp_path / 'latents'}", "data.resolution=16", "model.input_size=8",
                  "model.num_classes=2", "train.global_batch_size=4", "train.max_steps=2"])
    assert [c.step for c in list_checkpoints(run)] == [2]


def test_loss_falls_on_real_digits(tmp_path):
    losses = []

    def log(msg: str) -> None:
        if msg.startswith("step "):
            losses.append(float(msg.split("loss=")[1].split()[0]))

    from vit5_sit.train.loop import train

    cfg = load_config(ROOT / "configs/mnist/vit5.yaml", [
        f"output_dir={tmp_path}", "name=mnist", f"data.path={tmp_path / 'digits'}", "data.resolution=16",
        "model.depth=2", "model.hidden_size=64", "model.num_heads=2", "log.tracker=none", "log.sample_every=0",
        "log.every=1", "train.global_batch_size=32", "train.max_steps=80", "train.ckpt_every=80",
        "train.warmup_steps=10", "train.lr=2e-3"])
    train(cfg, log_fn=log)
    assert len(losses) == 80
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    assert last < 0.8 * first, (first, last)


def _cli_overrides(tmp_path: Path, name: str, data: Path) -> list[str]:
    return [*TINY, f"output_dir={tmp_path}", f"name={name}", "data.kind=images", f"data.path={data}",
            "data.resolution=8", "data.channels=3", "model.num_classes=2", "train.global_batch_size=4",
            "train.max_steps=8"]


def _final(run: Path) -> dict[str, torch.Tensor]:
    ckpt = list_checkpoints(run)[-1]
    projector = ckpt.path / "projector.safetensors"
    return {**load_file(str(ckpt.path / "model.safetensors")),
            **{f"ema.{k}": v for k, v in load_file(str(ckpt.path / "ema.safetensors")).items()},
            **({f"projector.{k}": v for k, v in load_file(str(projector)).items()} if projector.exists() else {})}


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
@pytest.mark.parametrize("repa", [False, True], ids=["plain", "repa"])
def test_sigkill_then_resume_auto_is_exact(tmp_path, repa):
    data = _image_folder(tmp_path / "data")
    cmd = [sys.executable, str(ROOT / "train.py")]
    long = ["train.max_steps=30", *(_repa_overrides(tmp_path) if repa else [])]  # the kill lands mid-run
    ref = subprocess.run([*cmd, *_cli_overrides(tmp_path, "ref", data), *long], env=_env(), capture_output=True,
                         text=True)
    assert ref.returncode == 0, ref.stderr

    proc = subprocess.Popen([*cmd, *_cli_overrides(tmp_path, "killed", data), *long], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (tmp_path / "killed/checkpoints/step_0000004").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = [c.step for c in list_checkpoints(tmp_path / "killed")]
    assert done and 30 not in done, done

    resumed = subprocess.run([*cmd, *_cli_overrides(tmp_path, "killed", data), *long, "--resume", "auto"], env=_env(),
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout + resumed.stderr
    a, b = _final(tmp_path / "ref"), _final(tmp_path / "killed")
    assert a.keys() == b.keys() and any(k.startswith("projector.") for k in a) == repa
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
@pytest.mark.parametrize("repa", [False, True], ids=["plain", "repa"])
def test_two_processes_match_one_process(tmp_path, repa):
    data = _image_folder(tmp_path / "data")
    extra = _repa_overrides(tmp_path) if repa else []
    one = subprocess.run([sys.executable, str(ROOT / "train.py"), *_cli_overrides(tmp_path, "one", data),
                          "train.max_steps=4", *extra], env=_env(), capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    # On a machine without GPUs, accelerate's --multi_gpu launcher starts gloo CPU processes (--cpu would
    # start one process only).
    two = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                          str(ROOT / "train.py"), *_cli_overrides(tmp_path, "two", data), "train.max_steps=4", *extra],
                         env=_env(), capture_output=True, text=True)
    assert two.returncode == 0, two.stderr[-3000:]
    assert re.search(r"2 processes \(MULTI_CPU, CPU, \d+ threads? each\), per-process batch 2", two.stdout), \
        two.stdout[-2000:]
    assert [c.step for c in list_checkpoints(tmp_path / "two")] == [2, 4]
    a, b = _final(tmp_path / "one"), _final(tmp_path / "two")
    assert a.keys() == b.keys() and any(k.startswith("projector.") for k in a) == repa
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=k)


@pytest.mark.slow
def test_a_run_folder_in_use_stops_every_process_of_a_launch(tmp_path):
    """The main process finds the run folder's lock held; the other rank must stop too, not wait in a collective."""
    import socket

    data = _image_folder(tmp_path / "data")
    lock = tmp_path / "two.lock"
    lock.write_text(f"{socket.gethostname()} {os.getpid()}\n")  # held by a live process: this test's
    two = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                          str(ROOT / "train.py"), *_cli_overrides(tmp_path, "two", data)],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert two.returncode != 0
    errors = [line for line in two.stderr.splitlines() if line.startswith("error: run folder")]
    # Every rank stops with the same one line; the launcher may end the other rank (SIGTERM) before it prints.
    assert 1 <= len(errors) <= 2 and "another run (process" in errors[0], two.stderr[-3000:]
    assert len(set(errors)) == 1, errors
    assert str(ROOT / "vit5_sit") not in two.stderr  # no traceback of ours (the launcher prints its own)
    assert not (tmp_path / "two").exists()


def _launch_two(tmp_path: Path, name: str, data: Path, *overrides: str, resume: bool = False):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "train.py"),
           *_cli_overrides(tmp_path, name, data), *overrides, *(["--resume", "auto"] if resume else [])]
    run = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.slow
@pytest.mark.parametrize("repa", [False, True], ids=["plain", "repa"])
def test_fsdp_two_processes_match_one_process_and_resume(tmp_path, repa):
    """FSDP2 over 2 gloo processes (sharded params, AdamW state and EMA; grad accumulation; clipping; the
    sample grid gathered from the shards): checkpoints are full tensors in the usual format, the run resumes
    sharded, and it ends where the one-process run ends."""
    data = _image_folder(tmp_path / "data")
    common = ["model.depth=2", "train.grad_clip=0.5", "train.max_steps=4", *(_repa_overrides(tmp_path) if repa else [])]
    one = subprocess.run([sys.executable, str(ROOT / "train.py"), *_cli_overrides(tmp_path, "one", data), *common],
                         env=_env(), capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    fsdp = ["train.fsdp=true", "train.grad_accum=2", "log.sample_every=2", "log.sample_classes=[0,1]",
            "log.sample_at_start=true",
            "log.sample_per_class=1", "sampler.steps=2"]
    first = _launch_two(tmp_path, "fsdp", data, *common, *fsdp, "train.max_steps=2")
    assert "FSDP2: each transformer block, the model and the EMA sharded over 2 processes" in first.stdout
    assert [c.step for c in list_checkpoints(tmp_path / "fsdp")] == [2]
    second = _launch_two(tmp_path, "fsdp", data, *common, *fsdp, resume=True)
    assert "resumed from" in second.stdout + second.stderr
    assert [c.step for c in list_checkpoints(tmp_path / "fsdp")] == [2, 4]
    assert sorted(p.name for p in (tmp_path / "fsdp" / "samples").iterdir()) == [
        "step_0000000.png", "step_0000002.png", "step_0000004.png"]
    a, b = _final(tmp_path / "one"), _final(tmp_path / "fsdp")
    assert a.keys() == b.keys() and any(k.startswith("projector.") for k in a) == repa
    for k in a:
        assert a[k].shape == b[k].shape, k
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=k)
    opt_a, opt_b = (torch.load(list_checkpoints(tmp_path / r)[-1].path / "state.pt", weights_only=True)["optimizer"]
                    for r in ("one", "fsdp"))
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for i in opt_a["state"]:
        for k, v in opt_a["state"][i].items():
            torch.testing.assert_close(v, opt_b["state"][i][k], atol=1e-6, rtol=1e-4, msg=f"{i}.{k}")


def test_fsdp_switch_and_its_clear_errors():
    from types import SimpleNamespace

    from vit5_sit.train.strategy import StrategyError
    from vit5_sit.train.strategy import use_fsdp as _use_fsdp

    cfg = load_config(None, [*TINY, "train.fsdp=true", "train.mixed_precision=fp16"])
    acc = SimpleNamespace(distributed_type=SimpleNamespace(value="MULTI_GPU"))
    with pytest.raises(StrategyError, match="fp16 is not supported with FSDP.*bf16"):
        _use_fsdp(cfg, acc, 2, print)
    logs = []
    assert _use_fsdp(cfg, acc, 1, logs.append) is False and "one process" in logs[0]
    # An accelerate config with distributed_type: FSDP turns sharding on without train.fsdp.
    cfg = load_config(None, TINY)
    assert _use_fsdp(cfg, acc, 2, logs.append) is False
    fsdp_launch = SimpleNamespace(distributed_type=SimpleNamespace(value="FSDP"))
    assert _use_fsdp(cfg, fsdp_launch, 2, logs.append) is True
    assert "sharded over 2 processes" in logs[-1] and "fsdp_* options" in logs[-1]


def test_truncated_newest_checkpoint_falls_back(tmp_path, capsys):
    data = _image_folder(tmp_path / "data")
    run = _train(_cli_overrides(tmp_path, "trunc", data) + ["train.max_steps=4"])
    newest = list_checkpoints(run)[-1].path
    f = newest / "ema.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    reset_accelerate()
    _train(_cli_overrides(tmp_path, "trunc", data) + ["train.max_steps=6"], resume="auto")
    out = capsys.readouterr().out
    assert "skipping checkpoint step_0000004" in out and "truncated" in out
    assert "resumed from" in out and "step_0000002" in out
    assert [c.step for c in list_checkpoints(run)][-1] == 6


def test_nonfinite_steps_are_skipped_then_stop_with_advice(tmp_path, monkeypatch):
    from vit5_sit.train.loop import TrainingError
    from vit5_sit.transport import Transport

    real = Transport.prediction_loss

    def nan_loss(self, *args, **kwargs):
        return real(self, *args, **kwargs) * float("nan")

    monkeypatch.setattr(Transport, "prediction_loss", nan_loss)
    data = _image_folder(tmp_path / "data")
    with pytest.raises(TrainingError, match="lower train.lr.*bf16.*qk_norm"):
        _train(_cli_overrides(tmp_path, "nan", data) + ["train.max_nonfinite=3"])
    assert list_checkpoints(tmp_path / "nan")[-1].step == 2  # steps 1-2 "trained" (skipped), then stop at 3


@pytest.mark.parametrize("args, message", [
    (["train.lrr=1"], "Did you mean train.lr"),
    (["train.global_batch_size=-4"], "must be a positive integer"),
    (["--config", "configs/nope.yaml"], "config file configs/nope.yaml: not found; give a YAML file"),
    (["--config", "configs"], "config file configs: is a folder"),
    (["--config", "/dev/null"], "config file /dev/null: is not a regular file"),
])
def test_cli_errors_are_one_clear_line(args, message, monkeypatch, capsys):
    """In-process (the exit code and stderr of a real process: test_resume_from_a_missing_checkpoint_is_one_line)."""
    from vit5_sit.cli import train as cli_train

    monkeypatch.chdir(ROOT)
    assert cli_train.main(list(args)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_data_and_model_shapes_must_agree(tmp_path):
    from vit5_sit.train.loop import TrainingError

    data = _image_folder(tmp_path / "data")
    with pytest.raises(TrainingError, match=r"model.in_channels=3 model.input_size=8"):
        _train(_cli_overrides(tmp_path, "shape", data) + ["model.input_size=16"])


def test_resume_from_a_missing_checkpoint_is_one_line(tmp_path):
    data = _image_folder(tmp_path / "data")
    res = subprocess.run([sys.executable, str(ROOT / "train.py"), *_cli_overrides(tmp_path, "r", data),
                          "--resume", str(tmp_path / "nope")], env=_env(), capture_output=True, text=True)
    assert res.returncode == 2 and "no meta.json" in res.stderr and "Traceback" not in res.stderr
