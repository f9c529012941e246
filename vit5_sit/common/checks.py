"""Checks shared by the command-line tools, before any work: output paths, devices, finite numbers, locks.

Every check raises `UsageError` with one line naming the flag, the value and the fix; each CLI prints it
as ``error: ...`` and exits with code 2. Only the standard library is imported at the top (``--help`` stays
fast).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from pathlib import Path


class UsageError(ValueError):
    """A command-line value that cannot work; the message names the flag and the fix. The one usage error of
    every CLI: each prints it as ``error: <message>`` and exits with code 2."""


class ModelLoadError(RuntimeError):
    """The path does not hold a model we can load; the message says what was expected (raised by
    `vit5_sit.hub.model_files` and `vit5_sit.hub.files`)."""


def nearest_existing(path: str | Path) -> Path:
    """``path`` itself if it exists, else its nearest existing parent (the root at worst)."""
    path = Path(path)
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def writable_folder(folder: str | Path, what: str, into_assets: bool = False) -> Path:
    """The nearest existing folder at or above ``folder``, after a probe file was created and removed in it.

    Raises UsageError (starting with ``what``, e.g. "--out x.png") when a path on the way is a file or that
    folder cannot be written, or when it lies inside the package's assets (`protected_output_problem`; only
    ``into_assets``, demo export's, may). Nothing stays behind: a missing ``folder`` is created later, by whoever
    writes into it.
    """
    folder = Path(folder)
    if not into_assets and (problem := protected_output_problem(folder)):
        raise UsageError(f"{what}: {problem}")
    probe_dir = nearest_existing(folder)
    if not probe_dir.is_dir():
        raise UsageError(f"{what}: {probe_dir} is a file, not a folder; choose another location")
    probe = probe_dir / f".write-probe-{socket.gethostname()}-{os.getpid()}"  # unique on a shared filesystem
    try:
        try:
            probe.write_bytes(b"x")  # one byte, not none: a full disk still creates an empty file
        finally:
            probe.unlink(missing_ok=True)
    except OSError as e:
        import errno

        fix = "free space or choose another location" if e.errno in (errno.ENOSPC, errno.EDQUOT) else \
            "choose a writable location"
        raise UsageError(f"{what}: cannot write in {probe_dir} ({e.strerror or e}); {fix}") from None
    return probe_dir


def room_for(folder: str | Path, nbytes: int, what: str) -> None:
    """UsageError (starting with ``what``) when the filesystem that would hold ``folder`` has less than
    ``nbytes`` free: a file that needs minutes of compute is refused before them, not when it is written."""
    import shutil

    where = nearest_existing(folder)
    try:
        free = shutil.disk_usage(where).free
    except OSError:  # cannot tell: the write itself reports a full disk
        return
    if free < nbytes:
        raise UsageError(f"{what}: needs about {nbytes / 2**20:,.1f} MiB, and only {free / 2**20:,.1f} MiB are "
                         f"free in {where}; free space or choose another location")


PACKAGE_ASSETS = Path(__file__).resolve().parent.parent / "assets"  # the package's own files: the bundled model
# folders (vit5_sit.hub.files.BUNDLED_MODELS), the digit classifier, the class names; tracked, never an output


def protected_output_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` may not be written by a command, or None: it is, or lies inside (through a link, '..', a
    relative path from a folder in it), the package's assets, whose files are the bundled models that every
    entry point loads by name. The one exception is ``demo export --out``, which regenerates them on purpose
    (`vit5_sit.common.contract.Arg.into_assets`)."""
    try:
        target = Path(os.path.realpath(path))
        assets = Path(os.path.realpath(PACKAGE_ASSETS))
    except (OSError, ValueError):
        return None
    if target != assets and assets not in target.parents:
        return None
    return (f"is inside the package's own files ({assets}: the bundled models and their samples), which no "
            "command may overwrite; choose a location outside the package")


