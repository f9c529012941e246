"""What the generation study says about picking a backbone, and what a re-training gives, for model cards.

The numbers are the study's report at its last step (docs/study/generation/study.json: FID-1000, ODE Euler 6;
tests/test_hub.py checks them and the verdicts against that file), so every card states the recommendation that
docs/study and the README state.
"""

from __future__ import annotations

from vit5_sit.config import ExperimentConfig

# (arm, cfg scale) -> (mean FID-1000, sd, training seeds) at 3,600 steps: docs/study/generation/study.json
GENERATION_STUDY: dict[tuple[str, float], tuple[float, float, int]] = {
    ("sit-rope", 1.0): (55.1, 1.9, 5), ("sit-rope", 6.0): (67.5, 3.5, 5),
    ("vit5-nols", 1.0): (61.9, 3.6, 5), ("vit5-nols", 6.0): (67.4, 2.2, 5),
    ("nols-no-registers", 1.0): (56.4, 1.1, 3), ("nols-no-registers", 6.0): (65.2, 1.8, 3),
    ("sit", 1.0): (69.3, 7.5, 3), ("sit", 6.0): (76.8, 4.2, 3),
}
# the pre-registered rule's pick (the study's `decision`), unguided and guided, and the presets of those arms
VERDICT = {1.0: "sit-rope", 6.0: "vit5-nols"}
ARM_PRESETS = {"sit-rope": "SiTRoPE-*", "vit5-nols": "ViT5G-*", "nols-no-registers": "ViT5G-* with "
               "model.num_registers=0", "sit": "SiT-*"}
# unguided, the winner against vit5-nols paired by training seed: seeds ahead, seeds paired, the 95% t-interval
UNGUIDED_PAIRED = (4, 5, (-13.3, -0.3))
# the default guidance (autoguidance weight 3 on t in [0, 0.5], the run's step-800 checkpoint as guide), issue #52:
# arm -> (mean FID-1000, sd, training seeds) of docs/study/guidance/ARM-sSEED.json's auto:s800@3@0-0.5 rows
GUIDED_STUDY: dict[str, tuple[float, float, int]] = {"sit-rope": (33.9, 1.1, 3), "vit5-nols": (38.1, 1.0, 3)}
# sit-rope against vit5-nols there, paired by training seed: seeds ahead, seeds paired, the 95% t-interval
GUIDED_PAIRED = (3, 3, (-9.4, 1.1))
STUDY_FAMILIES = ("SiT", "SiTRoPE", "ViT5G", "ViT5")  # presets the study (or the component study before it) ranks


def _over_seeds(mean: float, sd: float, n: int) -> str:
    return f"{mean:.1f} ± {sd:.1f} over {n} seeds"


def _fid(arm: str, cfg_scale: float) -> str:
    return _over_seeds(*GENERATION_STUDY[(arm, cfg_scale)])


def _guided(arm: str) -> str:
    return _over_seeds(*GUIDED_STUDY[arm])


def backbone_advice(cfg: ExperimentConfig) -> list[str]:
    """The card's "Choosing a backbone" section (markdown lines); none for a preset family the study did not
    compare."""
    if cfg.model.preset.split("-")[0] not in STUDY_FAMILIES:
        return []
    ahead, paired, (lo, hi) = UNGUIDED_PAIRED
    g_ahead, g_paired, (g_lo, g_hi) = GUIDED_PAIRED
    return [
        "## Choosing a backbone", "",
        "vit5-sit's generation study (`docs/study` in vit5-sit's repository: MNIST at 32 px, T/4 models of 4.2M "
        "parameters trained 3,600 steps, sampled with ODE Euler 6; FID-1000 against all 5,000 digits, mean ± sd "
        "over training seeds, lower is better) recommends:", "",
        f"- **Without guidance: `{ARM_PRESETS[VERDICT[1.0]]}`** (SiT + 2D RoPE {_fid('sit-rope', 1.0)}, against "
        f"ViT5G's {_fid('vit5-nols', 1.0)}; ahead on {ahead} of {paired} paired seeds, paired 95% t-interval "
        f"[{lo:+.1f}, {hi:+.1f}]).",
        f"- **With guidance, level: `{ARM_PRESETS[VERDICT[6.0]]}`** (the default) **or `{ARM_PRESETS['sit-rope']}`**. "
        "At the default guidance (autoguidance, weight 3 on t in [0, 0.5], each run's step-800 checkpoint as the "
        f"guide; `docs/study/guidance`) SiT + 2D RoPE {_guided('sit-rope')} and ViT5G {_guided('vit5-nols')}: SiT + "
        f"RoPE ahead on {g_ahead} of {g_paired} paired seeds, paired 95% t-interval [{g_lo:+.1f}, {g_hi:+.1f}], not "
        f"resolved; at cfg 6, the study's guided cell, ViT5G {_fid('vit5-nols', 6.0)} and SiT + RoPE "
        f"{_fid('sit-rope', 6.0)} are level in FID, and ViT5G has the better sFID and precision.",
        f"- Vanilla `SiT-*` trails both ways ({_fid('sit', 1.0)} / {_fid('sit', 6.0)}); the paper's `ViT5-*` "
        "(LayerScale 1e-4) trails ViT5G for generation. Under MeanFlow (one step) SiT + RoPE and ViT5G are level.",
        "",
        "Whether this holds for larger models and ImageNet was not measured (vit5-sit's `configs/imagenet256/` "
        "has the GPU runs that would tell).", "",
    ]


def retraining_note() -> str:
    """What training a card's config again gives: the sentence the card's Training section ends with."""
    return ("Training it again with the same seed gives these weights bit for bit only with the same vit5-sit "
            "version (its per-step seed rule), thread count, torch build and CPU, however often the run stops "
            "and resumes (`--resume auto` is exact); otherwise it gives another draw of the recipe: compare it "
            "with the recipe's spread over training seeds (in the study, an sd of 1.9-3.6 FID-1000 at 3,600 "
            "steps), not with these weights' digits.")
