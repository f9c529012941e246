"""Train and evaluate every (arm, seed) of a study; each part resumes, so the command can be re-run for days.

Training runs `train.py --resume auto` in a subprocess per (arm, seed) (``jobs`` at a time, ``threads`` each),
logging to ``OUTPUT_DIR/<arm>-s<seed>.log``; a run whose checkpoint at the target step verifies is done and
not started again. Evaluation samples every evaluated checkpoint with the same sampler and seeds
(`vit5_sit.eval.compare.evaluate_checkpoint`, cached under each run), against one reference computed once
from the real images.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from vit5_sit.common.interrupt import STOP_SIGNALS, sigint_at_default

from .spec import Arm, StudyError, StudySpec


def _checkpoints(run: Path) -> dict[int, Path]:
    """Verified checkpoints of a run folder by step (size check only: the hash is checked on use)."""
    from vit5_sit.train.checkpoint import CheckpointError, list_checkpoints, verify_checkpoint

    found = {}
    for ckpt in list_checkpoints(run):
        try:
            verify_checkpoint(ckpt.path, check_hash=False)
        except CheckpointError:
            continue
        found[ckpt.step] = ckpt.path
    return found


def trained_step(spec: StudySpec, arm: Arm, seed: int) -> int:
    """The newest verified checkpoint's step of (arm, seed); 0 if none."""
    return max(_checkpoints(spec.run_dir(arm, seed)), default=0)


def train_command(spec: StudySpec, arm: Arm, seed: int, until: int) -> list[str]:
    return [sys.executable, "-m", "vit5_sit.cli.train", "--config", arm.config,
            *spec.train_overrides(arm, seed, until), "--resume", "auto"]


def select_pairs(spec: StudySpec, arms: list[str] | None = None,
                 seeds: list[int] | None = None) -> list[tuple[Arm, int]]:
    """The study's (arm, seed) pairs, in training order, limited to ``arms`` / ``seeds`` when given."""
    names = [a.name for a in spec.arms]
    for name in arms or []:
        if name not in names:
            raise StudyError(f"--arms {name!r}: no such arm in {spec.source}; arms: {', '.join(names)}")
    known = sorted({s for a in spec.arms for s in a.seeds})
    for seed in seeds or []:
        if seed not in known:
            raise StudyError(f"--seeds {seed}: no arm of {spec.source} has that seed; seeds: "
                             f"{', '.join(map(str, known))}")
    return [(a, s) for a, s in spec.pairs() if (not arms or a.name in arms) and (seeds is None or s in seeds)]


def results_file(spec: StudySpec) -> Path:
    """The committed study.json of the study's results folder (it may not exist yet)."""
    return Path(spec.results_dir) / "study.json"


def scored_steps(spec: StudySpec, arm: Arm, seed: int, saved: list[dict],
                 cfg_scale: float | None = None) -> list[int]:
    """The study steps at which (arm, seed) is scored with the main sample seed among the ``saved`` rows, at
    ``cfg_scale`` or (None) at every guidance scale of the study: a step scored unguided only still needs its
    checkpoint for the guided evaluation. (The sampling-noise re-scoring is optional: it does not make a run
    worth training again.)"""
    from .report import row_cfg

    scales = spec.eval.cfg_scales if cfg_scale is None else (cfg_scale,)
    have = {(r["step"], row_cfg(spec, r)) for r in saved
            if r["arm"] == arm.name and r["seed"] == seed and r["sample_seed"] == spec.eval.sample_seed}
    return [step for step in spec.steps if all((step, c) in have for c in scales)]


