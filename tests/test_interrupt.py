"""Ctrl-C (SIGINT) and SIGTERM in sample.py, train.py and the other commands: one line, exit code 130, finished work
kept, and the same command run again finishes with exactly the output of an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tinydata import image_folder

from vit5_sit.common.interrupt import EXIT_CODE, sigint_at_default, sigterm_as_ctrl_c, stops_cleanly
from vit5_sit.config import load_config, save_config
from vit5_sit.models import create_model
from vit5_sit.train.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _interrupt_when(cmd: list[str], ready, timeout: float = 120, sig: int = signal.SIGINT) -> tuple[int, str]:
    """Start cmd, send ``sig`` (SIGINT) once ready(stderr so far) holds; return (exit code, stderr)."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=sigint_at_default)  # not how the test was launched
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(proc.stderr.fileno(), 4096), b"")),
                              daemon=True)
    reader.start()
    deadline = time.time() + timeout
    while not ready(b"".join(chunks).decode(errors="replace")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the process finished before it could be interrupted"
    proc.send_signal(sig)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


def _bar_at(text: str, total: int) -> bool:
    """A tqdm bar in `text` has moved past 0 of `total`."""
    return re.search(rf"\| *[1-9][0-9]*/{total}\b", text) is not None


def _last_line(text: str) -> str:
    return text.replace("\r", "\n").strip().splitlines()[-1]


@pytest.fixture
def model_dir(tmp_path) -> Path:
    cfg = load_config(None, ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=64", "model.num_heads=2",
                             "data.kind=mnist", "data.resolution=8", "sampler.steps=20"])
    torch.manual_seed(0)
    model = create_model(cfg.model_config())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path / "model"
    folder.mkdir()
    save_config(cfg, folder / "config.yaml")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "ema.safetensors"))
    return folder