def output_file(path: str | Path, flag: str) -> Path:
    """An output file path that can be written: not a folder, its folder writable (or creatable), not inside
    the package's assets."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a folder; give a file name, e.g. {path / 'out'}")
    writable_folder(path.parent, f"{flag} {path}")
    return path


def output_folder(path: str | Path, flag: str, into_assets: bool = False) -> Path:
    """An output folder that can be written: an existing folder, or one that can be created; not inside the
    package's assets unless ``into_assets`` (demo export regenerating a bundled model)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a folder; give a folder")
    writable_folder(path, f"{flag} {path}", into_assets=into_assets)
    return path


MAX_INTEGER = 2**53  # the largest integer setting: beyond it a float (1e30) no longer names one exact integer


def integer_problem(value: object) -> str | None:
    """Why ``value`` (an int, or a float such as 1e3 that was meant as one) cannot be an integer setting, or
    None: a float must be a whole number, and any value at most MAX_INTEGER in size (``1e30`` is no step
    count or batch size: it is refused, not run until stopped)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "expected an integer"
    if isinstance(value, float) and math.isnan(value):
        return "expected an integer"
    if abs(value) > MAX_INTEGER:  # inf too
        return f"out of range: an integer setting is at most 2**53 = {MAX_INTEGER:,} in size"
    if isinstance(value, float) and not value.is_integer():
        return "expected an integer"
    return None


def integer(text: str) -> int:
    """argparse type: an integer, written as one (``1000``) or as a whole number (``1e3``), at most MAX_INTEGER
    in size: ``1.5``, ``1e30``, ``nan`` are refused naming the value, and so are digits of other scripts (``١٢``),
    which Python's int() would read."""
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"expected an integer, got {shown(text, quote=True)}")
    try:
        value: int | float = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {shown(text, quote=True)}") from None
    problem = integer_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}, got {shown(text)}")
    return int(value)


def _int_at_least(text: str, minimum: int, words: str) -> int:
    value = integer(text)
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {words}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "at least 1")


NAME_MAX = 255    # bytes in one path component (Linux, macOS; Windows counts 255 characters)
PATH_MAX = 4096   # bytes in a whole path (Linux)


def path_problem(text: str) -> str | None:
    """Why ``text`` cannot be a path on this system, or None: a NUL character, a name longer than NAME_MAX bytes
    or a path longer than PATH_MAX, which the OS refuses ("File name too long") at the first look, as a traceback."""
    if "\0" in text:  # the OS cannot take it at all (Python raises ValueError: embedded null byte)
        return "contains a NUL character, which no path can; give a real path"
    encoded = os.fsencode(text)
    if len(encoded) > PATH_MAX:
        return f"{len(encoded):,} bytes long, more than the OS allows for a path ({PATH_MAX:,}); give a shorter path"
    for part in Path(text).parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            return (f"a path part of {size:,} bytes ({shown(part, 40)}), more than the OS allows for one file or "
                    f"folder name ({NAME_MAX}); give a shorter name")
    return None


def guide_step(guide: str) -> int | None:
    """The step of a ``step:N`` guide (each run's own checkpoint at step N, as `eval_fid.py compare --guide` and a
    study's ``eval.guide`` name it); None for another form; ValueError when N is not a positive whole number."""
    if not guide.startswith("step:"):
        return None
    step = guide[5:]
    if not (step.isascii() and step.isdigit() and int(step) > 0):
        raise ValueError(f"{guide!r}: step:N takes a positive whole step, e.g. step:800")
    return int(step)