def train_all(spec: StudySpec, *, jobs: int = 1, threads: int = 1, until: int | None = None,
              arms: list[str] | None = None, seeds: list[int] | None = None, retrain_scored: bool = False,
              results: Path | None = None, log=print, poll_s: float = 5.0) -> list[tuple[str, int, int]]:
    """Train every (arm, seed) to ``until`` (default: the last evaluated step), ``jobs`` at a time.

    ``arms`` / ``seeds`` limit training to part of the study (the report still covers all of it).
    A run whose every evaluated step up to ``until`` is already scored in the committed study.json
    (``results``; default: the study's results folder) is done too, even when its folder is gone (a new
    machine): it is not trained again from step 0 unless ``retrain_scored``.
    Returns (arm, seed, exit code) of the runs started. A failed run is reported and the others go on.
    """
    from .report import saved_rows

    check_arguments(spec, arms, seeds, until=until)
    until = until or spec.max_steps
    chosen = select_pairs(spec, arms, seeds)
    results = results or results_file(spec)
    saved = [] if retrain_scored else saved_rows(spec, results, log=lambda *_: None)
    wanted = [step for step in spec.steps if step <= until]
    pending, scored = [], []
    for a, s in chosen:
        if trained_step(spec, a, s) >= until:
            continue
        if wanted and set(wanted) <= set(scored_steps(spec, a, s, saved)):
            scored.append(spec.run_dir(a, s).name)
            continue
        pending.append((a, s))
    done = len(chosen) - len(pending)
    log(f"study {spec.name}: {done} of {len(chosen)} runs at step {until} or beyond; {len(pending)} to train "
        f"({jobs} at a time, {threads} thread(s) each)")
    if scored:
        log(f"  scored in {results} up to step {until} (their run folders are not here), not trained "
            f"again: {', '.join(scored)} (--retrain-scored trains them from step 0)")
    Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    running: list[tuple[Arm, int, subprocess.Popen, object]] = []
    finished = []
    previous = _stop_signals_as_interrupt()
    try:
        while pending or running:
            while pending and len(running) < jobs:
                arm, seed = pending.pop(0)
                run = spec.run_dir(arm, seed)
                logf = open(run.with_name(run.name + ".log"), "ab")  # noqa: SIM115 - closed when the run ends
                log(f"  start {run.name} (from step {trained_step(spec, arm, seed)} to {until}); log: {logf.name}")
                # Its own process group: a Ctrl-C at the terminal reaches only this runner, which passes one
                # stop request on to each run (`_stop_runs`), so no run gets the second, stop-at-once signal.
                proc = subprocess.Popen(train_command(spec, arm, seed, until), stdout=logf,
                                        stderr=subprocess.STDOUT, env=env, cwd=Path.cwd(), process_group=0,
                                        preexec_fn=sigint_at_default)
                running.append((arm, seed, proc, logf))
            time.sleep(poll_s)
            for item in list(running):
                arm, seed, proc, logf = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                logf.close()
                finished.append((arm.name, seed, proc.returncode))
                state = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}; see {logf.name})"
                log(f"  {spec.run_dir(arm, seed).name}: {state}")
    finally:
        try:
            _stop_runs([(spec.run_dir(arm, seed).name, proc) for arm, seed, proc, _ in running], log)
        finally:
            for *_, logf in running:
                logf.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return finished


