"""Small shared helpers: choice validation, image file names, a network probe, atomic writes, file digests."""

from __future__ import annotations

import contextlib
import difflib
import glob
import hashlib
import os
import socket
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import urlparse

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")  # image files read from folders (any case)
NETWORK_PROBE_TIMEOUT_S = 3.0  # one TCP connect decides "offline" (DNS included), instead of long retries


def check_choice(key: str, value: object, choices: Iterable, error: type[Exception] = ValueError) -> None:
    """Raise `error` naming `key`, the bad value, the valid choices and the nearest one, unless value is one.

    The one choice validator of the project: the config, the transport and the model options all use it.
    """
    choices = tuple(choices)
    if value in choices:
        return
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise error(f"{key}={value!r}: must be one of {', '.join(map(repr, choices))}.{hint}")


def host_reachable(url: str, timeout: float = NETWORK_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the URL's host and port (default: 443 for https, else 80) opens within
    `timeout` seconds, DNS lookup included."""
    parsed = urlparse(url if "://" in url else f"https://{url}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    ok = []

    def probe():
        try:
            socket.create_connection((parsed.hostname, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)  # daemon: a stuck DNS lookup cannot keep us waiting
    thread.start()
    thread.join(timeout)
    return bool(ok)


def walk_image_files(root: str | Path, skip_hidden: bool = False) -> Iterator[Path]:
    """Image files (IMAGE_EXTENSIONS, any case) anywhere under ``root``, following folder links, in no set
    order. Each real folder is walked once (a link back up the tree listed every image ~40 times, until the
    OS gave up on the path), and only regular files are listed (a FIFO named ``x.png`` blocked the reader
    forever). ``skip_hidden``: leave out names starting with '.' (files and folders)."""
    seen: set[tuple[int, int]] = set()
    stack = [os.fspath(root)]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(folder) as entries:
                listed = list(entries)
        except OSError:  # unreadable or vanished: skipped, as os.walk does
            continue
        for entry in listed:
            if skip_hidden and entry.name.startswith("."):
                continue
            try:  # the type comes from the folder listing: no stat per file (a network filesystem's cost)
                if entry.is_dir():  # follows links, as the folder tree the user sees
                    stack.append(entry.path)
                elif entry.name.lower().endswith(IMAGE_EXTENSIONS) and entry.is_file():
                    yield Path(entry.path)
            except OSError:
                continue


@contextlib.contextmanager
def atomic_write_file(path: str | Path) -> Iterator[Path]:
    """A temporary file name beside `path` for writers that want a name (np.savez, safetensors, PIL,
    matplotlib). When the block ends the file is synced and renamed onto `path`, so readers see the old file
    or the whole new one, never a partial one; if the block raises, the temporary file is removed. A killed
    process can leave ``.NAME.*.tmp`` beside `path` (`stale_temp_files` finds them)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes owner-only files; use the usual permissions
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno is not None and not e.filename:  # f.write's error names no file
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e
        raise


class LockPathError(ValueError):
    """The path of a lock file is taken by a folder or a special file; the message names it and the fix."""


@contextlib.contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if missing, and left in place) for the block:
    another process that asks for the same lock (a second study job, another accelerate rank, a second
    command) waits until this one's block ends. The lock goes with its process if that is killed, so a
    crash never leaves it held. POSIX ``flock``; where there is none (Windows, a filesystem without locks)
    the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # no flock here: nothing to hold
        yield
        return
    path = Path(path)
    if path.exists() and not path.is_file():  # a folder (or a pipe) where the lock file belongs
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise LockPathError(f"{path}: is {kind}, where this command keeps its lock file; remove it (it is not "
                            "data of this project) or choose another folder")
    with open(path, "ab") as f:  # "a": never truncates, creates the file if it is missing
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except OSError:  # a filesystem without locks (ENOLCK, EOPNOTSUPP on some network mounts): unlocked
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def save_safetensors(tensors: dict, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' ``save_file``, with its I/O failures (a full disk, a read-only folder) raised as the
    OSError they are (safetensors raises its own SafetensorError, which no ``except OSError`` sees)."""
    import errno

    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        text = str(e)
        for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG, errno.EIO):
            if f"os error {code})" in text:
                raise OSError(code, os.strerror(code), str(path)) from e
        raise


def save_torch(obj, path: str | Path) -> None:
    """``torch.save`` with a write that the storage refused raised as the OSError it is: torch's zip writer
    reports a full disk as a RuntimeError ('unexpected pos 1088 vs 1026', 'file write failed') without the errno;
    it fails this way when the disk is full, so it is named as that: 'No space left on device'."""
    import errno

    import torch

    try:
        torch.save(obj, path)
    except RuntimeError as e:
        text = str(e)
        if "unexpected pos" in text or "file write failed" in text or "failed writing" in text:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from e
        raise


def stale_temp_files(path: str | Path) -> list[Path]:
    """Temporary files that a killed `atomic_write_file(path)` left beside `path`; for a folder, those of
    every file anywhere below it."""
    path = Path(path)
    if path.is_dir():
        return sorted(path.rglob(".*.tmp"))
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write a file so that readers see the old file or the whole new one, never a partial one."""
    with atomic_write_file(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in 4 MiB blocks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):  # another user's process: alive
        return True
    return True


def _stale_folders(path: Path) -> None:
    """What a killed `atomic_folder(path)` left: its unfinished ``.NAME.new-PID-*`` (removed) and, killed between
    its two renames, the old folder ``.NAME.old-PID-*`` (put back where ``path`` is missing, else removed)."""
    import shutil

    for kind in ("new", "old"):
        for stale in path.parent.glob(f".{glob.escape(path.name)}.{kind}-*"):
            pid = stale.name[len(f".{path.name}.{kind}-"):].split("-")[0]
            if not pid.isdigit() or _pid_alive(int(pid)):
                continue
            if kind == "old" and not path.exists() and not path.is_symlink():
                os.replace(stale, path)
            else:
                shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """A new, empty folder beside `path` to write a whole folder into; when the block ends it replaces `path`
    (renamed into place), so readers see the old folder or the whole new one, never a mix. If the block raises,
    the new folder is removed and `path` is left as it was. A link at `path` keeps pointing where it did: the
    folder it names is replaced. A killed process leaves the old folder (or, killed between the two renames,
    none, the old one waiting as ``.NAME.old-PID-*``) and an unfinished ``.NAME.new-PID-*``: the next call for the
    same path puts the old folder back or removes what is stale."""
    import shutil

    path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _stale_folders(path)
    stage = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.new-{os.getpid()}-"))
    try:
        os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes owner-only folders; use the usual permissions
        yield stage
        old = None
        if path.exists() or path.is_symlink():
            old = path.parent / f".{path.name}.old-{os.getpid()}-{os.urandom(4).hex()}"
            os.replace(path, old)
        try:
            os.replace(stage, path)
        except BaseException:
            if old is not None:
                os.replace(old, path)
            raise
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
