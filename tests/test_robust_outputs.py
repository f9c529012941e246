"""Output paths, devices, NaN guards, locks and damaged model folders: one line, exit code 2, before any work,
and no file created, deleted or changed."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from vit5_sit.common.checks import OutputLock, UsageError, output_file, output_folder, parse_device, positive_int
from vit5_sit.config import load_config, save_config
from vit5_sit.models import create_model

ROOT = Path(__file__).resolve().parent.parent
TINY = ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=64", "model.num_heads=2",
        "data.kind=mnist", "data.resolution=8", "sampler.steps=2"]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"robust_{name}", ROOT / "vit5_sit" / "cli" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sample = _script("sample")
eval_fid = _script("eval_fid")


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _fails(main, argv, capsys) -> str:
    """main(argv) exits 2 printing exactly one 'error:' line, no traceback; returns the line."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse: usage, then one error line
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if "error:" in line]
    assert rc == 2, err
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    return errors[0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    cfg = load_config(None, TINY)
    torch.manual_seed(0)
    model = create_model(cfg.model_config())
    save_config(cfg, folder / "config.yaml")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "ema.safetensors"))
    return folder


# ----------------------------------------------------------------------------------------------------------
# The shared helper.

def test_output_checks_create_nothing(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    before = _tree(tmp_path)
    with pytest.raises(UsageError, match="is a folder"):
        output_file(tmp_path / "adir", "--out")
    with pytest.raises(UsageError, match="afile is a file, not a folder"):
        output_file(tmp_path / "afile" / "deeper" / "x.npz", "--out")
    with pytest.raises(UsageError, match="is a file, not a folder; give a folder"):
        output_folder(tmp_path / "afile", "--out")
    output_file(tmp_path / "new" / "sub" / "x.png", "--out")  # a missing folder is fine: created on write
    output_folder(tmp_path / "new2", "--out")
    assert _tree(tmp_path) == before


def test_one_usage_error_and_one_positive_int_for_every_cli(capsys):
    """Both CLIs raise and catch the one `checks.UsageError` and parse counts with the one `positive_int`."""
    assert sample.UsageError is eval_fid.UsageError is UsageError and issubclass(UsageError, ValueError)
    assert sample.positive_int is eval_fid.positive_int is positive_int
    assert not hasattr(sample, "_positive_int") and not hasattr(eval_fid, "_positive_int")
    assert positive_int("3") == 3
    for cli, argv in ((sample, ["--batch-size", "0"]), (eval_fid, ["calc", "--samples", "x", "--ref", "y",
                                                                     "--batch-size", "0"])):
        with pytest.raises(SystemExit) as exit_info:
            cli.build_parser().parse_args(argv)
        assert exit_info.value.code == 2
        assert "--batch-size: must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders: the case cannot be made as root")
def test_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(UsageError, match="cannot write in"):
            output_file(ro / "x.png", "--out")
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("text, message", [("foo", "not a device"), ("cuda:x", "not a device"),
                                           ("meta", "unsupported device type")])
def test_bad_devices(text, message):
    with pytest.raises(UsageError, match=message):
        parse_device(text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu():
    with pytest.raises(UsageError, match="no CUDA GPU is available.*--device cpu"):
        parse_device("cuda")


def test_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    out = tmp_path / "s.npz"
    first = OutputLock(out).acquire()
    with pytest.raises(UsageError, match=f"another run \\(process {os.getpid()} on"):
        OutputLock(out).acquire()
    first.release()
    assert not (tmp_path / "s.npz.lock").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "s.npz.lock").write_text(f"{socket.gethostname()} {dead.pid}\n")
    with OutputLock(out):  # a killed run's lock is taken over
        assert (tmp_path / "s.npz.lock").read_text().split()[1] == str(os.getpid())
    assert not (tmp_path / "s.npz.lock").exists()


# ----------------------------------------------------------------------------------------------------------
# sample.py

