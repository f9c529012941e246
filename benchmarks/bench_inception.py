"""Inception (FID/IS/precision/recall features) images/s on this machine: the plain layout vs channels_last,
side by side in one run, with the largest feature difference between the two.

    python benchmarks/bench_inception.py                      # CPU, one thread, 32x32 inputs (resized to 299)
    python benchmarks/bench_inception.py --threads 2 --batch-size 64
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
    args = p.parse_args()
    torch.set_num_threads(args.threads)
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


if __name__ == "__main__":
    main()
