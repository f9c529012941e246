"""evaluate(): samples vs reference -> FID / IS / precision / recall / KID; compute_reference() caches one.

Metrics that cannot be computed are not guessed: they land in `result['skipped']` with the reason (Inception
Score with weights that have no classifier; precision/recall/KID against a reference that holds only
mu/sigma).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from vit5_sit.utils import atomic_write_file

from . import metrics as M
from .errors import EvalError
from .inception import NO_LOGITS_REASON, Inception, load_inception
from .sources import REFERENCE_FORMAT, Features, Reference, compute_features, open_images, open_reference

METRICS = ("fid", "is", "precision", "recall", "kid")
ALIASES = {"pr": ("precision", "recall")}  # shorthand accepted by parse_metrics and the CLI
NEEDS_REFERENCE_FEATURES = ("precision", "recall", "kid")
POOL_DIMS = 2048  # Inception pool features per image


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
            raise EvalError(f"unknown metric '{name}'; choose from fid, is, pr (= precision and recall), kid")
    if not chosen:
        raise EvalError("no metrics chosen; choose from fid, is, pr, kid")
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


def reference_features(ref: Reference, metrics: Iterable[str], net: LazyInception, batch_size: int = 64,
                       num_workers: int = 0, progress: bool = True) -> np.ndarray | None:
    """The reference's pool features (N, 2048): the stored ones, else computed from its images when one of
    `metrics` needs them (precision, recall, KID; FID when no mu/sigma is stored); else None."""
    metrics = tuple(metrics)
    needed = any(m in NEEDS_REFERENCE_FEATURES for m in metrics) or ("fid" in metrics and ref.mu is None)
    if ref.features is None and ref.images is not None and needed:
        return compute_features(ref.images, net.get(), batch_size, num_workers, progress, desc="reference").pool
    return ref.features


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
    kid_subset_size: int = 1000,        # images per KID subset (clipped to the smaller set)
    seed: int = 0,                      # KID subset sampling
    progress: bool = True,              # tqdm bars on stderr
) -> dict:
    """Metrics of samples against a reference, as a JSON-able dict.

    Keys: the requested metrics among 'fid', 'is' (+ 'is_std'), 'precision', 'recall', 'kid' (+ 'kid_std',
    'kid_subset_size'); 'num_samples', 'num_reference', 'samples', 'reference', 'inception_weights'; and
    'skipped': {metric: reason} for requested metrics that could not be computed.
    """
    chosen = parse_metrics(metrics)
    ref = open_reference(reference)
    net = LazyInception(inception, inception_weights, device)
    skipped: dict[str, str] = {}

    # Sample features.
    source = None
    if isinstance(samples, Features):
        sample_desc, feats = "features", samples
    else:
        source = open_images(samples)
        sample_desc = source.description
        feats = compute_features(source, net.get(), batch_size, num_workers, progress, desc="samples")

    # Reference features, when a metric needs them and they are not stored.
    wants_features = [m for m in chosen if m in NEEDS_REFERENCE_FEATURES]
    ref_features = reference_features(ref, chosen, net, batch_size, num_workers, progress)
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
            p, r = M.precision_recall(feats.pool, ref_features, k=pr_k, device=_metric_device(net))
            result.update({"precision": p, "recall": r})
            for m in {"precision", "recall"} - set(pr):
                result.pop(m)
        attempt(pr, precision_recall)

    if "kid" in chosen:
        def kernel_id():
            result["kid"], result["kid_std"], result["kid_subset_size"] = M.kid(
                feats.pool, ref_features, kid_subsets, kid_subset_size, seed)
        attempt(("kid",), kernel_id)

    result["skipped"] = skipped
    unreadable = [f for src in (source, ref.images) for f in getattr(src, "skipped", [])]
    if unreadable:
        result["unreadable_files"] = [f"{path} ({reason})" for path, reason in unreadable]
    return result


def _metric_device(net: LazyInception):
    """Distances for precision/recall run where the Inception ran (a GPU when there is one)."""
    return net.inception.device if net.inception is not None else (net.device or "cpu")


def reference_file_bytes(num_images: int, metrics: str | Iterable[str] = ("fid", "precision", "recall")) -> int:
    """About the size of the .npz `compute_reference` writes for ``num_images`` images and ``metrics``."""
    dims = POOL_DIMS
    keep_features = any(m in NEEDS_REFERENCE_FEATURES for m in parse_metrics(metrics))
    stored = num_images * dims * 4 if keep_features else dims * dims * 4
    return stored + dims * 8 + 4096


def compute_reference(
    source,                             # images (folder, .npz, array) or an ADM reference batch
    out_path,                           # .npz to write: mu, sigma, features, num_images, provenance
    inception: Inception | None = None, # None: load_inception(inception_weights, device)
    inception_weights=None,
    device=None,
    batch_size: int = 64,
    num_workers: int = 0,
    progress: bool = True,
    metrics: str | Iterable[str] = ("fid", "precision", "recall"),  # what the file must serve
) -> Reference:
    """Compute the reference's Inception features once and store what ``metrics`` need.

    Precision, recall and KID need the features themselves: the file then holds the features (float32) and
    mu, and sigma is recomputed from the features when the file is read (it would double the size). FID alone
    needs only mu and sigma (sigma stored as float32: 16 MB). The Inception Score needs no reference.
    For an ADM reference batch the features (and so mu/sigma) are computed from its arr_0 images.
    The file is written to a temporary name and renamed into place, so an interrupted run leaves no partial
    file.
    """
    ref = open_reference(source)
    if ref.images is None:
        raise EvalError(f"{ref.description} holds no images to compute features from")
    inception = inception if inception is not None else load_inception(inception_weights, device)
    features = compute_features(ref.images, inception, batch_size, num_workers, progress, "reference").pool
    mu, sigma = M.feature_statistics(features)
    keep_features = any(m in NEEDS_REFERENCE_FEATURES for m in parse_metrics(metrics))
    stored = {"features": features.astype(np.float32)} if keep_features else {"sigma": sigma.astype(np.float32)}
    out_path = Path(out_path)
    with atomic_write_file(out_path) as tmp, open(tmp, "wb") as f:  # a file object: np.savez adds no .npz
        np.savez(f, mu=mu, **stored, num_images=len(features), inception_weights=inception.describe(),
                 source=ref.description, format=REFERENCE_FORMAT)
    return Reference(str(out_path), mu, sigma, features=features if keep_features else None,
                     inception_weights=inception.describe())


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def format_markdown(result: dict) -> str:
    """A table row per evaluation (paste-able next to other runs), then the reference and skipped metrics."""
    columns = [("samples", _cell(result["samples"])), ("images", str(result["num_samples"]))]
    labels = {"fid": "FID", "is": "IS", "precision": "precision", "recall": "recall", "kid": "KID"}
    for name, label in labels.items():
        if name in result:
            value = {
                "fid": lambda: f"{result['fid']:.4f}",
                "is": lambda: f"{result['is']:.3f} ± {result['is_std']:.3f}",
                "precision": lambda: f"{result['precision']:.4f}",
                "recall": lambda: f"{result['recall']:.4f}",
                "kid": lambda: f"{result['kid']:.5f} ± {result['kid_std']:.5f}",
            }[name]()
            columns.append((label, value))
        elif name in result["skipped"]:
            columns.append((label, "n/a"))
    n_ref = result["num_reference"]
    reference_size = f"{n_ref} images" if n_ref is not None else "statistics only"
    lines = [
        "| " + " | ".join(c[0] for c in columns) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|",
        "| " + " | ".join(c[1] for c in columns) + " |",
        "",
        f"Reference: {_cell(result['reference'])} ({reference_size}); "
        f"Inception: {result['inception_weights'] or 'unknown'}.",
    ]
    lines += [f"- {name}: n/a: {reason}" for name, reason in result["skipped"].items()]
    unreadable = result.get("unreadable_files", [])
    if unreadable:
        more = f", ... ({len(unreadable) - 10} more)" if len(unreadable) > 10 else ""
        lines.append(f"- {len(unreadable)} unreadable image(s) skipped: {', '.join(unreadable[:10])}{more}")
    return "\n".join(lines)
