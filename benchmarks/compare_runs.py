"""Do two training runs hold the same model at a step? Is resume exact? (issue #46, item 3)

Compares the checkpoints of two run folders at one step, tensor by tensor: the model weights, the EMA weights and
the AdamW moments, and prints the largest absolute difference of each group and how many tensors differ at all.
Two runs of one recipe, seed, thread count, torch build and CPU -- one trained in one piece, one in pieces with
`--resume auto` -- must be bit-identical if resume is exact (configs/study/resume.yaml trains the pair).

    python benchmarks/compare_runs.py runs/study/resume-one-piece-s0 runs/study/resume-pieces-s0 --step 1200

Exit status 0 when every tensor is equal, 1 when some differ, 2 when a checkpoint is missing or unreadable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing
from vit5_sit.train.checkpoint import (  # noqa: E402
    CheckpointError,
    checkpoint_dir,
    load_checkpoint,
    optimizer_moments,
)


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[int, int, float, list[str]]:
    """(tensors compared, tensors that differ, largest absolute difference, keys only one side has)."""
    only = sorted(set(a) ^ set(b))
    shared = sorted(set(a) & set(b))
    differ, largest = 0, 0.0
    for k in shared:
        x, y = torch.as_tensor(a[k]).double(), torch.as_tensor(b[k]).double()
        if x.shape != y.shape:
            differ, largest = differ + 1, float("inf")
            continue
        d = (x - y).abs().max().item() if x.numel() else 0.0
        differ += d > 0
        largest = max(largest, d)
    return len(shared), differ, largest, only


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", help="run folder (holds checkpoints/step_N)")
    p.add_argument("run_b", help="run folder to compare with")
    p.add_argument("--step", type=int, required=True, help="the checkpoint step to compare, e.g. 1200")
    args = p.parse_args(argv)
    states = []
    for run in (args.run_a, args.run_b):
        path = checkpoint_dir(run) / f"step_{args.step:07d}"
        if not path.is_dir():
            print(f"error: {path}: no checkpoint at step {args.step} in {run}", file=sys.stderr)
            return 2
        try:
            model, ema, state = load_checkpoint(path)
        except CheckpointError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        states.append({"model weights": model, "EMA weights": ema, "AdamW moments": optimizer_moments(state)})
    print(f"{args.run_a} against {args.run_b}, step {args.step}\n")
    print("| group | tensors | differing | largest abs. difference |\n|---|---:|---:|---:|")
    same = True
    for group in states[0]:
        n, differ, largest, only = compare(states[0][group], states[1][group])
        same &= differ == 0 and not only
        extra = f" (in one run only: {', '.join(only[:5])})" if only else ""
        print(f"| {group} | {n} | {differ} | {largest:.3g}{extra} |")
    print("\nbit-identical" if same else "\nthe runs differ")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
