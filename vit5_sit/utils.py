"""Small shared helpers: choice validation, atomic file writes, file digests."""

from __future__ import annotations

import difflib
import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


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


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write a file so that readers see the old file or the whole new one, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes owner-only files; use the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
