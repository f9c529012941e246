"""List the model presets: `python -m vit5_sit.models [--input-size N]`.

Parameters (frozen sin-cos pos_embed included, as in the official counts) and forward GFLOPs per image
(one multiply-add = one FLOP, as DiT/SiT report them) at each preset's input size (32: 256px latents).
"""

from __future__ import annotations

import argparse

from vit5_sit.models.flops import count_flops, count_params
from vit5_sit.models.presets import PRESETS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vit5_sit.models", description=__doc__.splitlines()[0])
    parser.add_argument("--input-size", type=int, default=None,
                        help="input height = width for the GFLOPs (default: each preset's)")
    args = parser.parse_args(argv)
    print(f"{'preset':<12} {'params':>15} {'trainable':>15} {'GFLOPs':>9}")
    for name, cfg in PRESETS.items():
        params, trainable = count_params(cfg), count_params(cfg, trainable_only=True)
        gflops = count_flops(cfg, args.input_size) / 1e9
        print(f"{name:<12} {params:>15,} {trainable:>15,} {gflops:>9.2f}")


if __name__ == "__main__":
    main()