def _stop_signals_as_interrupt() -> dict:
    """On the main thread, make Ctrl-C and SIGTERM (``kill``, a scheduler's stop) stop the runner, so its runs
    are stopped gracefully too; returns the previous handlers (empty where signals cannot be set).

    SIGINT is set explicitly rather than left to Python: a runner started in the background (``cmd &``,
    ``nohup``) inherits SIGINT *ignored*, and ``kill -INT`` would then do nothing while its trainings go on.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        raise KeyboardInterrupt

    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}


def _stop_runs(procs: list[tuple[str, subprocess.Popen]], log=print) -> None:
    """Interrupted: ask every running training to stop the way Ctrl-C does (it finishes its step, saves a
    checkpoint and exits), then wait for them; a second Ctrl-C while waiting stops them at once."""
    alive = [(name, proc) for name, proc in procs if proc.poll() is None]
    if not alive:
        return
    log(f"  stopping {', '.join(name for name, _ in alive)} after the current step (a checkpoint is saved); "
        "Ctrl-C again to stop at once")
    for _, proc in alive:
        proc.send_signal(signal.SIGINT)
    try:
        for _, proc in alive:
            proc.wait()
    except KeyboardInterrupt:
        for _, proc in alive:
            if proc.poll() is None:
                proc.kill()  # the newest finished checkpoint stays; --resume auto continues from it
                proc.wait()
        raise


def ensure_reference(spec: StudySpec, log=print) -> Path:
    """The reference statistics and features of the real images, computed once."""
    from vit5_sit.eval import compute_reference

    path = spec.reference_path
    if not path.is_file():
        check_reference_source(spec)
        data = Path(spec.eval.reference_data)
        log(f"reference: Inception features of every image in {data} -> {path} (once)")
        compute_reference(data, path, metrics=spec.eval.inception_metrics)
    return path


def check_reference_source(spec: StudySpec) -> None:
    """The reference can be made (it exists, or its real images do): checked before `run` trains for hours."""
    data = Path(spec.eval.reference_data)
    if not spec.reference_path.is_file() and not data.is_dir():
        raise StudyError(f"eval.reference_data: {data} is not a folder of real images (and {spec.reference_path} "
                         f"is not made yet); for MNIST run `python -m vit5_sit.data mnist {data} --resolution 32` "
                         "first")


def _settings(spec: StudySpec, sample_seed: int, cfg_scale: float, guide: str | None = None):
    from vit5_sit.eval.compare import CompareSettings

    e = spec.eval
    return CompareSettings(num_samples=e.num_samples, seed=sample_seed, mode=e.mode, method=e.method,
                           steps=e.steps, cfg_scale=cfg_scale, metrics=e.inception_metrics, batch_size=e.batch_size,
                           guide=guide)


def check_steps(spec: StudySpec, steps: list[int] | None, until: int | None = None) -> None:
    """``--steps`` are steps the study evaluates (and, with ``--until``, steps that training reaches)."""
    for step in steps or []:
        if step not in spec.steps:
            raise StudyError(f"--steps {step}: not a step the study evaluates; steps: "
                             f"{', '.join(map(str, spec.steps))}")
        if until is not None and step > until:
            raise StudyError(f"--steps {step}: beyond --until {until}, so never trained by this command; "
                             f"evaluate steps up to {until}")


def check_arguments(spec: StudySpec, arms: list[str] | None = None, seeds: list[int] | None = None,
                    steps: list[int] | None = None, until: int | None = None) -> None:
    """Every choice of a study command checked against the study at once, before any work (a reference of
    5,000 images, a training, a folder): a bad one is a `StudyError` naming the flag and the value."""
    if until is not None and until > spec.max_steps:
        raise StudyError(f"--until {until}: beyond the study's last step {spec.max_steps} (raise steps in "
                         f"{spec.source} instead)")
    check_steps(spec, steps, until)
    if not select_pairs(spec, arms, seeds):  # each name known, but no arm has the seeds asked for
        have = "; ".join(f"{a.name}: {', '.join(map(str, a.seeds))}" for a in spec.arms if a.name in arms)
        raise StudyError(f"--arms {','.join(arms)} --seeds {','.join(map(str, seeds))}: no run of the study has "
                         f"them (seeds of those arms: {have})")


def evaluation_plan(spec: StudySpec, noise: bool = True, arms: list[str] | None = None, seeds: list[int] | None = None,
                    steps: list[int] | None = None) -> list[tuple[Arm, int, int, int, float]]:
    """(arm, training seed, step, sample seed, cfg scale) of every evaluation the study asks for: each checkpoint
    at each guidance scale of ``eval.cfg_scales`` (``noise=False``: without the sampling-noise re-scoring with the
    second sample seed; ``arms`` / ``seeds`` / ``steps``: only those)."""
    check_steps(spec, steps)
    plan = []
    for arm, seed in select_pairs(spec, arms, seeds):
        sample_seeds = [spec.eval.sample_seed]
        if noise and spec.eval.noise_seed is not None and seed in spec.eval.noise_training_seeds:
            sample_seeds.append(spec.eval.noise_seed)
        plan += [(arm, seed, step, s, c) for step in spec.steps for c in spec.eval.cfg_scales for s in sample_seeds
                 if not steps or step in steps]
    return plan


def digit_accuracy(samples: str | Path, cached_only: bool = False) -> float | None:
    """The share of the evaluation samples that the digit classifier (`vit5_sit.demo.digit_classifier`, the demo's
    check) reads as the digit asked for; cached beside the samples, keyed by the samples' manifest and the
    classifier's weights. ``cached_only``: None unless cached."""
    import hashlib
    import json

    import numpy as np

    from vit5_sit.common.contract import metric_problem
    from vit5_sit.common.utils import atomic_write_text
    from vit5_sit.demo.digit_classifier import CLASSIFIER, classify, load_classifier
    from vit5_sit.sampling.generate import manifest_path

    samples = Path(samples)
    try:
        weights = (CLASSIFIER / "model.safetensors").read_bytes()
    except OSError as e:
        raise StudyError(f"eval.metrics: digit_accuracy needs the digit classifier, and "
                         f"{CLASSIFIER / 'model.safetensors'} cannot be read ({e.strerror or e}); "
                         "python -m vit5_sit.demo.digit_classifier train makes it") from None
    key = {"samples": hashlib.sha256(manifest_path(samples).read_bytes()).hexdigest(),
           "classifier": hashlib.sha256(weights).hexdigest()}
    path = samples.with_name(f"{samples.stem}.digits-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:10]}"
                             ".json")
    try:
        cached = json.loads(path.read_bytes()) if path.is_file() else None
    except (OSError, ValueError):  # damaged: computed again
        cached = None
    if isinstance(cached, dict) and cached.get("key") == key and isinstance(cached.get("digit_accuracy"), float) \
            and not metric_problem("digit_accuracy", cached["digit_accuracy"]):  # outside [0, 1]: damaged
        return cached["digit_accuracy"]
    if cached_only:
        return None
    with np.load(samples) as data:
        images, labels = data["arr_0"], data["arr_1"]
    if images.shape[1:3] != (32, 32):
        raise StudyError(f"{samples}: digit_accuracy needs 32x32 digits, the samples are "
                         f"{images.shape[1]}x{images.shape[2]}; remove digit_accuracy from eval.metrics")
    try:
        classifier = load_classifier(CLASSIFIER)
    except (OSError, ValueError) as e:  # a damaged classifier file: one line, not a traceback
        raise StudyError(f"eval.metrics: digit_accuracy: {e}") from None
    accuracy = float(np.mean(classify(images, classifier) == labels))
    atomic_write_text(path, json.dumps({"key": key, "digit_accuracy": accuracy}, indent=1))
    return accuracy


