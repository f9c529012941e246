"""Inception (FID/IS/precision/recall features) images/s on this machine: the plain layout vs channels_last,
side by side in one run, with the largest feature difference between the two.

    python benchmarks/bench_inception.py                      # CPU, one thread, 32x32 inputs (resized to 299)
    python benchmarks/bench_inception.py --threads 2 --batch-size 64
    python benchmarks/bench_inception.py --evaluation --threads 2   # the whole evaluation, projected to FID-50K
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout, not another installed copy

from vit5_sit.eval.inception import load_inception  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--resolution", type=int, default=32, help="input size before Inception's resize to 299")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="timed batches per layout, interleaved")
    p.add_argument("--evaluation", action="store_true",
                   help="time the evaluation instead: features (pool3 + sFID, one pass) and ADM / exact "
                        "precision/recall, projected to 50,000 samples against 10,000 references")
    p.add_argument("--pr-size", type=int, default=3000, help="--evaluation: features per side timed for P/R")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.evaluation:
        evaluation(args)
        return
    inception = load_inception(device="cpu")  # channels_last, as evaluation uses it
    layouts = {"channels_last": inception.model,
               "contiguous": copy.deepcopy(inception.model).to(memory_format=torch.contiguous_format)}
    images = torch.randint(0, 256, (args.batch_size, args.resolution, args.resolution, 3), dtype=torch.uint8)
    times: dict[str, list[float]] = {name: [] for name in layouts}
    features = {}
    for repeat in range(args.repeats + 1):  # the first round warms up and is not timed
        for name, model in layouts.items():
            inception.model = model
            start = time.perf_counter()
            features[name] = inception(images)[0]
            if repeat:
                times[name].append(time.perf_counter() - start)
    rate = {name: args.batch_size / min(t) for name, t in times.items()}
    diff = abs(features["channels_last"] - features["contiguous"]).max()
    print(f"Inception, batch {args.batch_size} of {args.resolution}x{args.resolution}, {args.threads} thread(s), "
          f"best of {args.repeats}")
    print(f"{'layout':>14} {'images/s':>9} {'vs contiguous':>14}")
    for name in layouts:
        print(f"{name:>14} {rate[name]:9.2f} {rate[name] / rate['contiguous']:13.2f}x")
    print(f"largest feature difference: {diff:.2e}")


def evaluation(args) -> None:
    """Images/s of the feature pass, seconds of precision/recall at --pr-size, and the FID-50K projection."""
    import numpy as np

    from vit5_sit.eval.metrics import precision_recall

    inception = load_inception(device="cpu")
    images = torch.randint(0, 256, (args.batch_size, args.resolution, args.resolution, 3), dtype=torch.uint8)
    inception.extract(images)  # warm-up
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        inception.extract(images)
        best = min(best, time.perf_counter() - start)
    rate = args.batch_size / best
    rng = np.random.default_rng(0)
    n = args.pr_size
    a, b = (np.abs(rng.normal(0.4, 0.5, (n, 2048))).astype(np.float32) for _ in range(2))  # pool3-like
    pr = {}
    for mode in ("adm", "exact"):
        start = time.perf_counter()
        precision_recall(a, b, mode=mode)
        pr[mode] = time.perf_counter() - start
    scale = (50_000**2 + 10_000**2 + 50_000 * 10_000) / (3 * n * n)  # distance entries: two radii sets, one cross
    print(f"Evaluation on {torch.get_num_threads()} thread(s), batch {args.batch_size} of "
          f"{args.resolution}x{args.resolution}")
    print(f"  features (pool3 + sFID, one pass): {rate:.2f} images/s -> 50,000 samples {50_000 / rate / 3600:.1f} h,"
          f" 10,000 references {10_000 / rate / 60:.0f} min (once: eval_fid.py ref)")
    for mode, seconds in pr.items():
        print(f"  precision/recall {mode:>5}: {n:,} x {n:,} in {seconds:.1f} s -> 50,000 x 10,000 "
              f"~{seconds * scale / 60:.0f} min")


if __name__ == "__main__":
    main()
