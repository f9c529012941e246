"""The project's own REPA encoder: a small ViT-5 classifier, trained on the data at hand, saved as one file.

No DINOv2 weights are reachable offline, so this is the stand-in: the project's ViT-5 transformer (the
``Denoiser`` class with the ViT-5 switches) with constant conditioning (t = 1, one label), so that its adaLN
modulation is a learned per-channel scale and shift, a linear head on the mean of its last block's patch
tokens, trained with cross-entropy. REPA aligns to those patch tokens (RMS-normalised).

    # a few CPU minutes: 5,000 MNIST digits at 32x32, every 10th held out for the test accuracy
    python -m vit5_sit.repa.classifier --data data/mnist32 --out encoders/mnist-vit5.safetensors

The file is safetensors (the weights) with the config, resolution and accuracy in its metadata; train with
``repa.encoder=encoders/mnist-vit5.safetensors``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from vit5_sit.common.checks import UsageError, nonnegative_int, output_file, path_text, positive_float, positive_int
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import stops_cleanly
from vit5_sit.repa.classifier_recipe import (  # noqa: E402 - the recipe: no torch
    DEFAULT_OVERRIDES,
    DEFAULT_PRESET,
)

# The network, its training and its file are in classifier_net (torch), imported on first use of one of these
# names (PEP 562): `python -m vit5_sit.repa.classifier --help` answers before torch is imported.
_NET_NAMES = ("Classifier", "ClassifierEncoder", "save_classifier", "load_classifier", "_split", "accuracy",
              "train_classifier")


def __getattr__(name: str):
    if name not in _NET_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("vit5_sit.repa.classifier_net"), name)


@stops_cleanly("interrupted: the encoder file was not written (it is written whole when the training ends); "
               "run the same command again")
def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m vit5_sit.repa.classifier", command="repa_classifier", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=path_text, default="data/mnist32", help="MNIST export folder (written on first use)")
    p.add_argument("--kind", default="mnist", choices=("mnist", "images"), help="'images': class folders")
    p.add_argument("--resolution", type=positive_int, default=32)
    p.add_argument("--channels", type=int, default=1, choices=(1, 3))
    p.add_argument("--out", type=path_text, required=True, help="encoder file to write (.safetensors)")
    p.add_argument("--steps", type=positive_int, default=400)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--lr", type=positive_float, default=2e-3)
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--depth", type=positive_int, default=3, help="blocks of the ViT-5 trunk (patch 4, as ViT5-T/4)")
    p.add_argument("--hidden-size", type=positive_int, default=128)
    p.add_argument("--num-heads", type=positive_int, default=2)
    args = p.parse_args(argv)
    from vit5_sit.models import model_config  # torch: after parsing
    from vit5_sit.repa.classifier_net import save_classifier, train_classifier

    try:  # every input checked before the data is read and the training starts
        if not args.out.endswith(".safetensors"):
            raise UsageError(f"--out={args.out}: the encoder file must end in .safetensors")
        output_file(args.out, "--out")
        try:
            model_config(DEFAULT_PRESET, **{**DEFAULT_OVERRIDES, "input_size": args.resolution,
                                            "in_channels": args.channels, "depth": args.depth,
                                            "hidden_size": args.hidden_size, "num_heads": args.num_heads})
        except ValueError as e:
            raise UsageError(f"--resolution/--depth/--hidden-size/--num-heads: {e}") from None
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from vit5_sit.data import build_dataset

    try:
        ds = build_dataset(args.kind, args.data, resolution=args.resolution, channels=args.channels,
                           random_flip=False)
    except (OSError, ValueError) as e:
        print(f"error: --data={args.data}: {e}", file=sys.stderr)
        return 2
    model, info = train_classifier(ds, args.steps, args.batch_size, args.lr, args.seed, depth=args.depth,
                                   hidden_size=args.hidden_size, num_heads=args.num_heads)
    save_classifier(model, args.out, **info)
    print(f"test accuracy {info['test_accuracy']:.4f} on {info['test_images']} held-out images; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
