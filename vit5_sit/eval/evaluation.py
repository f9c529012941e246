"""evaluate(): samples vs reference -> FID / sFID / IS / precision / recall / KID (the papers' columns, in
their order, then KID); compute_reference() caches a reference.

Metrics that cannot be computed are not guessed: they land in `result['skipped']` with the reason (Inception
Score with weights that have no classifier; precision/recall/KID against a reference that holds only
mu/sigma; sFID against a reference file written before sFID existed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from vit5_sit.common.utils import atomic_write_file

from . import metrics as M
from .errors import EvalError
from .inception import NO_LOGITS_REASON, Inception, load_inception
from .sources import (
    REFERENCE_FORMAT,
    ArrayImages,
    Features,
    Reference,
    compute_features,
    open_images,
    open_reference,
)

METRICS = ("fid", "sfid", "is", "precision", "recall", "kid")  # the papers' table order (ADM), then KID
ALIASES = {"pr": ("precision", "recall")}  # shorthand accepted by parse_metrics and the CLI
NEEDS_REFERENCE_FEATURES = ("precision", "recall", "kid")
POOL_DIMS = 2048  # Inception pool features per image
SPATIAL_DIMS = 2023  # sFID features per image (mixed_6/conv, 17 x 17 x 7)
CHOICES = "fid, sfid, is, pr (= precision and recall), kid"


def parse_metrics(metrics: str | Iterable[str]) -> tuple[str, ...]:
    """'fid,is,pr,kid' or a sequence of names -> names in METRICS order; unknown names are errors."""
    names = metrics.split(",") if isinstance(metrics, str) else list(metrics)
    chosen = set()
    for name in (n.strip().lower() for n in names):
        if name in ALIASES:
            chosen.update(ALIASES[name])
        elif name in METRICS:
            chosen.add(name)
        elif name:
            raise EvalError(f"unknown metric '{name}'; choose from {CHOICES}")
    if not chosen:
        raise EvalError(f"no metrics chosen; choose from {CHOICES}")
    return tuple(m for m in METRICS if m in chosen)


class LazyInception:
    """The Inception network, loaded on the first `get()`: only if some features must actually be computed.
    `evaluate` and `compare_runs` (one network for every checkpoint) share it."""

    def __init__(self, inception: Inception | None, weights, device):
        self.inception, self.weights, self.device = inception, weights, device

    def get(self) -> Inception:
        if self.inception is None:
            self.inception = load_inception(self.weights, self.device)
        return self.inception


def prepare_reference(ref: Reference, metrics: Iterable[str], net: LazyInception, batch_size: int = 64,
                      num_workers: int = 0, progress: bool = True) -> Reference:
    """The reference with what `metrics` need and it does not store computed from its images, in one Inception
    pass: pool features (precision, recall, KID; FID when no mu/sigma is stored) and the sFID statistics
    (when no mu_s/sigma_s is stored). Stored statistics win (an ADM batch's mu/sigma/mu_s/sigma_s are its
    published ones). Without images, the reference is returned as it is."""
    metrics = tuple(metrics)
    need_pool = ref.features is None and (any(m in NEEDS_REFERENCE_FEATURES for m in metrics)
                                          or ("fid" in metrics and ref.mu is None))
    need_spatial = "sfid" in metrics and ref.mu_s is None
    if ref.images is None or not (need_pool or need_spatial):
        return ref
    feats = compute_features(ref.images, net.get(), batch_size, num_workers, progress, desc="reference")
    out = dataclasses.replace(ref, features=ref.features if ref.features is not None else feats.pool,
                              inception_weights=ref.inception_weights or net.get().describe())
    if out.mu_s is None and feats.spatial is not None and len(feats.spatial) >= 2:
        out.mu_s, out.sigma_s = M.feature_statistics(feats.spatial)
    return out


def reference_features(ref: Reference, metrics: Iterable[str], net: LazyInception, batch_size: int = 64,
                       num_workers: int = 0, progress: bool = True) -> np.ndarray | None:
    """The reference's pool features (N, 2048): the stored ones, else computed from its images when one of
    `metrics` needs them (precision, recall, KID; FID when no mu/sigma is stored); else None."""
    return prepare_reference(ref, metrics, net, batch_size, num_workers, progress).features


def _no_sfid_reason(ref: Reference) -> str:
    return (f"the reference {ref.description} has no sFID statistics (mu_s, sigma_s; files written before sFID "
            "existed have none) and no images to compute them from; recompute it: "
            "python eval_fid.py ref --data <images> --out <ref.npz>")


PAPER_SAMPLES = 50_000  # the papers' FID-50K (and sFID, IS, precision, recall from the same 50,000 samples)


def _count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def check_sizes(
    metrics: str | Iterable[str],
    num_samples: int | None,            # None: not known (only the reference is checked)
    reference: Reference | None,        # None: only the samples are checked
    pr_k: int = 3,
    kid_subset_size: int | None = None, # None: min(1000, smaller set); a number must fit both sets
    is_splits: int = 10,
    has_logits: bool | None = None,     # the Inception has its classifier; None: not known yet
) -> list[str]:
    """Refuse, before any feature is computed, metrics that mean nothing at these sizes; return warnings.

    Each metric needs: FID and sFID at least 2 images on each side whose covariance is estimated here (a
    stored mu/sigma or mu_s/sigma_s counts as estimated); precision/recall more than k images on each side
    (a radius is the distance to the k-th neighbour); KID at least 2 images on each side, and as many as an
    explicit subset size; the Inception Score at least one image per split. A metric the reference cannot
    serve (no features, no mu_s, no images to compute them) is skipped with its reason, unless every metric
    asked for would be: that is refused too. Warnings: fewer images than feature dimensions (2,048 for FID,
    2,023 for sFID) make the covariance rank-deficient: FID is then biased upward and compares only at equal N.
    Raises EvalError naming the numbers.
    """
    chosen = parse_metrics(metrics)
    n_ref = None if reference is None else reference.num_images
    problems, warnings, impossible = [], [], {}
    for name, label, stored, dims in (("fid", "FID", lambda r: r.mu is not None, POOL_DIMS),
                                      ("sfid", "sFID", lambda r: r.mu_s is not None, SPATIAL_DIMS)):
        if name not in chosen:
            continue
        sides = [("samples", num_samples)]
        if reference is not None and not stored(reference):
            if name == "sfid" and reference.images is None:  # pool features alone cannot give sFID
                impossible[name] = "the reference has no mu_s/sigma_s and no images"
                continue
            sides.append(("reference", n_ref))
        small = [f"{side}: {_count(n)}" for side, n in sides if n is not None and n < 2]
        if small:
            problems.append(f"{label} needs at least 2 images on each side to estimate a covariance "
                            f"({', '.join(small)})")
            continue
        few = [f"{side} {n:,}" for side, n in sides if n is not None and n < dims]
        if few:
            warnings.append(f"{label} from fewer images than its {dims:,} feature dimensions ({', '.join(few)}): "
                            f"the covariance is rank-deficient, so {label} is biased upward and compares only at "
                            f"equal image counts (the papers use {PAPER_SAMPLES:,})")
    pr = [m for m in ("precision", "recall") if m in chosen]
    for names, label, need in ((tuple(pr), "precision/recall", pr_k + 1), (("kid",) * ("kid" in chosen), "KID", 2)):
        if not names:
            continue
        if reference is not None and reference.features is None and reference.images is None:
            impossible.update({m: "no reference features" for m in names})
            continue
        required = need if label != "KID" or kid_subset_size is None else max(need, kid_subset_size)
        small = [f"{side}: {_count(n)}" for side, n in (("samples", num_samples), ("reference", n_ref))
                 if n is not None and n < required]
        if small:
            why = (f"more than k={pr_k} images on each side (the radius of a point reaches its k-th neighbour)"
                   if label == "precision/recall" else
                   f"at least {required:,} images on each side" + (f" (--kid-subset-size {kid_subset_size:,})"
                                                                   if kid_subset_size and required > 2 else ""))
            problems.append(f"{label} needs {why} ({', '.join(small)})")
    if "is" in chosen:
        if num_samples is not None and num_samples < is_splits:
            problems.append(f"IS needs at least one image per split ({is_splits} splits; samples: {num_samples:,})")
        if has_logits is False:
            impossible["is"] = "no classifier"
    if problems:
        raise EvalError("too few images for the metrics asked: " + "; ".join(problems)
                        + ". Use more images, or leave these metrics out (--metrics)")
    if impossible and set(impossible) >= set(chosen):
        reasons = "; ".join(f"{m}: {why}" for m, why in impossible.items())
        raise EvalError(f"none of the metrics asked ({', '.join(chosen)}) can be computed against this reference "
                        f"or Inception ({reasons}); build a full reference: python eval_fid.py ref --data "
                        "<images> --out <ref.npz>")
    return warnings


def evaluate(
    samples,                            # .npz, folder, uint8 array (N, H, W, 3), ImageSource or Features
    reference,                          # statistics .npz (ours, ADM's), images, Reference, Features
    metrics: str | Iterable[str] = METRICS,  # names from METRICS, or 'pr' for precision and recall
    inception: Inception | None = None, # None: load_inception(inception_weights, device) when needed
    inception_weights=None,             # weights file; None searches (see vit5_sit.eval.inception)
    device=None,                        # None: CUDA when available, else CPU
    batch_size: int = 64,               # images per Inception forward
    num_workers: int = 0,               # image-decoding processes for folders
    pr_k: int = 3,                      # precision/recall neighbourhood size
    is_splits: int = 10,                # Inception Score splits
    kid_subsets: int = 100,             # KID subset pairs
    kid_subset_size: int | None = None, # images per KID subset; None: 1000, clipped to the smaller set
    seed: int = 0,                      # KID subset sampling
    progress: bool = True,              # tqdm bars on stderr
    pr_mode: str = "adm",               # precision/recall: 'adm' (ADM's float16 distances) or 'exact' (float32)
) -> dict:
    """Metrics of samples against a reference, as a JSON-able dict.

    Keys: the requested metrics among 'fid', 'is' (+ 'is_std'), 'precision', 'recall', 'kid' (+ 'kid_std',
    'kid_subset_size'), 'sfid', 'pr_mode' with precision/recall; 'num_samples', 'num_reference', 'samples',
    'reference', 'reference_is_adm', 'inception_weights'; 'skipped': {metric: reason} for requested metrics
    that could not be computed; 'warnings' (e.g. fewer images than feature dimensions); 'not_comparable':
    why the numbers cannot stand beside the papers' tables ([] when they can).
    Metrics that mean nothing at the given sizes raise EvalError before any feature is computed (check_sizes).
    """
    chosen = parse_metrics(metrics)
    ref = open_reference(reference)
    if isinstance(reference, Features) and reference.spatial is not None and len(reference.spatial) >= 2:
        ref.mu_s, ref.sigma_s = M.feature_statistics(reference.spatial)
    net = LazyInception(inception, inception_weights, device)
    skipped: dict[str, str] = {}
    if pr_mode not in M.PR_MODES:
        raise EvalError(f"precision/recall mode must be one of {', '.join(M.PR_MODES)}, got {pr_mode!r}")

    # Sizes first: nothing is computed for metrics that would mean nothing.
    source = None if isinstance(samples, Features) else open_images(samples)
    num_samples = len(samples.pool) if source is None else source.num_images
    warnings = check_sizes(chosen, num_samples, ref, pr_k, kid_subset_size, is_splits,
                           inception.has_logits if inception is not None else None)

    # Sample features.
    if source is None:
        sample_desc, feats = "features", samples
    else:
        sample_desc = source.description
        feats = compute_features(source, net.get(), batch_size, num_workers, progress, desc="samples")

    # Reference features and sFID statistics, when a metric needs them and they are not stored.
    wants_features = [m for m in chosen if m in NEEDS_REFERENCE_FEATURES]
    ref = prepare_reference(ref, chosen, net, batch_size, num_workers, progress)
    ref_features = ref.features
    if ref_features is None:
        for m in wants_features:
            skipped[m] = (
                f"the reference {ref.description} holds only mu/sigma and {m} needs its Inception features; "
                "build a reference with them: python eval_fid.py ref --data <images> --out <ref.npz>"
            )

    result = {
        "samples": sample_desc,
        "reference": ref.description,
        "num_samples": len(feats.pool),
        "num_reference": len(ref_features) if ref_features is not None else ref.num_images,
        "reference_is_adm": ref.adm,
        "inception_weights": net.inception.describe() if net.inception is not None else ref.inception_weights,
    }

    def attempt(names: tuple[str, ...], fn):
        """Run one metric; a too-small set (the metric's own ValueError) is reported, not raised."""
        if any(n in skipped for n in names):
            return
        try:
            fn()
        except ValueError as e:
            skipped.update({n: str(e) for n in names})

    if "fid" in chosen:
        def fid():  # stored statistics first (ADM's own for its batch): FID matches its published numbers
            mu_r, sigma_r = (ref.mu, ref.sigma) if ref.mu is not None else M.feature_statistics(ref_features)
            result["fid"] = M.frechet_distance(*M.feature_statistics(feats.pool), mu_r, sigma_r)
        attempt(("fid",), fid)

    if "sfid" in chosen:  # ADM's sFID: the Fréchet distance of the mixed_6/conv features (2,023 per image)
        if feats.spatial is None:
            skipped["sfid"] = ("the sample features carry no sFID features (mixed_6/conv); compute them with "
                               "vit5_sit.eval's Inception")
        elif ref.mu_s is None:
            skipped["sfid"] = _no_sfid_reason(ref)
        else:
            def sfid():
                result["sfid"] = M.frechet_distance(*M.feature_statistics(feats.spatial), ref.mu_s, ref.sigma_s)
            attempt(("sfid",), sfid)

    if "is" in chosen:
        if feats.logits is None:
            no_fc = net.inception is not None and not net.inception.has_logits
            skipped["is"] = NO_LOGITS_REASON if no_fc else "the sample features have no logits"
        else:
            def inception_score():
                result["is"], result["is_std"] = M.inception_score(feats.logits, is_splits)
            attempt(("is",), inception_score)

    pr = tuple(m for m in ("precision", "recall") if m in chosen)
    if pr:
        def precision_recall():
            p, r = M.precision_recall(feats.pool, ref_features, k=pr_k, device=_metric_device(net), mode=pr_mode)
            result.update({"precision": p, "recall": r, "pr_mode": pr_mode})
            for m in {"precision", "recall"} - set(pr):
                result.pop(m)
        attempt(pr, precision_recall)

    if "kid" in chosen:
        def kernel_id():
            result["kid"], result["kid_std"], result["kid_subset_size"] = M.kid(
                feats.pool, ref_features, kid_subsets, kid_subset_size or 1000, seed)
        attempt(("kid",), kernel_id)

    result["skipped"] = skipped
    result["warnings"] = warnings
    result["not_comparable"] = not_comparable(result)
    unreadable = [f for src in (source, ref.images) for f in getattr(src, "skipped", [])]
    if unreadable:
        result["unreadable_files"] = [f"{path} ({reason})" for path, reason in unreadable]
    return result


def not_comparable(result: dict) -> list[str]:
    """Why these numbers cannot stand beside the papers' tables (ADM's evaluator, 50,000 samples against
    ADM's reference batch); [] when they can."""
    reasons = []
    if result["num_samples"] < PAPER_SAMPLES:
        reasons.append(f"{result['num_samples']:,} samples (the papers use {PAPER_SAMPLES:,})")
    if not result.get("reference_is_adm"):
        reasons.append("the reference is not ADM's reference batch (the papers use VIRTUAL_imagenet256_labeled.npz)")
    if "is" in result.get("skipped", {}):
        reasons.append(f"IS n/a ({result['skipped']['is']})")
    if result.get("pr_mode") == "exact":
        reasons.append("precision/recall in exact float32 (--pr-exact); ADM's evaluator uses float16 distances")
    return reasons


def _metric_device(net: LazyInception):
    """Distances for precision/recall run where the Inception ran (a GPU when there is one)."""
    return net.inception.device if net.inception is not None else (net.device or "cpu")


def reference_file_bytes(num_images: int, metrics: str | Iterable[str] = ("fid", "precision", "recall"),
                         image_bytes: int = 0) -> int:
    """About the size of the .npz `compute_reference` writes for ``num_images`` images and ``metrics``;
    ``image_bytes``: bytes per image when the images are kept (arr_0)."""
    keep_features = any(m in NEEDS_REFERENCE_FEATURES for m in parse_metrics(metrics))
    features = num_images * POOL_DIMS * 4 if keep_features else 0
    statistics = (POOL_DIMS * POOL_DIMS + POOL_DIMS + SPATIAL_DIMS * SPATIAL_DIMS + SPATIAL_DIMS) * 8
    return features + statistics + num_images * image_bytes + 4096


def _read_all_images(images) -> np.ndarray:
    """Every image of a source as one uint8 array (N, H, W, 3), for arr_0; images of one size only."""
    batches = list(images.iter_batches(256))
    sizes = sorted({b.shape[1:3] for b in batches})
    if len(sizes) > 1:
        raise EvalError(f"{images.description} holds images of {len(sizes)} sizes ({sizes[0]}, {sizes[1]}, ...); "
                        "arr_0 (--keep-images) needs one size: resize them first")
    return np.concatenate(batches)


def compute_reference(
    source,                             # images (folder, .npz, array) or an ADM reference batch
    out_path,                           # .npz to write (ADM's keys): mu, sigma, mu_s, sigma_s, features, arr_0
    inception: Inception | None = None, # None: load_inception(inception_weights, device)
    inception_weights=None,
    device=None,
    batch_size: int = 64,
    num_workers: int = 0,
    progress: bool = True,
    metrics: str | Iterable[str] = ("fid", "precision", "recall"),  # what the file must serve
    keep_images: bool = False,          # also store the images as arr_0: a complete ADM reference batch
) -> Reference:
    """Compute the reference's Inception features once and store them in ADM's reference-batch layout.

    Always: `mu`, `sigma` (pool3, 2048) and `mu_s`, `sigma_s` (sFID, 2023), float64 as `np.mean` and
    `np.cov(rowvar=False)` give them: the keys ADM's evaluator reads. Precision, recall and KID need the pool
    features themselves: with them in ``metrics`` the file also holds `features` (float32, 8 KB per image).
    With ``keep_images`` it holds the images as `arr_0` (uint8 N x H x W x 3), and ADM's evaluator (which
    always reads arr_0 of a reference batch) reads the file as its own. The Inception Score needs no reference.
    For an ADM reference batch the features (and so the statistics) are computed from its arr_0 images.
    The file is written to a temporary name and renamed into place, so an interrupted run leaves no partial
    file.
    """
    ref = open_reference(source)
    if ref.images is None:
        raise EvalError(f"{ref.description} holds no images to compute features from")
    images = ref.images
    kept = {}
    if keep_images:
        kept["arr_0"] = _read_all_images(images)
        images = ArrayImages(kept["arr_0"], images.description)
    inception = inception if inception is not None else load_inception(inception_weights, device)
    feats = compute_features(images, inception, batch_size, num_workers, progress, "reference")
    mu, sigma = M.feature_statistics(feats.pool)
    stored = {"mu": mu, "sigma": sigma}
    mu_s = sigma_s = None
    if feats.spatial is not None:
        mu_s, sigma_s = M.feature_statistics(feats.spatial)
        stored.update(mu_s=mu_s, sigma_s=sigma_s)
    keep_features = any(m in NEEDS_REFERENCE_FEATURES for m in parse_metrics(metrics))
    if keep_features:
        stored["features"] = feats.pool.astype(np.float32)
    out_path = Path(out_path)
    with atomic_write_file(out_path) as tmp, open(tmp, "wb") as f:  # a file object: np.savez adds no .npz
        np.savez(f, **kept, **stored, num_images=len(feats.pool), inception_weights=inception.describe(),
                 source=ref.description, format=REFERENCE_FORMAT)
    return Reference(str(out_path), mu, sigma, features=feats.pool if keep_features else None,
                     inception_weights=inception.describe(), mu_s=mu_s, sigma_s=sigma_s)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


TABLE_LABELS = {"fid": "FID", "sfid": "sFID", "is": "IS", "precision": "Precision", "recall": "Recall",
                "kid": "KID"}  # the papers' column names, in their order (KID last: not in the papers' tables)


def format_markdown(result: dict) -> str:
    """The papers' table for one evaluation: FID, sFID, IS, Precision, Recall (then KID) with the sample and
    reference counts, then whether it compares with the papers' numbers, warnings and skipped metrics."""
    n_ref = result["num_reference"]
    columns = [("samples", _cell(result["samples"])), ("images", f"{result['num_samples']:,}"),
               ("reference images", f"{n_ref:,}" if n_ref is not None else "statistics")]
    for name, label in TABLE_LABELS.items():
        if name in result:
            value = {
                "fid": lambda: f"{result['fid']:.2f}",
                "sfid": lambda: f"{result['sfid']:.2f}",
                "is": lambda: f"{result['is']:.2f} ± {result['is_std']:.2f}",
                "precision": lambda: f"{result['precision']:.3f}",
                "recall": lambda: f"{result['recall']:.3f}",
                "kid": lambda: f"{result['kid']:.5f} ± {result['kid_std']:.5f}",
            }[name]()
            columns.append((label, value))
        elif name in result["skipped"]:
            columns.append((label, "n/a"))
    lines = [
        "| " + " | ".join(c[0] for c in columns) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|",
        "| " + " | ".join(c[1] for c in columns) + " |",
        "",
        f"Reference: {_cell(result['reference'])}; Inception: {result['inception_weights'] or 'unknown'}"
        + ("; precision/recall: " + ("ADM's float16 distances" if result["pr_mode"] == "adm"
                                     else "exact float32 distances") if "pr_mode" in result else "") + ".",
    ]
    reasons = result.get("not_comparable", not_comparable(result))
    if reasons:
        lines.append("Not comparable with the papers' tables: " + "; ".join(reasons) + ".")
    else:
        lines.append("Comparable with the papers' tables: ADM's protocol, 50,000 samples against ADM's reference "
                     "batch.")
    lines += [f"- warning: {w}" for w in result.get("warnings", [])]
    lines += [f"- {name}: n/a: {reason}" for name, reason in result["skipped"].items()]
    unreadable = result.get("unreadable_files", [])
    if unreadable:
        more = f", ... ({len(unreadable) - 10} more)" if len(unreadable) > 10 else ""
        lines.append(f"- {len(unreadable)} unreadable image(s) skipped: {', '.join(unreadable[:10])}{more}")
    return "\n".join(lines)