def path_text(text: str) -> str:
    """argparse type of a path (or name) flag: an empty value, typically an unset shell variable, is refused
    instead of meaning the current folder (``--save-images ""`` wrote PNGs into it), and so is a name too long
    for the OS."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (an unset variable?); give a path")
    problem = path_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0 (e.g. a seed)."""
    return _int_at_least(text, 0, "0 or more")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (e.g. a learning rate)."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def finite_float(text: str) -> float:
    """argparse type: a finite number (nan and inf are refused; so are digits of other scripts)."""
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"expected a number, got {shown(text, quote=True)}")
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def parse_device(text: str | None, flag: str = "--device"):
    """A torch.device that exists on this machine (None stays None: the tool's default)."""
    import torch

    if text is None:
        return None
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"{flag} {text}: not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"{flag} {text}: no CUDA GPU is available on this machine; use --device cpu")
        if device.index is not None and device.index >= count:
            raise UsageError(f"{flag} {text}: this machine has {count} GPU(s) (cuda:0..cuda:{count - 1})")
    elif device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise UsageError(f"{flag} {text}: MPS is not available on this machine; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"{flag} {text}: unsupported device type {device.type!r}; use cpu or cuda")
    return device


class OutputLock:
    """``OUT.lock``, held while one process writes ``OUT``: a second run on the same output is refused.

    The lock file holds ``host pid``; a lock left by a process that is gone (killed) on this host is taken
    over. ``acquire`` raises UsageError naming the holder.
    """

    def __init__(self, out: str | Path, flag: str = "--out") -> None:
        out = Path(out)
        self.path, self.flag, self.out, self.held = out.with_name(out.name + ".lock"), flag, out, False
        self.created: list[Path] = []  # folders made for OUT, removed again on release while still empty

    def acquire(self) -> OutputLock:
        me = f"{socket.gethostname()} {os.getpid()}"
        self._make_folders()
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None:  # stale: its writer is gone
                    self.path.unlink(missing_ok=True)
                    continue
                raise UsageError(f"{self.flag} {self.out}: another run (process {holder}) is writing it; wait "
                                 f"for it to finish or choose another {self.flag} (if none is running, delete "
                                 f"{self.path})") from None
            self.held = True
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(me + "\n")
            except OSError as e:  # a full disk: an empty lock would read as held by "unknown" forever
                self.release()
                raise OSError(e.errno, e.strerror, str(self.path)) from None
            return self
        raise UsageError(f"{self.flag} {self.out}: could not take the lock {self.path}")

    def _holder(self) -> str | None:
        """'host pid' of a live holder, or None when the lock is stale."""
        try:
            host, pid = self.path.read_text().split()
            pid_n = int(pid)
        except (OSError, ValueError):
            return "unknown"  # being written right now, or unreadable: treat as held
        if host == socket.gethostname() and not process_alive(pid_n):
            return None
        return f"{pid} on {host}"

    def _make_folders(self) -> None:
        """OUT's folder, created when missing (its writer would create it anyway), innermost last."""
        missing, folder = [], self.path.parent
        while not folder.exists() and folder.parent != folder:
            missing.append(folder)
            folder = folder.parent
        for folder in reversed(missing):
            folder.mkdir(exist_ok=True)
            self.created.append(folder)

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
        for folder in reversed(self.created):  # a run that wrote nothing leaves no empty folders behind
            try:
                folder.rmdir()
            except OSError:  # not empty (OUT was written) or gone
                break
        self.created = []

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def shown(value: object, limit: int = 80, quote: bool = False) -> str:
    """A value as an error message echoes it: ``repr`` (``quote``) or ``str``, cut to ``limit`` characters with
    the full length named (a 5,000-digit number or a 2,000-entry list stays one readable line)."""
    try:
        text = repr(value) if quote else str(value)
    except ValueError:  # an int beyond Python's 4,300-digit str limit
        return f"<an integer of about {value.bit_length() * 0.30103:,.0f} digits>"
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text):,} characters)"


def storage_error(exc: BaseException) -> str | None:
    """The one line for a write that the storage refused (a full disk or quota, a read-only or failing
    filesystem), or None for any other error: ``could not write PATH: No space left on device (1.2 MiB free
    there); free space or choose another location``."""
    import errno

    codes = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}
    if not isinstance(exc, OSError) or exc.errno not in codes:
        return None
    path = Path(exc.filename) if exc.filename else None
    where, free = "", ""
    if path is not None:
        where = f" {path}"
        folder = nearest_existing(path if path.is_dir() else path.parent)
        try:
            import shutil

            free = f" ({shutil.disk_usage(folder).free / 2**20:,.1f} MiB free there)"
        except OSError:
            pass
    if exc.errno in (errno.EROFS, errno.EIO):  # no space to free: the filesystem itself refuses
        return f"could not write{where}: {exc.strerror or os.strerror(exc.errno)}; choose another location"
    return (f"could not write{where}: {exc.strerror or os.strerror(exc.errno)}{free}; free space or choose "
            "another location")