def evaluate_all(spec: StudySpec, *, device: str | None = None, progress: bool = True, noise: bool = True,
                 cached_only: bool = False, arms: list[str] | None = None, seeds: list[int] | None = None,
                 steps: list[int] | None = None, log=print, failures: list[str] | None = None) -> list[dict]:
    """Evaluate every study checkpoint that exists (cached: nothing is sampled or scored twice).

    ``noise=False`` leaves out the sampling-noise evaluations (the report then says they are pending);
    ``cached_only`` computes nothing: the rows of the evaluations already done (a report while others run).
    ``arms`` / ``seeds`` / ``steps`` evaluate only those (e.g. one step of every arm first).
    A checkpoint that cannot be loaded (damaged weights, a bad config.yaml) is skipped with a warning, and
    appended to ``failures``: the others are still evaluated, and the report shows it as missing.

    Returns one row per evaluation: arm, seed, step, sample_seed, cfg_scale and the metrics (with
    ``digit_accuracy`` when the study asks for it).
    """
    import torch

    from vit5_sit.common.checks import ModelLoadError
    from vit5_sit.config import ConfigError, load_config
    from vit5_sit.eval.compare import CompareError, Evaluator, evaluate_checkpoint
    from vit5_sit.eval.evaluation import parse_metrics
    from vit5_sit.train.checkpoint import Checkpoint

    plan = evaluation_plan(spec, noise, arms, seeds, steps)  # bad names and steps refused before any work
    if cached_only and not spec.reference_path.is_file():
        raise StudyError(f"nothing is evaluated yet ({spec.reference_path} does not exist): run `eval` first")
    reference = spec.reference_path if cached_only else ensure_reference(spec, log)
    metrics = parse_metrics(spec.eval.inception_metrics)
    evaluator = Evaluator(reference, metrics, None, device, 64, progress)
    device = torch.device(device or "cpu")
    rows = []
    for arm, seed, step, sample_seed, cfg_scale in plan:
        run = spec.run_dir(arm, seed)
        path = _checkpoints(run).get(step)
        if path is None:
            continue
        guide = spec.guide_for(arm, seed, cfg_scale)
        where = f"{run.name} step {step}" + (f" cfg {cfg_scale:g}" if len(spec.eval.cfg_scales) > 1 else "") + (
            f" guide {guide}" if guide is not None else "")
        try:
            cfg = load_config(run / "config.yaml")
            row = evaluate_checkpoint(run, run.name, cfg, Checkpoint(step, path),
                                      _settings(spec, sample_seed, cfg_scale, guide), evaluator, device=device,
                                      progress=progress, log=log, cached_only=cached_only)
        except (ConfigError, ModelLoadError, CompareError) as e:
            log(f"warning: {where} not evaluated: {e}")
            if failures is not None:
                failures.append(where)
            continue
        if row is None:
            continue
        if "digit_accuracy" in spec.eval.metrics:
            accuracy = digit_accuracy(row["samples"], cached_only=cached_only)
            if accuracy is not None:
                row["digit_accuracy"] = accuracy
                if not cached_only:
                    log(f"  digit accuracy {accuracy:.3f}")
        rows.append({"arm": arm.name, "seed": seed, "step": step, "sample_seed": sample_seed, "cfg_scale": cfg_scale,
                     **({"guide": guide} if guide is not None else {}),
                     **{k: v for k, v in row.items() if k not in ("run", "run_dir", "guide")}})
    return rows


def status(spec: StudySpec, arms: list[str] | None = None, seeds: list[int] | None = None) -> list[dict]:
    """Per (arm, seed), limited to ``arms`` / ``seeds`` when given: the newest verified step, which evaluated
    steps exist as checkpoints, and which are scored in the committed study.json."""
    from .report import saved_rows

    saved = saved_rows(spec, results_file(spec), log=lambda *_: None)
    out = []
    for arm, seed in select_pairs(spec, arms, seeds):
        ckpts = _checkpoints(spec.run_dir(arm, seed))
        out.append({"arm": arm.name, "seed": seed, "step": max(ckpts, default=0),
                    "eval_steps": [s for s in spec.steps if s in ckpts],
                    "scored_steps": scored_steps(spec, arm, seed, saved),
                    "scored_by_cfg": {c: scored_steps(spec, arm, seed, saved, c) for c in spec.eval.cfg_scales}})
    return out


def spec_summary(spec: StudySpec) -> dict:
    return {"name": spec.name, "steps": list(spec.steps), "eval": dataclasses.asdict(spec.eval),
            "arms": [dataclasses.asdict(a) for a in spec.arms]}
