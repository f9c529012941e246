"""REPA: representation alignment of a denoiser block to a frozen encoder (see align.py, encoders.py)."""

from .align import Alignment, alignment_loss, build_projector
from .encoders import EncoderError, load_encoder

__all__ = ["Alignment", "EncoderError", "alignment_loss", "build_projector", "load_encoder"]
