"""Sampling flags the CLIs share, checked by the transport's one rule for each and named as flags."""

from __future__ import annotations

from vit5_sit.common.checks import UsageError


def seed_flag(seed: int, count: int, flag: str = "--seed") -> None:
    """``--seed`` of ``count`` images (image i has seed SEED + i) by the one seed rule
    (`vit5_sit.transport.check_seeds`), as a UsageError naming the flag."""
    from vit5_sit.transport.rng import SeedError, check_seeds

    try:
        check_seeds(seed, count, flag)
    except SeedError as e:
        raise UsageError(str(e)) from None


def guidance_flags(cfg_scale: float | None, interval) -> None:
    """``--cfg-scale`` and ``--guidance-interval`` (None: the model's defaults) by the one guidance rule
    (`vit5_sit.transport.check_guidance_settings`), as a UsageError naming the flag."""
    from vit5_sit.transport.guidance import GuidanceError, check_guidance_settings

    try:
        check_guidance_settings(1.0 if cfg_scale is None else cfg_scale, (0.0, 1.0) if interval is None else interval,
                                "--cfg-scale", "--guidance-interval")
    except GuidanceError as e:
        raise UsageError(str(e)) from None