@pytest.mark.parametrize("args, message", [
    (["--out", "{tmp}/adir"], "expected a .png grid or a .npz"),
    (["--out", "{tmp}/adir.png"], "is a folder"),
    (["--out", "{tmp}/afile/x.png"], "afile is a file, not a folder"),
    (["--out", "{tmp}/x.png", "--save-images", "{tmp}/afile"], "--save-images"),
    (["--out", "{tmp}/x.png", "--cfg-scale", "nan"], "--cfg-scale: must be a finite number"),
    (["--out", "{tmp}/x.png", "--cfg-scale", "inf"], "--cfg-scale: must be a finite number"),
    (["--out", "{tmp}/x.png", "--cfg-scale", "-2"], "argument --cfg-scale: must be in [0, 1000]"),
    (["--out", "{tmp}/x.png", "--guidance-interval", "nan", "1"], "--guidance-interval"),
    (["--out", "{tmp}/x.png", "--guidance-interval", "0.2", "1.5"], "argument --guidance-interval: must be in [0, 1]"),
    (["--out", "{tmp}/x.png", "--device", "foo"], "--device foo: not a device"),
    (["--out", "{tmp}/x.png", "--seed", "-1"], "argument --seed: must be in [0, 4294967295]"),
    (["--out", "{tmp}/x.npz", "--num-samples", "10", "--seed", "4294967290"], "for 10 images"),
    (["--out", "{tmp}/x.png", "--seed", "4294967295"], "choose --seed between 0 and"),  # the grid's count
])
def test_sample_bad_outputs_and_values(tmp_path, capsys, model_dir, args, message):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir.png").mkdir()
    before = _tree(tmp_path)
    line = _fails(sample.main, ["--ckpt", model_dir, *[a.format(tmp=tmp_path) for a in args]], capsys)
    assert message in line, line
    assert _tree(tmp_path) == before