def test_sigint_at_default_undoes_an_ignored_sigint():
    """What a background launch leaves behind (SIGINT ignored) is undone for the children we start."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        sigint_at_default()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_command_prints_its_line_instead_of_a_traceback(sig, capsys):
    @stops_cleanly("interrupted: kept X; run it again")
    def main(argv=None) -> int:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the signal lands here
        return 0

    before = signal.getsignal(signal.SIGTERM)
    # A suite launched in the background (`cmd &`, nohup, some CI runners) inherits SIGINT ignored, and an
    # ignored SIGINT is respected by design (test_signals_startup): this test is about a live Ctrl-C.
    live_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main() == EXIT_CODE
    finally:
        signal.signal(signal.SIGINT, live_sigint)
    assert capsys.readouterr().err.strip() == "interrupted: kept X; run it again"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    with sigterm_as_ctrl_c(), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)


@pytest.mark.parametrize("module", ["vit5_sit.cli.eval_fid", "vit5_sit.data.__main__", "vit5_sit.demo",
                                    "vit5_sit.demo.digit_classifier", "vit5_sit.repa.classifier"])
def test_every_long_command_stops_cleanly(module, monkeypatch, capsys):
    """Ctrl-C in eval_fid.py, the data tools, the exporters and the classifiers was a traceback."""
    import importlib

    mod = importlib.import_module(module)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(mod.argparse.ArgumentParser, "parse_args", stop)
    monkeypatch.setattr(mod.argparse.ArgumentParser, "parse_known_args", stop)
    assert mod.main([]) == EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("interrupted") and "again" in err


def test_ctrl_c_inside_a_commands_mass_sampling_is_its_line(model_dir, tmp_path, capsys, monkeypatch):
    """eval_fid.py compare (and the study's evaluation) sample with `sample_to_npz`, which keeps its batches and
    raises SamplingInterrupted: that was a traceback, not the line saying what was kept."""
    import numpy as np

    import vit5_sit.sampling.generate as generate
    from vit5_sit.cli import eval_fid
    from vit5_sit.study.__main__ import main as study_main

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "sample_images", stop)
    ref = tmp_path / "ref"
    (ref / "a").mkdir(parents=True)
    from PIL import Image

    for i in range(4):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(ref / "a" / f"{i}.png")
    rc = eval_fid.main(["compare", str(model_dir), "--ref", str(ref), "--out", str(tmp_path / "cmp"),
                        "--metrics", "fid", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EXIT_CODE and err[-1].startswith("interrupted at image 0 of 4") and "Traceback" not in err[0]

    @stops_cleanly("interrupted")
    def inside() -> int:
        raise generate.SamplingInterrupted("interrupted at image 3 of 9 (3 kept in X); run it again")

    assert inside() == EXIT_CODE and capsys.readouterr().err.strip() == "interrupted at image 3 of 9 (3 kept in " \
        "X); run it again"
    monkeypatch.setattr("vit5_sit.study.__main__._run", lambda args: inside.__wrapped__())
    assert study_main(["status", str(tmp_path)]) == EXIT_CODE
    assert "interrupted; run the same command again" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])  # SIGTERM: `kill`, `timeout`, a scheduler
def test_sigint_in_mass_sampling_keeps_batches_and_resumes_exactly(model_dir, tmp_path, sig):
    args = ["--ckpt", str(model_dir), "--num-samples", "240", "--part-size", "40", "--batch-size", "8"]
    cmd = [sys.executable, str(ROOT / "sample.py"), *args]
    full = tmp_path / "full.npz"
    assert subprocess.run([*cmd, "--out", str(full), "--no-progress"], env=ENV, capture_output=True).returncode == 0

    out = tmp_path / "s.npz"
    parts = out.with_name(out.name + ".parts")
    code, err = _interrupt_when([*cmd, "--out", str(out)], lambda _: (parts / "part_000001.npz").exists(), sig=sig)
    assert code == 130, err
    assert not out.with_name(out.name + ".lock").exists()  # released (a SIGTERM once left it behind)
    assert "Traceback" not in err
    line = _last_line(err)
    assert line.startswith("interrupted at image ") and line.endswith("run the same command again to continue")
    assert sum("interrupted" in x for x in err.replace("\r", "\n").splitlines()) == 1
    done = int(line.split()[3])
    assert 80 <= done < 240
    assert not out.exists()

    again = subprocess.run([*cmd, "--out", str(out), "--no-progress"], env=ENV, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"{done} of 240 images already done" in again.stdout
    with np.load(full) as a, np.load(out) as b:
        np.testing.assert_array_equal(a["arr_0"], b["arr_0"])
        np.testing.assert_array_equal(a["arr_1"], b["arr_1"])


@pytest.mark.slow
def test_sigint_in_a_grid_writes_nothing_and_says_so(model_dir, tmp_path):
    out = tmp_path / "g.png"
    cmd = [sys.executable, str(ROOT / "sample.py"), "--ckpt", str(model_dir), "--out", str(out),
           "--classes", "0-1", "--per-class", "2", "--steps", "400"]
    code, err = _interrupt_when(cmd, lambda text: _bar_at(text, 400))  # the bar counts sampler steps
    assert code == 130, err
    assert "Traceback" not in err
    assert _last_line(err).startswith("interrupted at step ")
    assert not out.exists()


def _digits(root: Path) -> Path:
    return image_folder(root, per_class=8, prefix="")


def _final(run: Path) -> dict[str, torch.Tensor]:
    ckpt = list_checkpoints(run)[-1]
    return {**load_file(str(ckpt.path / "model.safetensors")),
            **{f"ema.{k}": v for k, v in load_file(str(ckpt.path / "ema.safetensors")).items()}}


@pytest.mark.slow
def test_sigint_in_training_saves_a_checkpoint_and_resumes_exactly(tmp_path):
    data = _digits(tmp_path / "data")
    steps = 120

    def cmd(name):
        return [sys.executable, str(ROOT / "train.py"), "model.preset=ViT5-T/2", "model.depth=1",
                "model.hidden_size=32", "model.num_heads=2", "log.tracker=none", "log.sample_every=0",
                "data.num_workers=0", "data.kind=images", f"data.path={data}", "data.resolution=8",
                "data.channels=3", "model.num_classes=2", "train.global_batch_size=4", f"train.max_steps={steps}",
                f"train.ckpt_every={steps}", f"output_dir={tmp_path}", f"name={name}"]

    ref = subprocess.run(cmd("ref"), env=ENV, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    assert "1 process (CPU, " in ref.stdout

    code, err = _interrupt_when(cmd("cut"), lambda text: _bar_at(text, steps))
    assert code == 130, err
    assert "Traceback" not in err
    line = _last_line(err)
    assert line.startswith("interrupted at step ") and line.endswith("--resume auto to continue"), line
    step = int(line.split()[3])
    assert [c.step for c in list_checkpoints(tmp_path / "cut")] == [step]
    assert 0 < step < steps

    resumed = subprocess.run([*cmd("cut"), "--resume", "auto"], env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a, b = _final(tmp_path / "ref"), _final(tmp_path / "cut")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k

    # SIGTERM (`kill PID`, a scheduler's stop) is a stop request too: a checkpoint at the step it stopped at.
    code, err = _interrupt_when(cmd("term"), lambda text: _bar_at(text, steps), sig=signal.SIGTERM)
    assert code == 130 and "Traceback" not in err, err
    step = int(_last_line(err).split()[3])
    assert [c.step for c in list_checkpoints(tmp_path / "term")] == [step] and 0 < step < steps
