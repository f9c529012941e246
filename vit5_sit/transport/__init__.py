"""Flow-matching core (SiT's convention: x_t = alpha_t x1 + sigma_t x0, t = 0 noise, t = 1 data)."""

from .guidance import ClassifierFreeGuidance, GuidanceError, check_guidance, check_guidance_settings
from .likelihood import NLLEstimate, nll_bits_per_dim, nll_estimate
from .rng import StackedRandomGenerator
from .samplers import SamplerConfig, SampleResult, diffusion, sample
from .transport import Transport, TransportConfig

__all__ = [
    "ClassifierFreeGuidance",
    "GuidanceError",
    "NLLEstimate",
    "SampleResult",
    "SamplerConfig",
    "StackedRandomGenerator",
    "Transport",
    "TransportConfig",
    "check_guidance",
    "check_guidance_settings",
    "diffusion",
    "nll_bits_per_dim",
    "nll_estimate",
    "sample",
]