def test_second_sampling_run_on_the_same_out_is_refused(tmp_path, capsys, model_dir):
    out = tmp_path / "s.npz"
    lock = OutputLock(out).acquire()  # another run is writing s.npz
    try:
        line = _fails(sample.main, ["--ckpt", model_dir, "--out", out, "--num-samples", 2, "--no-progress"], capsys)
        assert "another run" in line and "s.npz" in line
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npz.lock"]
    finally:
        lock.release()
    assert sample.main(["--ckpt", str(model_dir), "--out", str(out), "--num-samples", "2", "--no-progress"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npz", "s.npz.json"]  # lock released


def _damaged_copy(model_dir: Path, tmp_path: Path, damage: str) -> Path:
    folder = tmp_path / f"model-{damage}"
    folder.mkdir()
    (folder / "config.yaml").write_bytes((model_dir / "config.yaml").read_bytes())
    state = load_file(str(model_dir / "ema.safetensors"))
    if damage == "nan":
        key = next(k for k in state if "blocks.0.attn.qkv" in k)
        state[key] = state[key].clone()
        state[key][0, 0] = float("nan")
    elif damage == "shape":
        key = next(k for k in state if k.endswith("mlp.fc1.weight"))
        state[key] = torch.zeros(3, 3)
    if damage == "header":
        (folder / "ema.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    else:
        save_file(state, str(folder / "ema.safetensors"))
    return folder


@pytest.mark.parametrize("damage, message", [
    ("nan", "'blocks.0.attn.qkv.weight' holds NaN or inf"),
    ("shape", "wrong shapes: blocks.0.mlp.fc1.weight (3, 3) (the model's: (256, 64))"),
    ("header", "not a readable safetensors file"),
])
def test_damaged_model_folder_is_one_line(tmp_path, capsys, model_dir, damage, message):
    folder = _damaged_copy(model_dir, tmp_path, damage)
    before = _tree(tmp_path)
    line = _fails(sample.main, ["--ckpt", folder, "--out", tmp_path / "x.png"], capsys)
    assert line.startswith("error: --ckpt:") and message in line and "ema.safetensors" in line, line
    assert _tree(tmp_path) == before


# ----------------------------------------------------------------------------------------------------------
# eval_fid.py

def _samples_npz(path: Path, n: int = 4) -> Path:
    np.savez(path, arr_0=np.random.default_rng(0).integers(0, 255, (n, 8, 8, 3), dtype=np.uint8))
    return path


@pytest.mark.parametrize("argv, message", [
    (["ref", "--data", "{tmp}/s.npz", "--out", "{tmp}/adir"], "argument --out: {tmp}/adir is a folder"),
    (["ref", "--data", "{tmp}/s.npz", "--out", "{tmp}/afile/r.npz"], "afile is a file"),
    (["ref", "--data", "{tmp}/one", "--out", "{tmp}/r.npz"], "holds 1 image"),
    (["calc", "--samples", "{tmp}/s.npz", "--ref", "{tmp}/s.npz", "--json", "{tmp}/adir"], "--json"),
    (["calc", "--samples", "{tmp}/s.npz", "--ref", "{tmp}/nan_ref.npz"], "nan_ref.npz: its mu holds NaN"),
    (["calc", "--samples", "{tmp}/s.npz", "--ref", "{tmp}/s.npz", "--device", "foo"], "--device foo"),
    (["compare", "{tmp}/run", "--ref", "{tmp}/s.npz", "--out", "{tmp}/afile"], "--out {tmp}/afile: is a file"),
    (["compare", "{tmp}/run", "--ref", "{tmp}/s.npz", "--out", "{tmp}/o", "--cfg-scale", "nan"], "--cfg-scale"),
    # the guidance rule of sample.py, before any sampling (these once sampled 5,000 images first)
    (["compare", "{tmp}/run", "--ref", "{tmp}/s.npz", "--out", "{tmp}/o", "--cfg-scale", "-1"],
     "argument --cfg-scale: must be in [0, 1000]"),
    (["compare", "{tmp}/run", "--ref", "{tmp}/s.npz", "--out", "{tmp}/o", "--guidance-interval", "0.8", "0.2"],
     "--guidance-interval 0.8 0.2: need 0 <= LOW <= HIGH <= 1"),
    # the seed rule of sample.py: every image's seed --seed + i in [0, 2**32)
    (["compare", "{tmp}/run", "--ref", "{tmp}/s.npz", "--out", "{tmp}/o", "--seed", "-1"],
     "argument --seed: must be in"),
    (["compare", "{tmp}/run", "--ref", "{tmp}/s.npz", "--out", "{tmp}/o", "--seed", "4294967000", "--num-samples",
      "1000"], "for 1000 images"),
    (["compare", "{tmp}/run", "--ref", "{tmp}/s.npz", "--out", "{tmp}/o", "--seed", "4294967295"], "for 4 images"),
])
def test_eval_bad_outputs_and_references(tmp_path, capsys, argv, message):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    (tmp_path / "one").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "one" / "0.png")
    _samples_npz(tmp_path / "s.npz")
    np.savez(tmp_path / "nan_ref.npz", mu=np.full(2048, np.nan), sigma=np.eye(2048))
    before = _tree(tmp_path)
    line = _fails(eval_fid.main, [a.format(tmp=tmp_path) for a in argv], capsys)
    assert message.format(tmp=tmp_path) in line, line
    assert _tree(tmp_path) == before


# ----------------------------------------------------------------------------------------------------------
# python -m vit5_sit.data

@pytest.mark.parametrize("argv, message", [
    (["mnist", "{tmp}/afile"], "OUT_DIR {tmp}/afile: is a file"),
    (["mnist", "{tmp}/afile/sub"], "afile is a file, not a folder"),
    (["encode", "--data", "{tmp}", "--out", "{tmp}/afile"], "--out {tmp}/afile: is a file"),
    (["encode", "--data", "{tmp}", "--out", "{tmp}/lat", "--device", "foo"], "--device foo"),
])
def test_data_cli_bad_outputs(tmp_path, capsys, argv, message):
    from vit5_sit.data.__main__ import main

    (tmp_path / "afile").write_text("x")
    before = _tree(tmp_path)
    line = _fails(main, [a.format(tmp=tmp_path) for a in argv], capsys)
    assert message.format(tmp=tmp_path) in line, line
    assert _tree(tmp_path) == before


def test_cli_exit_code_in_a_real_process(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "sample.py"), "--out", str(tmp_path), "--device", "foo"],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error: --out")


def test_official_file_with_a_pickle_payload_is_one_line(tmp_path, capsys):
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"model": Payload()}, path)
    line = _fails(sample.main, ["--ckpt", path, "--preset", "SiT-T/2", "--out", tmp_path / "x.png"], capsys)
    assert "evil.pt: cannot read it as a PyTorch checkpoint with weights_only=True" in line
    assert not (tmp_path / "x.png").exists()


def test_unknown_preset_goes_through_the_one_choice_check(tmp_path, capsys):
    """--preset, model.preset and model_config name a bad preset the same way (utils.check_choice)."""
    path = tmp_path / "official.pt"
    path.write_bytes(b"not read: the preset is checked first")
    line = _fails(sample.main, ["--ckpt", path, "--preset", "SiT-XXL/2", "--out", tmp_path / "x.png"], capsys)
    assert line.startswith("error: --preset='SiT-XXL/2': must be one of 'SiT-T/2', ") and "\n" not in line
    assert line.endswith("Did you mean 'SiT-XL/2'?"), line
    assert not (tmp_path / "x.png").exists()