def storage_failure(exc: OSError, kept: str) -> int:
    """A command's answer to a write the storage refused: prints ``error: <storage_error line>; <kept>`` (what
    was kept and how to continue) and returns exit code 1; any other OSError is raised again."""
    line = storage_error(exc)
    if line is None:
        raise exc
    print(f"error: {line}; {kept}", file=sys.stderr, flush=True)
    return 1


WEIGHT_DTYPES = ("float32", "bfloat16", "float16", "float64")  # what a file of model weights may hold


def tensors_problem(state: object, expected: dict | None = None) -> str | None:
    """Why the tensors read from a weights file cannot be loaded as they are, or None.

    Every tensor must be a dense tensor of a floating dtype (WEIGHT_DTYPES; integer, bool, complex or
    quantized weights would be cast to float silently, the small ones becoming 0) holding no NaN or inf.
    With ``expected`` (the model's state dict, e.g. on the meta device), each tensor it names must have its
    shape, and where the model keeps a non-floating buffer, its dtype; keys it lacks are the caller's to
    report. The answer names the tensor, e.g. ``tensor 'blocks.0.mlp.fc1.weight' has dtype int64 ...``.
    """
    import torch

    if not isinstance(state, dict) or not state:
        return "holds no tensors"
    dtypes = {getattr(torch, name) for name in WEIGHT_DTYPES}
    bad_dtype, bad_shape, nonfinite = [], [], []
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            return f"entry {shown(name, quote=True)} is a {type(t).__name__}, not a tensor"
        want = expected.get(name) if expected is not None else None
        if t.layout != torch.strided:
            bad_dtype.append((name, f"a {str(t.layout).removeprefix('torch.')} tensor"))
        elif want is not None and not want.is_floating_point():
            if t.dtype != want.dtype:
                bad_dtype.append((name, f"dtype {str(t.dtype).removeprefix('torch.')} (the model's is "
                                        f"{str(want.dtype).removeprefix('torch.')})"))
        elif t.dtype not in dtypes:
            bad_dtype.append((name, f"dtype {str(t.dtype).removeprefix('torch.')}"))
        if want is not None and tuple(t.shape) != tuple(want.shape):
            bad_shape.append(f"{shown(name, quote=True)} {tuple(t.shape)} (the model's: {tuple(want.shape)})")
        if not bad_dtype and t.is_floating_point() and t.device.type != "meta" and not bool(torch.isfinite(t).all()):
            nonfinite.append(name)

    def more(items: list) -> str:
        return f" (and {len(items) - 1} more)" if len(items) > 1 else ""

    if bad_dtype:
        name, what = bad_dtype[0]
        return (f"tensor {shown(name, quote=True)} has {what}{more(bad_dtype)}; model weights are floating-point "
                f"({', '.join(WEIGHT_DTYPES[:3])}), so these are not weights as saved by this project")
    if bad_shape:
        return f"tensor {bad_shape[0]}{more(bad_shape)} does not fit the model"
    if nonfinite:
        return (f"tensor {shown(nonfinite[0], quote=True)}{more(nonfinite)} holds NaN or inf: the weights are "
                "damaged or the run diverged")
    return None


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``: torch.load's weights-only refusal, for one, runs to 20 lines."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (someone else's counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def state_dict_problem(state: dict, expected: dict) -> str | None:
    """`tensors_problem` for a file that must hold exactly the model's tensors: a missing or unexpected key first
    (up to three named), then dtype, shape and finiteness; None when it loads as it is."""
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing:
        return f"missing tensors {missing[:3]}"
    if unexpected:
        return f"unexpected tensors {unexpected[:3]}"
    return tensors_problem(state, expected)
