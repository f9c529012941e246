"""REPA: representation alignment of a denoiser block to a frozen encoder (see align.py, encoders.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vit5_sit.common.lazy import lazy_exports

# Imported on first use (PEP 562): `python -m vit5_sit.repa.classifier --help` does not wait for torch.
_EXPORTS = {"Alignment": "align", "alignment_loss": "align", "build_projector": "align",
            "EncoderError": "encoders", "load_encoder": "encoders"}

if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from .align import Alignment, alignment_loss, build_projector
    from .encoders import EncoderError, load_encoder


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = ["Alignment", "EncoderError", "alignment_loss", "build_projector", "load_encoder"]