def test_out_in_a_new_folder_is_created_and_a_failed_run_leaves_no_folder(tmp_path, capsys, model_dir):
    out = tmp_path / "new" / "deeper" / "grid.png"
    assert sample.main(["--ckpt", str(model_dir), "--out", str(out), "--per-class", "1", "--no-progress"]) == 0
    assert out.is_file() and not out.with_name("grid.png.lock").exists()
    npz = tmp_path / "other" / "s.npz"
    assert sample.main(["--ckpt", str(model_dir), "--out", str(npz), "--num-samples", "2", "--no-progress"]) == 0
    assert npz.is_file()
    bad = tmp_path / "nothing-here"
    bad.mkdir()
    before = _tree(tmp_path)
    _fails(sample.main, ["--ckpt", bad, "--out", tmp_path / "third" / "x.png", "--no-progress"], capsys)
    assert _tree(tmp_path) == before  # the lock's folders are removed again: nothing was written


@pytest.mark.parametrize("module, argv", [
    ("vit5_sit.cli.sample", ["--save-images", ""]),          # wrote 40 PNGs into the current folder
    ("vit5_sit.cli.sample", ["--ckpt", " "]),
    ("vit5_sit.cli.sample", ["--out", ""]),
    ("vit5_sit.cli.eval_fid", ["calc", "--samples", "", "--ref", "r.npz"]),
    ("vit5_sit.cli.eval_fid", ["compare", "", "--ref", "r.npz", "--out", "o"]),
    ("vit5_sit.cli.train", ["--config", ""]),
    ("vit5_sit.study.__main__", ["status", ""]),
    ("vit5_sit.data.__main__", ["mnist", ""]),
    ("vit5_sit.demo", ["export", "runs/x", "--out", ""]),
    ("vit5_sit.demo.digit_classifier", ["train", "--out", ""]),
    ("vit5_sit.repa.classifier", ["--out", ""]),
])
def test_an_empty_path_is_refused_not_taken_for_the_current_folder(module, argv, capsys, tmp_path, monkeypatch):
    import importlib

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main(argv)
    assert e.value.code == 2
    assert "is empty (an unset variable?); give a path" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


_LONG_NAME, _LONG_PATH = "x" * 300, "a/" * 2100  # over NAME_MAX (255 bytes) / over PATH_MAX (4096 bytes)


@pytest.mark.parametrize("long, message", [(_LONG_NAME, "a path part of 300 bytes"),
                                           (_LONG_PATH, "4,200 bytes long, more than the OS allows")],
                         ids=["long-name", "long-path"])
@pytest.mark.parametrize("module, argv", [
    ("vit5_sit.cli.sample", ["--save-images", "{}"]),
    ("vit5_sit.cli.sample", ["--ckpt", "{}"]),
    ("vit5_sit.cli.sample", ["--out", "{}"]),
    ("vit5_sit.cli.eval_fid", ["calc", "--samples", "{}", "--ref", "r.npz"]),
    ("vit5_sit.cli.train", ["--config", "{}"]),
    ("vit5_sit.cli.train", ["--resume", "{}"]),
    ("vit5_sit.app", ["--model", "{}"]),
    ("vit5_sit.study.__main__", ["status", "{}"]),
    ("vit5_sit.demo", ["export", "{}"]),
])
def test_a_path_too_long_for_the_os_is_a_usage_error(module, argv, long, message, capsys, tmp_path, monkeypatch):
    """The OS answers such a path with "File name too long" at the first look (Path.exists raises it): that
    was a traceback from train.py --resume, the app's --model and any path in a config."""
    import importlib

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main([a.format(long) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err) < 1000, err  # the value is shortened, not echoed in full
    assert not list(tmp_path.iterdir())


def test_shown_cuts_long_values_and_huge_integers():
    from vit5_sit.common.checks import shown

    assert shown("abc") == "abc" and shown("abc", quote=True) == "'abc'"
    assert shown("9" * 4000) == "9" * 60 + "... (4,000 characters)"
    assert shown(10 ** 5000).startswith("<an integer of about 5,000 digits")  # str() itself refuses it


def test_a_pipe_or_device_as_an_input_is_refused_not_read(tmp_path, capsys):
    """A FIFO as --samples or --ckpt blocked forever at the first read; /dev/null as --ckpt was called a
    folder with its own config.yaml."""
    from vit5_sit.cli import eval_fid

    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    assert eval_fid.main(["calc", "--samples", str(fifo), "--ref", str(fifo)]) == 2
    assert f"--samples: {fifo} is neither a file nor a folder (a device or a pipe)" in capsys.readouterr().err
    for ckpt in (str(fifo), "/dev/null"):
        assert sample.main(["--ckpt", ckpt, "--out", str(tmp_path / "g.png")]) == 2
        assert f"--ckpt: {ckpt} is neither a file nor a folder" in capsys.readouterr().err
