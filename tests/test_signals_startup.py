"""SIGTERM at any time, start-up included (issue #32): one line and exit code 130, never a silent exit -15 or
a traceback; a SIGINT that the parent left ignored stays ignored."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vit5_sit.common.interrupt import EXIT_CODE, STARTING

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
linux_only = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc/PID/status")


def _mask(pid: int, field: str) -> int:
    """A signal mask of /proc/PID/status (SigCgt: caught, SigIgn: ignored); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _has(mask: int, sig: int) -> bool:
    return bool(mask >> (sig - 1) & 1)


def _sigterm_while_starting(cmd: list[str], cwd: Path, preexec_fn=None) -> tuple[int, str, int]:
    """Start cmd, wait until it catches SIGTERM (our handler is installed, its imports are under way: no
    guessed sleep), send SIGTERM; returns (exit code, stderr, its SigIgn mask at that moment)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=preexec_fn)
    deadline = time.monotonic() + 60
    while proc.poll() is None and not _has(_mask(proc.pid, "SigCgt"), signal.SIGTERM):
        assert time.monotonic() < deadline, "SIGTERM was never handled"
        time.sleep(0.001)
    ignored = _mask(proc.pid, "SigIgn")
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err, ignored


COMMANDS = {
    "train.py": [sys.executable, str(ROOT / "train.py"), "train.max_steps=5", "output_dir=OUT"],
    "-m vit5_sit.data": [sys.executable, "-m", "vit5_sit.data", "mnist", "OUT"],  # reaches torch: seconds
}


@linux_only
@pytest.mark.parametrize("name", list(COMMANDS))
def test_sigterm_while_starting_is_one_line_and_130(name, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cmd = [str(out) if a == "OUT" else a for a in COMMANDS[name]]
    rc, err, _ = _sigterm_while_starting(cmd, tmp_path)
    lines = err.strip().splitlines()
    assert rc == EXIT_CODE and len(lines) == 1 and lines[0].startswith("interrupted"), (rc, err)
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


ENTRY_POINTS = {  # arguments that reach the command's first torch import; TMP: a scratch folder
    "train.py": ["train.py", "train.max_steps=5", "output_dir=TMP"],
    "sample.py": ["sample.py", "--out", "TMP/x.png"],
    "eval_fid.py": ["eval_fid.py", "ref", "--data", "TMP", "--out", "TMP/r.npz"],
    "vit5_sit.cli.train": ["-m", "vit5_sit.cli.train", "output_dir=TMP"],
    "vit5_sit.cli.sample": ["-m", "vit5_sit.cli.sample", "--out", "TMP/x.png"],
    "vit5_sit.data": ["-m", "vit5_sit.data", "encode", "--data", "TMP", "--out", "TMP/c", "--device", "cpu"],
    "vit5_sit.models": ["-m", "vit5_sit.models"],
    "vit5_sit.demo": ["-m", "vit5_sit.demo", "export", "TMP", "--out", "TMP/m"],
    "vit5_sit.demo.digit_classifier": ["-m", "vit5_sit.demo.digit_classifier", "train", "--out", "TMP/c"],
    "vit5_sit.repa.classifier": ["-m", "vit5_sit.repa.classifier", "--out", "TMP/e.safetensors"],
}
FAKE_TORCH = """import os, signal, sys
handler = signal.getsignal(signal.SIGTERM)
print(getattr(handler, "__name__", handler), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_sigterm_is_handled_before_torch_is_imported(name, tmp_path):
    """Deterministic, without timing: a stand-in `torch` package, found first, reports the SIGTERM handler at
    the moment a command first imports torch (the seconds of start-up). It was the default (exit -15) for the
    commands whose package imports torch before main runs."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    args = [a.replace("TMP", str(tmp_path)) for a in ENTRY_POINTS[name]]
    if args[0].endswith(".py"):
        args[0] = str(ROOT / args[0])
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    shown = done.stdout.strip().splitlines()
    assert shown, f"torch was never imported: {done.stderr[-300:]}"
    assert shown[-1] in ("_stop_while_starting", "_raise_interrupt", "_handler"), (shown, done.stderr[-500:])


@linux_only
@pytest.mark.skipif(shutil.which("vit5-sit-sample") is None, reason="console scripts not installed")
def test_a_console_script_too(tmp_path):
    rc, err, _ = _sigterm_while_starting([shutil.which("vit5-sit-sample"), "--out", str(tmp_path / "x.png")],
                                         tmp_path)
    lines = err.strip().splitlines()
    assert rc == EXIT_CODE and len(lines) == 1 and lines[0].startswith("interrupted"), (rc, err)


@linux_only
def test_an_ignored_sigint_stays_ignored(tmp_path):
    """A background launch (``cmd &``, nohup) leaves SIGINT ignored: starting up does not undo that."""
    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    rc, err, ignored = _sigterm_while_starting([sys.executable, "-m", "vit5_sit.data", "--help"], tmp_path,
                                               ignore_sigint)
    assert _has(ignored, signal.SIGINT), "SIGINT was taken over"
    assert rc == EXIT_CODE and err.strip().splitlines() == [STARTING]


def test_the_start_up_handler(monkeypatch, capsys):
    from vit5_sit.common.interrupt import _stop_while_starting, started_as_command, stop_while_starting

    monkeypatch.setattr(sys, "argv", ["-m"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "vit5_sit.data", "x"])
    assert started_as_command()
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "pytest"])
    assert not started_as_command()
    monkeypatch.setattr(sys, "argv", ["/venv/bin/vit5-sit-train", "x=1"])
    assert started_as_command()
    monkeypatch.setattr(sys, "argv", ["/venv/bin/pytest"])
    assert not started_as_command()

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_while_starting()
        assert signal.getsignal(signal.SIGTERM) is _stop_while_starting
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # ignored by the parent: left so
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    def exit_now(code):  # the handler leaves at once (os._exit): stand-in so that this process survives
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    with pytest.raises(SystemExit) as e:
        _stop_while_starting(signal.SIGTERM, None)
    assert e.value.code == EXIT_CODE and capsys.readouterr().err.strip() == STARTING


class _Escaped(Exception):
    """A SIGTERM that no handler of the command took (without this, it would stop the test run)."""


@pytest.fixture
def guarded_sigterm():
    def escaped(signum, frame):
        raise _Escaped

    previous = signal.signal(signal.SIGTERM, escaped)
    yield
    signal.signal(signal.SIGTERM, previous)


MAINS = ["vit5_sit.cli.train", "vit5_sit.cli.sample", "vit5_sit.cli.eval_fid", "vit5_sit.data.__main__",
         "vit5_sit.study.__main__", "vit5_sit.models.__main__", "vit5_sit.demo", "vit5_sit.app",
         "vit5_sit.repa.classifier", "vit5_sit.demo.digit_classifier"]


@pytest.mark.parametrize("module", MAINS)
def test_every_main_takes_sigterm_from_its_first_line(module, guarded_sigterm, monkeypatch, capsys):
    """SIGTERM while a command parses its arguments (the first thing its main does): one line, 130."""
    import argparse
    import importlib

    mod = importlib.import_module(module)

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal lands here

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", terminated)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", terminated)
    assert mod.main([]) == EXIT_CODE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("interrupted"), err
