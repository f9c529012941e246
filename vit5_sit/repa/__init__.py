"""REPA: representation alignment of a denoiser block to a frozen encoder (see align.py, encoders.py)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Imported on first use (PEP 562): `python -m vit5_sit.repa.classifier --help` does not wait for torch.
_EXPORTS = {"Alignment": "align", "alignment_loss": "align", "build_projector": "align",
            "EncoderError": "encoders", "load_encoder": "encoders"}

if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from .align import Alignment, alignment_loss, build_projector
    from .encoders import EncoderError, load_encoder


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = ["Alignment", "EncoderError", "alignment_loss", "build_projector", "load_encoder"]
