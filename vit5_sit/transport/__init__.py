"""Flow-matching core (SiT's convention: x_t = alpha_t x1 + sigma_t x0, t = 0 noise, t = 1 data)."""

from .guidance import (
    AutoGuidance,
    ClassifierFreeGuidance,
    GuidanceError,
    check_guidance,
    check_guidance_settings,
    check_guide,
)
from .likelihood import NLLEstimate, nll_bits_per_dim, nll_estimate
from .meanflow import MeanFlowConfig, meanflow_sample
from .rng import SEED_LIMIT, SeedError, StackedRandomGenerator, check_seeds
from .samplers import SamplerConfig, SampleResult, diffusion, sample
from .solvers import GRIDS, dpm_solver_pp, time_grid
from .transport import Transport, TransportConfig

__all__ = [
    "AutoGuidance",
    "ClassifierFreeGuidance",
    "GRIDS",
    "GuidanceError",
    "MeanFlowConfig",
    "NLLEstimate",
    "SEED_LIMIT",
    "SampleResult",
    "SamplerConfig",
    "SeedError",
    "StackedRandomGenerator",
    "Transport",
    "TransportConfig",
    "check_guide",
    "check_guidance",
    "check_guidance_settings",
    "check_seeds",
    "diffusion",
    "dpm_solver_pp",
    "meanflow_sample",
    "nll_bits_per_dim",
    "nll_estimate",
    "sample",
    "time_grid",
]
