"""The bounds every numeric flag, config key and pipeline keyword must keep, stated here, apart from the tables they
check (vit5_sit.common.contract.FLAGS, vit5_sit.config.RANGES, PIPELINE_ARGS): the property tests draw their bad
values from these, so deleting or loosening a bound in a table fails a test instead of moving the test with it.

A bound is written as the user reads it: ``[1, 10000]`` (both ends included), ``(0.0, 1.0)`` (excluded), ``>= 0``,
``> 0.0``, ``any`` (any finite number). Integers are written as integers, real numbers with a point or an exponent
(``[0.0, 1000.0]``): that is the value's kind too. A new numeric flag, key or keyword needs its line here (a test
fails for one without); a changed bound is changed in both places, on purpose.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

SEED = "[0, 4294967295]"
BATCH = "[1, 65536]"
IMAGES = "[1, 1000000]"
STEPS = "[1, 10000]"
GUIDANCE = "[0.0, 1000.0]"
UNIT = "[0.0, 1.0]"
PIXELS = "[1, 9459]"
WORKERS = "[0, 1024]"
TRAIN_STEPS = "[1, 100000000]"

# Command-line flags: "FLAG" for every command, "COMMAND FLAG" for one command (the more specific line wins).
FLAGS = {
    "--per-class": IMAGES,
    "--num-samples": IMAGES,
    "--seed": SEED,
    "--cfg-scale": GUIDANCE,
    "--guidance-interval": UNIT,
    "--guide-channels": "[1, 4096]",
    "--steps": STEPS,
    "--tol": "[1e-10, 1.0]",
    "--image-size": PIXELS,
    "--batch-size": BATCH,
    "--part-size": IMAGES,
    "--num-workers": WORKERS,
    "--resolution": PIXELS,
    "eval_fid calc --kid-subset-size": IMAGES,
    "eval_fid compare --sample-batch-size": BATCH,
    "eval_fid compare --every": TRAIN_STEPS,
    "study --jobs": "[1, 1024]",
    "study --threads": "[1, 1024]",
    "study --until": TRAIN_STEPS,
    "study --seeds": SEED,                 # each item of the list
    "study --steps": TRAIN_STEPS,          # each item of the list
    "data --limit-per-class": IMAGES,
    "data encode --shard-size": IMAGES,
    "data encode --part": "[0, 1024]",
    "data encode --num-parts": "[1, 1024]",
    "app --port": "[1024, 65535]",         # below 1024: only root may listen
    "app --max-evals": "[1, 1000000000]",
    "app --max-queue": "[1, 1000000]",
    "models --input-size": PIXELS,
    "repa_classifier --steps": TRAIN_STEPS,
    "repa_classifier --lr": "(0.0, 10.0]",
    "repa_classifier --depth": "[1, 1024]",
    "repa_classifier --hidden-size": "[1, 65536]",
    "repa_classifier --num-heads": "[1, 1024]",
    "attention --t": UNIT,                 # each item of the list
    "attention --num": BATCH,
}

# Config keys (section.key=value).
CONFIG = {
    "data.resolution": ">= 1", "data.channels": ">= 1", "data.num_workers": ">= 0",
    "train.global_batch_size": ">= 1", "train.grad_accum": ">= 1", "train.max_steps": ">= 1",
    "train.lr": "> 0.0", "train.weight_decay": ">= 0.0", "train.beta1": "[0.0, 1.0)", "train.beta2": "[0.0, 1.0)",
    "train.warmup_steps": ">= 0", "train.grad_clip": "> 0.0", "train.ema_decay": "[0.0, 1.0)", "train.seed": SEED,
    "train.ckpt_every": ">= 1", "train.keep_last": ">= 0", "train.guide_at": "(0.0, 1.0)",
    "train.max_nonfinite": ">= 1",
    "log.every": ">= 1", "log.sample_every": ">= 0", "log.sample_classes": ">= 0", "log.sample_per_class": ">= 1",
    "log.sample_seed": SEED, "log.sample_cfg_scale": GUIDANCE, "log.sample_guidance_interval": "[0.0, 1.0]",
    "transport.logit_normal_mean": "any", "transport.logit_normal_std": "> 0.0",
    "transport.train_eps": "[0.0, 0.5)", "transport.sample_eps": "[0.0, 0.5)",
    "sampler.steps": STEPS, "sampler.atol": "[1e-10, 1.0]", "sampler.rtol": "[1e-10, 1.0]", "sampler.shift": "> 0.0",
    "sampler.diffusion_norm": ">= 0.0", "sampler.last_step_size": "(0.0, 1.0)",
    "model.input_size": ">= 1", "model.in_channels": ">= 1", "model.patch_size": ">= 1", "model.hidden_size": ">= 1",
    "model.depth": ">= 1", "model.num_heads": ">= 1", "model.mlp_ratio": "> 0.0", "model.num_classes": ">= 1",
    "model.class_dropout_prob": "[0.0, 1.0)", "model.rope_base": "> 0.0", "model.num_registers": ">= 0",
    "model.dmf_depth": ">= 0",
    "model.register_rope_base": "> 0.0", "model.layer_scale_init": ">= 0.0", "model.gate_init": "any",
    "repa.weight": ">= 0.0", "repa.depth": ">= 1", "repa.encoder_resolution": ">= 0", "repa.projector_dim": ">= 1",
    "meanflow.ratio": "[0.0, 1.0]", "meanflow.time_mean": "[-10.0, 10.0]", "meanflow.time_std": "(0.0, 10.0]",
    "meanflow.adaptive_p": "[0.0, 4.0]", "meanflow.adaptive_c": "> 0.0", "meanflow.guidance_scale": "[0.0, 100.0]",
    "meanflow.guidance_mix": "[0.0, 1.0)", "meanflow.guidance_interval": "[0.0, 1.0]",
    "meanflow.guidance_range": "[1.0, 100.0]",
}

# Pipeline keywords (pipe(..., keyword=value)), the numeric ones.
PIPELINE = {
    "guidance_scale": GUIDANCE,
    "guidance_interval": UNIT,
    "num_inference_steps": STEPS,
    "num_images_per_prompt": "[1, 10000]",
    "batch_size": BATCH,
    "max_nfe": "[1, 20000]",
}


@dataclass(frozen=True)
class Bound:
    lo: float | None
    hi: float | None
    lo_open: bool
    hi_open: bool
    integer: bool  # the values are whole numbers


def parse(text: str) -> Bound:
    """A bound as written in the tables above."""
    if text == "any":
        return Bound(None, None, False, False, False)
    if m := re.fullmatch(r"(>=|>) (\S+)", text):
        lo = _number(m.group(2))
        return Bound(lo, None, m.group(1) == ">", False, isinstance(lo, int))
    m = re.fullmatch(r"([\[(])(\S+), (\S+)([\])])", text)
    assert m, f"unreadable bound {text!r}"
    lo, hi = _number(m.group(2)), _number(m.group(3))
    return Bound(lo, hi, m.group(1) == "(", m.group(4) == ")", isinstance(lo, int) and isinstance(hi, int))


def _number(text: str) -> int | float:
    return float(text) if any(c in text for c in ".e") else int(text)


def lookup(table: dict[str, str], command: str, name: str) -> str | None:
    """The line of flag ``name`` of ``command`` ("eval_fid ref"): the command's own, then its parents', then the
    shared one."""
    words = command.split()
    for n in range(len(words), 0, -1):
        if (line := table.get(f"{' '.join(words[:n])} {name}")) is not None:
            return line
    return table.get(name)


def edges(bound: Bound) -> tuple[list[int | float], list[int | float]]:
    """(values just outside the bound, values at and just inside its ends): what must be refused and accepted."""
    refused: list[int | float] = []
    accepted: list[int | float] = []
    if bound.integer:
        if bound.lo is not None:
            accepted.append(bound.lo + bound.lo_open)
            refused.append(bound.lo - (not bound.lo_open))
        if bound.hi is not None:
            accepted.append(bound.hi - bound.hi_open)
            refused.append(bound.hi + (not bound.hi_open))
        else:
            accepted.append((bound.lo or 0) + 12_345)
        return refused, accepted
    for end, open_, away, toward in ((bound.lo, bound.lo_open, -math.inf, math.inf),
                                     (bound.hi, bound.hi_open, math.inf, -math.inf)):
        if end is None:
            accepted.append(-1e30 if away < 0 else 1e30)
            continue
        end = float(end)
        refused.append(end if open_ else math.nextafter(end, away))
        refused.append(end - 1.0 if away < 0 else end + 1.0)
        accepted.append(math.nextafter(end, toward) if open_ else end)
    return refused, accepted
