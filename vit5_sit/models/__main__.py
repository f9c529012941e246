"""List the model presets: `python -m vit5_sit.models [--input-size N]`.

Parameters (frozen sin-cos pos_embed included, as in the official counts) and forward GFLOPs per image
(one multiply-add = one FLOP, as DiT/SiT report them) at each preset's input size (32: 256px latents).
"""

from __future__ import annotations

import sys

from vit5_sit.common.checks import positive_int
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import stops_cleanly


@stops_cleanly("interrupted: nothing was written; run the same command again")  # (quiet when piped too)
def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vit5_sit.models", command="models", description=__doc__.splitlines()[0])
    parser.add_argument("--input-size", type=positive_int, default=None,
                        help="input height = width for the GFLOPs (default: each preset's); presets whose patch "
                             "size does not divide it show '-'")
    args = parser.parse_args(argv)
    from vit5_sit.models.flops import count_flops, count_params  # torch: after parsing, so --help is instant
    from vit5_sit.models.presets import PRESETS

    print(f"{'preset':<12} {'params':>15} {'trainable':>15} {'GFLOPs':>9}")
    for name, cfg in PRESETS.items():
        params, trainable = count_params(cfg), count_params(cfg, trainable_only=True)
        fits = args.input_size is None or args.input_size % cfg.patch_size == 0
        gflops = f"{count_flops(cfg, args.input_size) / 1e9:>9.2f}" if fits else f"{'-':>9}"
        print(f"{name:<12} {params:>15,} {trainable:>15,} {gflops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
