"""One line for a torch / torchvision pair that does not match, instead of the traceback of the first import.

pip installs a torchvision built for another torch without complaint (``pip install torch torchvision`` from two
indexes, or an upgrade of one of them); the error only comes when torchvision is imported (by torch-fidelity, for
FID), as ``operator torchvision::nms does not exist`` or an undefined symbol, 20 lines deep. `mismatch` recognises
it and names the fix: the torchvision release made for the installed torch (torch 2.m pairs with torchvision
0.(m + 15): 2.14 with 0.29).
"""

from __future__ import annotations

import traceback

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCHVISION_MINOR_OFFSET = 15  # torchvision 0.(m + 15).p is built for torch 2.m.p (0.19 for 2.4, ..., 0.29 for 2.14)
_SIGNS = ("torchvision::", "couldn't load custom c++ ops", "undefined symbol", "torchvision._c")


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def matching_torchvision(torch_version: str) -> str | None:
    """The torchvision release built for ``torch_version`` ("2.14.1+cpu" -> "0.29.1"); None for other majors."""
    parts = torch_version.split("+")[0].split(".")
    if len(parts) < 2 or parts[0] != "2" or not parts[1].isdigit():
        return None
    patch = parts[2] if len(parts) > 2 and parts[2].isdigit() else "0"
    return f"0.{int(parts[1]) + TORCHVISION_MINOR_OFFSET}.{patch}"


def mismatch(error: BaseException) -> str | None:
    """One line naming the installed pair and the fix when ``error`` is torchvision failing to load against the
    installed torch; None for any other error."""
    text = f"{type(error).__name__}: {error}".lower()
    in_torchvision = any("torchvision" in frame.filename.replace("\\", "/").split("/")
                         for frame in traceback.extract_tb(error.__traceback__))
    if not (any(sign in text for sign in _SIGNS) and ("torchvision" in text or in_torchvision)):
        return None
    torch_version, vision = _version("torch"), _version("torchvision")
    want = matching_torchvision(torch_version or "")
    if torch_version is None or vision is None or want is None:
        return None
    cpu = "+cpu" in torch_version
    index = f" --index-url {CPU_INDEX}" if cpu else f" (the CPU-only build: add --index-url {CPU_INDEX})"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (f"torchvision {vision} failed to load against torch {torch_version} ({first}): the two must be built "
            f"for each other; install the matching pair: pip install torch=={torch_version.split('+')[0]} "
            f"torchvision=={want}{index}")
