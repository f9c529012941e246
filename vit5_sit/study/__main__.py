"""Multi-arm, multi-seed studies: train every (arm, seed), evaluate every checkpoint alike, report mean ± sd.

    python -m vit5_sit.study run configs/study/mnist.yaml --jobs 2        # train, evaluate, write docs/study
    python -m vit5_sit.study train configs/study/mnist.yaml --until 1200  # train everything to step 1,200 first
    python -m vit5_sit.study eval configs/study/mnist.yaml                # evaluate what exists, write the report
    python -m vit5_sit.study status configs/study/mnist.yaml              # which (arm, seed) are at which step
    python -m vit5_sit.study report configs/study/mnist.yaml              # the report from what is evaluated

Every part resumes: training runs `train.py --resume auto`, samples and metrics are cached under each run, so
the same command re-run redoes nothing that is done and continues what is not. Ctrl-C (or SIGTERM) asks
every running training to stop after its current step with a checkpoint (a second Ctrl-C stops them at once);
run the command again to continue.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit5_sit.common.checks import (
    UsageError,
    integer,
    parse_device,
    path_text,
    positive_int,
    storage_failure,
    writable_folder,
)
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import Interrupted, quiet_when_piped, sigterm_as_ctrl_c

from .spec import StudyError, load_study


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give arm names separated by commas, e.g. sit,vit5")
    return names


def _seeds(text: str) -> list[int]:
    try:
        return [integer(n) for n in _names(text)]  # ASCII whole numbers ('٣' is no seed here)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole-number seeds separated by commas, e.g. 0,1") from None


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m vit5_sit.study", command="study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "train", "eval", "report", "status"))
    p.add_argument("spec", type=path_text, help="study YAML file, e.g. configs/study/mnist.yaml")
    p.add_argument("--jobs", type=positive_int, default=1, help="training runs at a time (default: 1)")
    p.add_argument("--threads", type=positive_int, default=1, help="CPU threads per training run (default: 1)")
    p.add_argument("--until", type=positive_int, default=None,
                   help="train only to this step (default: the study's last step); resume later for the rest")
    p.add_argument("--arms", type=_names, default=None,
                   help="train / evaluate only these arms, comma-separated (default: all), e.g. sit,vit5")
    p.add_argument("--seeds", type=_seeds, default=None,
                   help="train / evaluate only these training seeds, comma-separated (default: all), e.g. 0,1")
    p.add_argument("--steps", type=_seeds, default=None,
                   help="evaluate only these checkpoints, comma-separated, e.g. 1200 (the report covers all "
                        "that are scored)")
    p.add_argument("--no-noise", action="store_true",
                   help="evaluate with the main sample seed only; the sampling-noise re-scoring is left for later")
    p.add_argument("--retrain-scored", action="store_true",
                   help="train (from step 0) the runs whose scores are saved in study.json but whose folders are "
                        "gone; by default they count as done")
    p.add_argument("--device", default=None, help="device for evaluation (default: cpu)")
    p.add_argument("--out", type=path_text, default=None, help="results folder (default: the study's results_dir)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


# Which commands each optional flag acts on: a flag given to another command would be silently ignored
# (`train --steps 1200` trained to the study's last step), so it is refused instead.
_FLAG_COMMANDS = {
    "jobs": ("run", "train"), "threads": ("run", "train"), "until": ("run", "train"),
    "retrain_scored": ("run", "train"),
    "arms": ("run", "train", "eval", "status"), "seeds": ("run", "train", "eval", "status"),
    "steps": ("run", "eval"), "no_noise": ("run", "eval"), "device": ("run", "eval"),
    "out": ("run", "eval", "report"),
}
_HINTS = {"steps": " (to train only to a step, use --until)", "until": " (to evaluate one step, use eval --steps)"}


def _check_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for dest, commands in _FLAG_COMMANDS.items():
        if getattr(args, dest) not in (None, False, p.get_default(dest)) and args.command not in commands:
            flag = "--" + dest.replace("_", "-")
            p.error(f"{flag} does nothing for '{args.command}'; it is for: {', '.join(commands)}"
                    f"{_HINTS.get(dest, '')}")


@quiet_when_piped
def main(argv: list[str] | None = None) -> int:
    try:
        with sigterm_as_ctrl_c():  # from the start; evaluation too (training sets its own handlers for its runs)
            p = parser()
            args = p.parse_args(argv)
            _check_flags(p, args)
            return _run(args)
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted):  # Interrupted: inside an evaluation's sampling, its images kept
        print("interrupted; run the same command again to continue (finished checkpoints and evaluations are "
              "kept)", file=sys.stderr)
        return 130
    except OSError as e:  # a full disk, a read-only folder
        return storage_failure(e, "finished checkpoints and evaluations are kept: run the same command again")


def _run(args: argparse.Namespace) -> int:
    from . import runner
    from .report import saved_rows, write_report

    spec = load_study(args.spec)
    # Every choice checked against the study now, before any work (`eval --steps 7` computed the 5,000-image
    # reference first): a bad one is one line and exit 2, with nothing written.
    runner.check_arguments(spec, args.arms, args.seeds, args.steps,
                           args.until if args.command in ("run", "train") else None)
    if args.device is not None:
        try:
            parse_device(args.device)
        except UsageError as e:
            raise StudyError(str(e)) from None
    if args.command == "status":
        for s in runner.status(spec, args.arms, args.seeds):
            by_cfg = "" if len(spec.eval.cfg_scales) == 1 else " (" + "; ".join(
                f"cfg {c:g}: {steps}" for c, steps in s["scored_by_cfg"].items()) + ")"
            print(f"{s['arm']:>24} s{s['seed']}: step {s['step']:>6}; evaluable steps {s['eval_steps']}; "
                  f"scored steps {s['scored_steps']}{by_cfg}")
        return 0
    if args.command == "run":
        runner.check_reference_source(spec)  # before the trainings, not after them
    try:  # where the command writes, before hours of training or minutes of evaluation
        if args.command in ("run", "train", "eval"):
            writable_folder(spec.output_dir, f"output_dir {spec.output_dir}")
        if args.command in ("run", "eval", "report"):
            out = args.out or spec.results_dir
            writable_folder(out, f"{'--out' if args.out else 'results_dir'} {out}")
            saved_rows(spec, Path(out) / "study.json", log=lambda *_: None)  # a damaged one: refused now
    except UsageError as e:
        raise StudyError(str(e)) from None
    if args.command in ("run", "train"):
        results = runner.train_all(spec, jobs=args.jobs, threads=args.threads, until=args.until,
                                   arms=args.arms, seeds=args.seeds, retrain_scored=args.retrain_scored,
                                   results=Path(args.out or spec.results_dir) / "study.json")
        failed = [f"{a}-s{s}" for a, s, rc in results if rc != 0]
        if failed:
            print(f"error: training failed for {', '.join(failed)} (see their .log files)", file=sys.stderr)
            return 1
    if args.command in ("run", "eval", "report"):
        failures: list[str] = []
        if args.command != "report":
            rows = runner.evaluate_all(spec, device=args.device, progress=not args.no_progress,
                                       noise=not args.no_noise, arms=args.arms, seeds=args.seeds,
                                       steps=args.steps, failures=failures)
        if args.command == "report" or args.arms or args.seeds or args.steps or args.no_noise:
            # The report holds every evaluation done so far (the sampling-noise ones included), whatever
            # part of the study this command evaluated: it is the same file, never a partial view.
            try:
                rows = runner.evaluate_all(spec, noise=True, cached_only=True)
            except StudyError:  # no evaluation here (a new machine): the saved scores make the report
                if not saved_rows(spec, Path(args.out or spec.results_dir) / "study.json", log=lambda *_: None):
                    raise
                rows = []
        path = write_report(spec, rows, args.out)
        print(path.read_text())
        print(f"wrote {path} (+ study.json, fid_vs_step.png, grids)")
        if failures:
            print(f"error: {len(failures)} checkpoint(s) could not be evaluated ({', '.join(failures)}; see the "
                  "warnings above); the report shows them as missing", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
