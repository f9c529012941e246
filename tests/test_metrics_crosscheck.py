"""Our metrics against torch-fidelity's own implementation, on the same precomputed features and logits.

Offline and fast: torch-fidelity's feature-level functions (no Inception, no downloads) on small random
Inception-like features (non-negative, correlated, two sets that differ in mean and spread).
"""

import numpy as np
import pytest
import torch
from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric
from torch_fidelity.metric_isc import isc_features_to_metric
from torch_fidelity.metric_kid import kid_features_to_metric
from torch_fidelity.metric_prc import prc_features_to_metric

from vit5_sit.eval.metrics import feature_statistics, frechet_distance, inception_score, kid, precision_recall

D = 48


def _features(n: int, seed: int, shift: float = 0.0, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mix = np.random.default_rng(100).normal(size=(D, D)) / np.sqrt(D)  # shared correlations
    return np.maximum(0.0, (rng.normal(size=(n, D)) * scale + shift) @ mix + 0.3)  # ReLU-like pool features


@pytest.fixture(scope="module")
def sets():
    return _features(300, 1), _features(260, 2, shift=0.4, scale=1.3)


@pytest.mark.parametrize("n_samples", [300, 30])  # full-rank and singular (N < D) sample covariances
def test_fid_matches_torch_fidelity(sets, n_samples):
    samples, reference = sets[0][:n_samples], sets[1]
    ours = frechet_distance(*feature_statistics(samples), *feature_statistics(reference))
    stats = [fid_features_to_statistics(torch.from_numpy(f)) for f in (samples, reference)]
    theirs = fid_statistics_to_metric(*stats, verbose=False)["frechet_inception_distance"]
    assert ours > 1.0 and ours == pytest.approx(theirs, rel=1e-6, abs=1e-8)
    same = frechet_distance(*feature_statistics(reference), *feature_statistics(reference))
    assert abs(same) < 1e-8 * np.trace(feature_statistics(reference)[1])


@pytest.mark.parametrize("n, splits", [(200, 1), (200, 5), (200, 10), (203, 10), (1003, 7)])
def test_inception_score_matches_torch_fidelity(n, splits):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(n, 30)) * 3 + 4 * np.eye(30)[rng.integers(0, 30, n)]  # confident-ish
    ours = inception_score(logits, splits=splits)
    # Consecutive splits with the same boundaries, also when N is not divisible by splits (ours without
    # torch-fidelity's shuffle).
    theirs = isc_features_to_metric(torch.from_numpy(logits), splits=splits, shuffle=False)
    assert ours[0] > 1.5
    assert ours == pytest.approx((theirs["inception_score_mean"], theirs["inception_score_std"]), rel=1e-9,
                                 abs=1e-12)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_precision_recall_match_torch_fidelity(sets, k):
    samples, reference = sets
    ours = precision_recall(samples, reference, k=k, chunk=64, mode="exact")  # torch-fidelity's float32 variant
    as_t = [torch.from_numpy(f).float() for f in (samples, reference)]  # ours computes in float32 too
    theirs = prc_features_to_metric(*as_t, prc_neighborhood=k, prc_batch_size=10000, save_cpu_ram=False,
                                    verbose=False)
    assert 0 < ours[0] < 1 and 0 < ours[1] < 1
    # The same counts of points inside (torch-fidelity averages in float32: 1e-6, far below 1 / N).
    assert ours == pytest.approx((theirs["precision"], theirs["recall"]), abs=1e-6)


@pytest.mark.parametrize("subset_size", [50, 200])
def test_kid_matches_torch_fidelity(sets, subset_size):
    samples, reference = sets
    ours = kid(samples, reference, num_subsets=20, subset_size=subset_size, seed=7)
    # The same subsets: both draw from RandomState(seed), samples first, then reference, subset by subset.
    theirs = kid_features_to_metric(
        torch.from_numpy(samples), torch.from_numpy(reference), kid_subsets=20, kid_subset_size=subset_size,
        kid_kernel="poly", kid_kernel_poly_degree=3, kid_kernel_poly_gamma=None, kid_kernel_poly_coef0=1,
        rng_seed=7, verbose=False)
    assert ours[2] == subset_size and ours[0] > 0
    assert ours[:2] == pytest.approx((theirs["kernel_inception_distance_mean"],
                                      theirs["kernel_inception_distance_std"]), rel=1e-9)
