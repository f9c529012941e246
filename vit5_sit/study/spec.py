"""A study: arms (a config plus overrides), training seeds, the checkpoints to evaluate and how.

Read from one YAML file (``configs/study/mnist.yaml``)::

    name: mnist-t4
    output_dir: runs/study            # run folders: OUTPUT_DIR/<arm>-s<seed> (checkpoints stay out of git)
    results_dir: docs/study           # tables, json, plot: committed
    steps: [1200, 2400, 3600]         # checkpoints evaluated; each run trains to the last one
    seeds: [0, 1, 2]                  # training seeds of every arm that names none
    eval: {num_samples: 1000, ...}    # `EvalSpec`: one sampler, seeds and reference for every checkpoint,
                                      # at each guidance scale of eval.cfg_scales (e.g. [1.0, 6.0]); with
                                      # eval.guide (e.g. step:800) the guided scales are autoguidance weights
    arms:
      - {name: sit, config: configs/mnist/sit.yaml}
      - {name: no-rope, config: configs/mnist/vit5-nols.yaml, overrides: [model.rope=false], seeds: [0, 1]}
      - {name: small-guide, config: configs/mnist/sit.yaml, guide: "runs/study/tiny-s{seed}"}  # a guide per arm

Every mistake is a `StudyError` naming the key and the fix.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from vit5_sit.common.checks import guide_step, path_problem, shown
from vit5_sit.common.contract import (
    BATCH,
    GUIDANCE,
    MAX_IMAGES,
    MAX_TRAIN_STEPS,
    SEED,
    STEPS,
    Arg,
    Range,
    check_arguments,
)

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Metrics the study computes itself from the evaluation samples (the others are `vit5_sit.eval` metrics).
# digit_accuracy: the share of samples the digit classifier (`vit5_sit.demo.digit_classifier`, as the demo's check)
# reads as the digit that was asked for; for 32x32 MNIST models of 10 classes.
STUDY_METRICS = ("digit_accuracy",)
# Autoguidance's guide in a study (eval.guide, arms[].guide): the guided scales of eval.cfg_scales become weights of
# the model against it (`vit5_sit.eval.compare.CompareSettings.guide`).
GUIDE_FORMS = ("step:N (each run's own checkpoint at step N, which the run must save), auto (each run's kept guide, "
               "train.guide_at), or a model path (a run, checkpoint or model folder; {seed} in it is the training "
               "seed, e.g. runs/study/tiny-s{seed})")


# The contract of a study file: every key it may hold, its type and range, checked when the file is read (a test
# fails for a key the loader accepts without an entry here). 'object' entries are checked by the loader's own code.
STUDY_FIELDS: dict[str, Arg] = {
    "name": Arg("text"),
    "output_dir": Arg("path"),
    "results_dir": Arg("path"),
    "steps": Arg("list", Range(1, MAX_TRAIN_STEPS, why="checkpoint steps, increasing")),
    "seeds": Arg("list", SEED),
    "arms": Arg("object", note="a non-empty list of arms"),
    "arms[].name": Arg("text"),
    "arms[].config": Arg("path"),
    "arms[].overrides": Arg("object", note="KEY=VALUE strings, each checked by vit5_sit.config"),
    "arms[].seeds": Arg("list", SEED),
    "arms[].label": Arg("text"),
    "arms[].guide": Arg("text", note="autoguidance's guide of this arm: GUIDE_FORMS, or none (classifier-free)"),
    "eval": Arg("object", note="the EvalSpec section"),
    "eval.num_samples": Arg("int", Range(1, MAX_IMAGES, why="images per checkpoint; at least what its metrics "
                                                             "need (check_sizes: FID 2, precision/recall 4)")),
    "eval.sample_seed": Arg("int", SEED),
    "eval.noise_seed": Arg("int", SEED),
    "eval.noise_training_seeds": Arg("list", SEED),
    "eval.mode": Arg("text"),
    "eval.method": Arg("text"),
    "eval.steps": Arg("int", STEPS),
    "eval.cfg_scales": Arg("list", GUIDANCE),
    "eval.cfg_scale": Arg("float", GUIDANCE),
    "eval.metrics": Arg("object", note="metric names (parse_metrics), each once"),
    "eval.reference_data": Arg("path"),
    "eval.batch_size": Arg("int", BATCH),
    "eval.guide": Arg("text", note="autoguidance's guide for the guided scales: GUIDE_FORMS"),
    "decision": Arg("object", note="the DecisionSpec section"),
    "decision.reference": Arg("text"),
    "decision.candidates": Arg("object", note="arm names"),
    "decision.baseline": Arg("text"),
    "decision.min_seeds": Arg("int", Range(2, 10**6, why="an sd needs two seeds; the compared arms must have as "
                                                        "many")),
}


class StudyError(ValueError):
    """A study file or setting that cannot be used; the message says which and how to fix it."""


@dataclass(frozen=True)
class Arm:
    name: str                              # folder-safe label, e.g. 'vit5-nols'
    config: str                            # the train.py YAML config of the arm
    overrides: tuple[str, ...] = ()        # dotted overrides on top of it, e.g. ('model.rope=false',)
    seeds: tuple[int, ...] = ()            # training seeds
    label: str = ""                        # table / plot label; '' = name
    guide: str | None = None               # autoguidance's guide of this arm (GUIDE_FORMS or 'none'); None = eval.guide


@dataclass(frozen=True)
class EvalSpec:
    num_samples: int = 1000                # images per checkpoint, classes balanced
    sample_seed: int = 0                   # image i has seed sample_seed + i
    noise_seed: int | None = 100_000       # a second set of sample seeds, for the sampling noise
    noise_training_seeds: tuple[int, ...] = (0,)  # training seeds whose checkpoints get the second set
    mode: str = "ode"
    method: str = "heun"
    steps: int = 15
    cfg_scales: tuple[float, ...] = (1.0,)  # every checkpoint is evaluated at each (1 = unguided); the first is
                                            # the main one (plot, grid names without a suffix)
    metrics: tuple[str, ...] = ("fid", "precision", "recall")  # eval metrics, plus STUDY_METRICS
    reference_data: str = "data/mnist32"   # real images (a class-folder tree) the reference is computed from
    batch_size: int = 125                  # sampling: images per forward
    guide: str | None = None               # autoguidance's guide for the guided scales (GUIDE_FORMS); None = CFG

    @property
    def inception_metrics(self) -> tuple[str, ...]:
        """The metrics `vit5_sit.eval` computes (everything but STUDY_METRICS)."""
        return tuple(m for m in self.metrics if m not in STUDY_METRICS)


@dataclass(frozen=True)
class DecisionSpec:
    """The decision rule, fixed before the results (docs/study/README.md): among ``candidates``, the arm with the
    lowest mean FID at the last step where the ``reference`` arm and another candidate have ``min_seeds``
    seeds wins, if its lead over ``reference`` exceeds the two arms' training-seed sds combined; otherwise
    ``reference`` stays. ``baseline`` (optional) is compared alongside, for information. The report applies
    the rule separately at each guidance scale of ``eval.cfg_scales``."""
    reference: str                         # the arm that stays the default unless beaten (the paper preset)
    candidates: tuple[str, ...]            # arms that may replace it (reference included)
    baseline: str | None = None            # e.g. the vanilla block
    min_seeds: int = 2


@dataclass(frozen=True)
class StudySpec:
    name: str
    output_dir: str
    results_dir: str
    steps: tuple[int, ...]
    arms: tuple[Arm, ...]
    eval: EvalSpec = field(default_factory=EvalSpec)
    source: str = ""                       # the YAML file this came from
    decision: DecisionSpec | None = None   # the pre-registered rule the report applies (none: no decision)

    @property
    def max_steps(self) -> int:
        return self.steps[-1]

    def run_dir(self, arm: Arm, seed: int) -> Path:
        return Path(self.output_dir) / f"{arm.name}-s{seed}"

    def runner_overrides(self, arm: Arm, seed: int, until: int) -> list[str]:
        """The settings the runner owns for (arm, seed) trained to step ``until`` (an arm may not set them)."""
        run = self.run_dir(arm, seed)
        return [f"output_dir={run.parent}", f"name={run.name}", f"train.seed={seed}", f"train.max_steps={until}",
                "log.sample_every=0"]

    def train_overrides(self, arm: Arm, seed: int, until: int) -> list[str]:
        """The config overrides of (arm, seed) trained to step ``until``: the runner's, then the arm's own."""
        return [*self.runner_overrides(arm, seed, until), *arm.overrides]

    def pairs(self) -> list[tuple[Arm, int]]:
        """Every (arm, seed) in the order they are trained: seed by seed, so early seeds finish first."""
        most = max(len(a.seeds) for a in self.arms)
        return [(a, a.seeds[i]) for i in range(most) for a in self.arms if i < len(a.seeds)]

    @property
    def reference_path(self) -> Path:
        return Path(self.output_dir) / "reference.npz"

    def guide_for(self, arm: Arm, seed: int, scale: float) -> str | None:
        """The guide of (arm, training seed) at guidance scale ``scale`` (`vit5_sit.eval.compare.CompareSettings`'s
        form: 'step:N', 'auto' or a path, {seed} filled in), or None: classifier-free guidance, or unguided."""
        guide = self.arm_guide(arm)
        return None if scale == 1 or guide is None else guide.replace("{seed}", str(seed))

    def arm_guide(self, arm: Arm) -> str | None:
        """The guide an arm's guided scales use (GUIDE_FORMS, {seed} not filled in): its own, else eval.guide;
        None: classifier-free guidance."""
        guide = arm.guide if arm.guide is not None else self.eval.guide
        return None if guide == "none" else guide

    @property
    def guide_text(self) -> str | None:
        """How the guided scales guide, for the report: None (classifier-free), the one guide, or 'per arm'."""
        guides = {self.arm_guide(a) for a in self.arms}
        if guides == {None}:
            return None
        return next(iter(guides)) if len(guides) == 1 else "per arm"


def _int_list(key: str, value, minimum: int, field: str | None = None) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise StudyError(f"{key}: expected a non-empty list of integers, got {value!r}")
    bound = STUDY_FIELDS[field or key].range
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise StudyError(f"{key}: {shown(v, quote=True)} is not an integer >= {minimum}")
        if bound is not None and (problem := bound.problem(v)):
            raise StudyError(f"{key}: {shown(v)} {problem}")
    if len(set(value)) != len(value):
        raise StudyError(f"{key}: {value} lists a value twice")
    return tuple(value)


def _known(key: str, raw: dict, allowed: set[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise StudyError(f"{key}: unknown key(s) {', '.join(unknown)}; expected some of {', '.join(sorted(allowed))}")


def _eval_spec(raw: dict) -> EvalSpec:
    if not isinstance(raw, dict):
        raise StudyError(f"eval: expected a mapping, got {raw!r}")
    fields = EvalSpec.__dataclass_fields__
    _known("eval", raw, {*fields, "cfg_scale"})
    values = dict(raw)
    if "cfg_scale" in values:  # one guidance scale (the earlier form of cfg_scales)
        if "cfg_scales" in values:
            raise StudyError("eval: give cfg_scales (a list) or cfg_scale (one value), not both")
        values["cfg_scales"] = [values.pop("cfg_scale")]
    for key in ("metrics", "noise_training_seeds", "cfg_scales"):
        if key in values:
            if not isinstance(values[key], list):
                raise StudyError(f"eval.{key}: expected a list, got {values[key]!r}")
            values[key] = tuple(values[key])
    for key in ("num_samples", "steps", "batch_size"):
        if key in values and not _is_int(values[key], 1):
            raise StudyError(f"eval.{key}: expected a positive integer, got {values[key]!r}")
    for key in ("sample_seed", "noise_seed"):
        if key in values and not _is_int(values[key], 0) and not (key == "noise_seed" and values[key] is None):
            raise StudyError(f"eval.{key}: expected an integer >= 0{' or null (no re-scoring)' * (key == 'noise_seed')}"
                             f", got {values[key]!r}")
    for v in values.get("noise_training_seeds", ()):
        if not _is_int(v, 0):
            raise StudyError(f"eval.noise_training_seeds: {v!r} is not an integer >= 0")
    check_arguments(STUDY_FIELDS, {k: v for k, v in values.items() if k != "cfg_scales"}, StudyError, "eval.")
    from vit5_sit.transport.guidance import GuidanceError, check_guidance_settings

    scales = values.get("cfg_scales", EvalSpec.cfg_scales)
    name = "eval.cfg_scale" if "cfg_scale" in raw else "eval.cfg_scales"
    if not scales:
        raise StudyError(f"{name}: expected at least one guidance scale, e.g. [1.0] (unguided) or [1.0, 6.0]")
    try:
        for scale in scales:
            check_guidance_settings(scale, scale_name=name)
    except GuidanceError as e:
        raise StudyError(str(e)) from None
    values["cfg_scales"] = tuple(float(v) for v in scales)
    if len(set(values["cfg_scales"])) != len(scales):
        raise StudyError(f"{name}: {list(scales)} lists a scale twice")
    for key in ("mode", "method", "reference_data"):
        if key in values and not isinstance(values[key], str):
            raise StudyError(f"eval.{key}: expected a string, got {values[key]!r}")
    if values.get("guide") is not None:
        _check_guide_form("eval.guide", values["guide"], allow_none=False)
    if "reference_data" in values and (problem := path_problem(values["reference_data"])):
        raise StudyError(f"eval.reference_data: {problem}")
    spec = EvalSpec(**values)
    from vit5_sit.eval.evaluation import EvalError, parse_metrics
    from vit5_sit.transport import SamplerConfig

    try:
        SamplerConfig(mode=spec.mode, method=spec.method, steps=spec.steps)
    except ValueError as e:
        raise StudyError(f"eval.mode / eval.method: {e}") from None
    if len(set(spec.metrics)) != len(spec.metrics) or not all(isinstance(m, str) for m in spec.metrics):
        raise StudyError(f"eval.metrics: {list(spec.metrics)} must be metric names, each once")
    try:
        parse_metrics(spec.inception_metrics)
    except EvalError as e:
        raise StudyError(f"eval.metrics: {e}; the study adds {', '.join(STUDY_METRICS)}") from None
    from vit5_sit.eval.evaluation import check_sizes

    try:  # eval.num_samples: enough for every metric asked for (FID needs 2 images, precision/recall 4)
        check_sizes(spec.inception_metrics, spec.num_samples, None)
    except EvalError as e:
        raise StudyError(f"eval.num_samples={spec.num_samples}: {e}") from None
    from vit5_sit.transport.rng import SeedError, check_seeds

    try:  # every sample seed of both sets is a valid seed (the one rule of sample.py and compare)
        check_seeds(spec.sample_seed, spec.num_samples, "eval.sample_seed")
        if spec.noise_seed is not None:
            check_seeds(spec.noise_seed, spec.num_samples, "eval.noise_seed")
    except SeedError as e:
        raise StudyError(str(e)) from None
    if "digit_accuracy" in spec.metrics:
        from vit5_sit.demo.digit_classifier import CLASSIFIER

        if not (CLASSIFIER / "model.safetensors").is_file():
            raise StudyError(f"eval.metrics: digit_accuracy needs the digit classifier, and "
                             f"{CLASSIFIER / 'model.safetensors'} is missing; python -m vit5_sit.demo.digit_classifier "
                             "train makes it")
    if spec.noise_seed is not None and abs(spec.noise_seed - spec.sample_seed) < spec.num_samples:
        raise StudyError(f"eval.noise_seed: {spec.noise_seed} gives sample seeds {spec.noise_seed}.."
                         f"{spec.noise_seed + spec.num_samples - 1}, which overlap the main set ({spec.sample_seed}.."
                         f"{spec.sample_seed + spec.num_samples - 1}): the sampling noise would be underestimated; "
                         f"use e.g. noise_seed: {spec.sample_seed + 100 * spec.num_samples}")
    return spec


def _check_guide_form(key: str, value, allow_none: bool) -> None:
    """A guide of a study file: GUIDE_FORMS (and 'none' for an arm: classifier-free for that arm)."""
    if not isinstance(value, str) or not value.strip():
        raise StudyError(f"{key}: {shown(value, quote=True)}: expected {GUIDE_FORMS}"
                         f"{', or none (classifier-free)' * allow_none}")
    if value == "none":
        if not allow_none:
            raise StudyError(f"{key}: none: leave {key} out for classifier-free guidance")
        return
    try:
        if guide_step(value) is not None:
            return
    except ValueError as e:
        raise StudyError(f"{key}: {e}") from None
    if value == "auto":
        return
    if (problem := path_problem(value.replace("{seed}", "0"))) is not None:
        raise StudyError(f"{key}: {problem}")
    if re.search(r"\{(?!seed\})", value):
        raise StudyError(f"{key}: {value!r}: the only placeholder a guide path takes is {{seed}}")


def _is_int(value, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


# Why the runner owns each setting it gives every (arm, seed), and what to change instead.
_OWNED_WHY = {
    "train.seed": "the runner gives each run its training seed; list them in the arm's seeds: instead",
    "name": "the runner names each run's folder <arm>-s<seed>; rename the arm instead",
    "output_dir": "the runner trains in the study's output_dir; set output_dir: in the study file instead",
    "train.max_steps": "the runner trains to the study's last step (or --until); change the study's steps: instead",
    "log.sample_every": "the runner turns off the training grids (the study draws its own samples)",
}


def _check_owned_keys(key: str, spec: StudySpec, arm: Arm) -> None:
    """An arm's override may not set what the runner sets per (arm, seed): with `train.seed=7` every "seed" of
    the arm trained with seed 7, with `name=` two seeds shared one folder. A section (`train=...`) replaces
    its keys too."""
    owned = [o.partition("=")[0] for o in spec.runner_overrides(arm, arm.seeds[0], spec.max_steps)]
    for override in arm.overrides:
        given = override.partition("=")[0].strip()
        hit = next((k for k in owned if k == given or k.startswith(given + ".")), None)
        if hit is not None:
            section = f" (it replaces the {given} section, {hit} included)" if hit != given else ""
            raise StudyError(f"{key} ({arm.name}): override {shown(override, quote=True)} sets {hit}, which the study "
                             f"runner sets for each (arm, seed){section}: {_OWNED_WHY.get(hit, 'remove it')}")


def _check_arm_config(key: str, spec: StudySpec, arm: Arm) -> None:
    """The arm's config with every override must load, and save a checkpoint at every evaluated step and keep
    it: found now, not when the run fails or the evaluation finds nothing after hours of training."""
    from vit5_sit.config import ConfigError, load_config
    from vit5_sit.transport.guidance import GuidanceError, check_guidance

    _check_owned_keys(key, spec, arm)
    try:
        cfg = load_config(arm.config, spec.train_overrides(arm, arm.seeds[0], spec.max_steps))
    except ConfigError as e:
        raise StudyError(f"{key} ({arm.name}): {e}") from None
    model = cfg.model_config()
    if model.mean_flow != (spec.eval.mode == "meanflow"):
        kind, fix = (("a MeanFlow model", "eval.mode: meanflow") if model.mean_flow
                     else ("a flow model", "eval.mode: ode or sde"))
        raise StudyError(f"eval.mode {spec.eval.mode} ({key}, {arm.name}): the arm trains {kind}, which that sampler "
                         f"cannot sample; use {fix} (one study evaluates one kind of model)")
    for scale in spec.eval.cfg_scales:
        try:
            check_guidance(scale, model.class_dropout_prob)
        except GuidanceError as e:
            raise StudyError(f"eval.cfg_scales ({key}, {arm.name}): {e}") from None
    if "digit_accuracy" in spec.eval.metrics and (
            cfg.data.kind == "latents" or cfg.data.resolution != 32 or model.num_classes != 10):
        raise StudyError(f"eval.metrics: digit_accuracy reads 32x32 digits of 10 classes (the MNIST digit "
                         f"classifier), and {key} ({arm.name}) makes {cfg.data.resolution}x{cfg.data.resolution} "
                         f"{'latent ' * (cfg.data.kind == 'latents')}images of {model.num_classes} classes; "
                         "remove digit_accuracy from eval.metrics")
    every, keep = cfg.train.ckpt_every, cfg.train.keep_last
    guide = spec.arm_guide(arm)
    where = f"{key}.guide" if arm.guide is not None else f"eval.guide ({key}, {arm.name})"
    if guide is not None:
        if all(scale == 1 for scale in spec.eval.cfg_scales):
            raise StudyError(f"{where}: {guide}: eval.cfg_scales ({list(spec.eval.cfg_scales)}) has no guided scale "
                             "for autoguidance to weigh; add one, e.g. cfg_scales: [1.0, 2.0]")
        if model.mean_flow:
            raise StudyError(f"{where}: {guide}: a MeanFlow model's guidance is trained in or a network input; "
                             "autoguidance is for flow models: leave the guide out")
        step = guide_step(guide)
        if step is not None and (step > spec.max_steps or (step % every and step != spec.max_steps)):
            raise StudyError(f"{where}: {guide}: the run saves no checkpoint at step {step} (train.ckpt_every="
                             f"{every}, last step {spec.max_steps}); guide with a step it saves, e.g. step:{every}")
    missed = [s for s in spec.steps if s % every and s != spec.max_steps]
    if missed:
        raise StudyError(f"{key} ({arm.name}): train.ckpt_every={every} saves no checkpoint at step "
                         f"{missed[0]}, which the study evaluates; use a ckpt_every that divides every step "
                         f"({', '.join(map(str, spec.steps))}), e.g. overrides: "
                         f"[train.ckpt_every={math.gcd(*spec.steps)}]")
    if keep != 0:
        raise StudyError(f"{key} ({arm.name}): train.keep_last={keep} deletes older checkpoints, and the study "
                         f"evaluates the ones at steps {', '.join(map(str, spec.steps))} (an interrupted run saves "
                         "one more); add train.keep_last=0 (keep all) to the arm's overrides or its config")


def load_study(path: str | Path) -> StudySpec:
    """Read and check a study file; see the module docstring for the layout."""
    from vit5_sit.config import ConfigError, read_yaml_file

    path = Path(path)
    try:
        raw = read_yaml_file(path, "study file", "give a study YAML file (configs/study/...)")
    except ConfigError as e:
        raise StudyError(str(e)) from None
    if not isinstance(raw, dict) or not raw:
        raise StudyError(f"{path}: expected a mapping with name, steps, seeds, arms")
    _known(str(path), raw, {"name", "output_dir", "results_dir", "steps", "seeds", "eval", "arms", "decision"})
    steps = _int_list("steps", raw.get("steps"), 1)
    if list(steps) != sorted(steps):
        raise StudyError(f"steps: {list(steps)} must be increasing")
    default_seeds = _int_list("seeds", raw.get("seeds", [0]), 0)
    arms_raw = raw.get("arms")
    if not isinstance(arms_raw, list) or not arms_raw:
        raise StudyError("arms: expected a non-empty list of {name, config, overrides, seeds}")
    arms, names = [], set()
    for i, a in enumerate(arms_raw):
        key = f"arms[{i}]"
        if not isinstance(a, dict):
            raise StudyError(f"{key}: expected a mapping with name and config, got {a!r}")
        _known(key, a, {"name", "config", "overrides", "seeds", "label", "guide"})
        name = a.get("name")
        if not isinstance(name, str) or not ARM_NAME.match(name):
            raise StudyError(f"{key}.name: {name!r} must be letters, digits, '.', '_' or '-' (a folder name)")
        if name in names:
            raise StudyError(f"{key}.name: arm {name!r} is listed twice")
        names.add(name)
        if problem := path_problem(f"{name}-s0"):
            raise StudyError(f"{key}.name: the run folder <name>-s<seed> is {problem}")
        config = a.get("config")
        if isinstance(config, str) and (problem := path_problem(config)):
            raise StudyError(f"{key}.config: {problem}")
        if not isinstance(config, str) or not Path(config).is_file():
            where = "" if not isinstance(config, str) or Path(config).is_absolute() else (
                f" (relative paths are read from the current folder, {Path.cwd()}: run the study from the "
                "project root, where configs/ is)")
            raise StudyError(f"{key}.config: {config!r} is not a config file{where}")
        overrides = a.get("overrides", [])
        if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
            raise StudyError(f"{key}.overrides: expected a list of 'key=value' strings, got {overrides!r}")
        seeds = _int_list(f"{key}.seeds", a["seeds"], 0, "arms[].seeds") if "seeds" in a else default_seeds
        label = a.get("label", "")
        if not isinstance(label, (str, int, float)) or isinstance(label, bool):
            raise StudyError(f"{key}.label: expected a short text, got {label!r}")
        guide = a.get("guide")
        if guide is not None:
            _check_guide_form(f"{key}.guide", guide, allow_none=True)
        arms.append(Arm(name, config, tuple(overrides), seeds, str(label) or name, guide))
    texts = {}
    for key, default in (("name", path.stem), ("output_dir", "runs/study"), ("results_dir", "docs/study")):
        texts[key] = raw.get(key, default)
        if not isinstance(texts[key], str) or not texts[key].strip():
            raise StudyError(f"{key}: expected a non-empty string, got {shown(texts[key], quote=True)}")
        if key != "name" and (problem := path_problem(texts[key])):
            raise StudyError(f"{key}: {problem}")
    spec = StudySpec(
        **texts, steps=steps, arms=tuple(arms), eval=_eval_spec(raw.get("eval", {})), source=str(path),
        decision=_decision_spec(raw.get("decision"), names),
    )
    if spec.decision is not None and "fid" not in spec.eval.metrics:
        raise StudyError(f"decision: the rule compares mean FID, and eval.metrics ({', '.join(spec.eval.metrics)}) "
                         "has no fid; add fid")
    if spec.decision is not None:  # the rule needs min_seeds seeds of the reference and of another candidate
        seeds = {a.name: len(a.seeds) for a in spec.arms}
        d = spec.decision
        short = [n for n in (d.reference,) if seeds[n] < d.min_seeds]
        if short or not any(seeds[c] >= d.min_seeds for c in d.candidates if c != d.reference):
            which = f"the reference {d.reference!r} has {seeds[d.reference]}" if short else \
                "no candidate besides the reference has as many"
            raise StudyError(f"decision.min_seeds={d.min_seeds}: {which} training seed(s), so the rule could never "
                             "decide; lower min_seeds or give the arms more seeds")
    trained = sorted({s for a in spec.arms for s in a.seeds})
    for seed in spec.eval.noise_training_seeds:
        if seed not in trained:
            raise StudyError(f"eval.noise_training_seeds: {seed} is not a training seed of any arm (seeds: "
                             f"{', '.join(map(str, trained))}); the sampling noise would never be measured")
    for i, arm in enumerate(spec.arms):
        _check_arm_config(f"arms[{i}]", spec, arm)
    return spec


def _decision_spec(raw, names: set[str]) -> DecisionSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise StudyError(f"decision: expected a mapping with reference and candidates, got {raw!r}")
    _known("decision", raw, {"reference", "candidates", "baseline", "min_seeds"})
    listed = ", ".join(sorted(names))
    ref, base, cands = raw.get("reference"), raw.get("baseline"), raw.get("candidates")
    if not isinstance(cands, list) or not cands:
        raise StudyError("decision.candidates: expected a non-empty list of arm names")
    for key, arm in [("reference", ref), ("baseline", base), *(("candidates", c) for c in cands)]:
        if (arm is not None or key != "baseline") and arm not in names:
            raise StudyError(f"decision.{key}: {arm!r} is not an arm of this study (arms: {listed})")
    min_seeds = raw.get("min_seeds", 2)
    if not isinstance(min_seeds, int) or isinstance(min_seeds, bool) or min_seeds < 2:
        raise StudyError(f"decision.min_seeds: {min_seeds!r} must be an integer >= 2 (an sd needs two seeds)")
    return DecisionSpec(reference=ref, candidates=tuple(dict.fromkeys([ref, *cands])), baseline=base,
                        min_seeds=min_seeds)
