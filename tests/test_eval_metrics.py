"""Metric maths of vit5_sit.eval against analytic values (no Inception, small feature dimensions: fast)."""

import numpy as np
import pytest
import torch

from vit5_sit.eval import EvalError, Features, evaluate, format_markdown, parse_metrics
from vit5_sit.eval.metrics import feature_statistics, frechet_distance, inception_score, kid, precision_recall


def _closed_form_fid(mu1, s1, mu2, s2):
    """FID of Gaussians whose covariances share eigenvectors, from their eigenvalues s1, s2."""
    return np.sum((mu1 - mu2) ** 2) + np.sum(s1 + s2 - 2 * np.sqrt(s1 * s2))


def test_frechet_distance_of_diagonal_gaussians():
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=16), rng.normal(size=16)
    s1, s2 = rng.uniform(0.1, 3.0, 16), rng.uniform(0.1, 3.0, 16)
    got = frechet_distance(mu1, np.diag(s1), mu2, np.diag(s2))
    assert got == pytest.approx(_closed_form_fid(mu1, s1, mu2, s2), rel=1e-9)


def test_frechet_distance_of_rotated_commuting_covariances():
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(24, 24)))  # a random rotation: full, non-diagonal covariances
    mu1, mu2 = rng.normal(size=24), rng.normal(size=24)
    s1, s2 = rng.uniform(0.1, 3.0, 24), rng.uniform(0.1, 3.0, 24)
    got = frechet_distance(mu1, q @ np.diag(s1) @ q.T, mu2, q @ np.diag(s2) @ q.T)
    assert got == pytest.approx(_closed_form_fid(mu1, s1, mu2, s2), rel=1e-8)


@pytest.mark.parametrize("n, d", [(400, 32), (40, 64)])  # full-rank and singular (N < D) covariances
def test_fid_of_a_set_against_itself_is_zero(n, d):
    feats = np.random.default_rng(2).normal(size=(n, d)) * 3 + 1
    mu, sigma = feature_statistics(feats)
    assert abs(frechet_distance(mu, sigma, mu, sigma)) < 1e-6 * np.trace(sigma)
    shifted = frechet_distance(mu, sigma, mu + 1.0, sigma)  # same covariance: exactly the squared shift
    assert shifted == pytest.approx(d, rel=1e-6)


def test_feature_statistics_and_frechet_distance_take_tensors():
    feats = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))
    mu, sigma = feature_statistics(feats)
    np.testing.assert_allclose(mu, feats.double().mean(0).numpy(), atol=1e-12)
    np.testing.assert_allclose(sigma, np.cov(feats.double().numpy(), rowvar=False), atol=1e-12)
    with pytest.raises(ValueError, match="mismatched statistics"):
        frechet_distance(mu, sigma, mu[:4], sigma[:4, :4])


def test_inception_score_of_uniform_logits_is_one():
    mean, std = inception_score(np.zeros((100, 1008)))
    assert mean == pytest.approx(1.0, abs=1e-12) and std == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("classes", [2, 10, 50])
def test_inception_score_of_confident_diverse_logits_is_the_class_count(classes):
    labels = np.tile(np.arange(classes), 10)  # every one of the 10 splits holds each class once
    logits = np.full((len(labels), 1008), -60.0)
    logits[np.arange(len(labels)), labels] = 60.0
    mean, std = inception_score(logits, splits=10)
    assert mean == pytest.approx(classes, rel=1e-9) and std < 1e-9


def test_inception_score_of_confident_single_class_is_one():
    logits = np.zeros((40, 5))
    logits[:, 3] = 80.0
    assert inception_score(logits, splits=4)[0] == pytest.approx(1.0, abs=1e-9)


def test_precision_recall_of_identical_sets_is_one():
    feats = np.random.default_rng(3).normal(size=(60, 16))
    assert precision_recall(feats, feats.copy()) == (1.0, 1.0)


def test_precision_recall_of_far_disjoint_clusters_is_zero():
    rng = np.random.default_rng(4)
    assert precision_recall(rng.normal(size=(50, 16)), rng.normal(size=(50, 16)) + 100.0) == (0.0, 0.0)


def test_precision_recall_of_a_subset():
    rng = np.random.default_rng(5)
    mode_a, mode_b = rng.normal(size=(40, 16)), rng.normal(size=(40, 16)) + 100.0
    both = np.concatenate([mode_a, mode_b])
    # Samples cover one of two modes: all realistic (precision 1), half the reference missed (recall 0.5).
    assert precision_recall(mode_a, both) == (1.0, 0.5)
    # Samples spread over a mode the reference lacks: half are unrealistic, the whole reference is covered.
    assert precision_recall(both, mode_a) == (0.5, 1.0)


def test_precision_recall_uses_the_kth_neighbour_excluding_self():
    # 1-D, k = 1. Reference radii: 0, 1, 2, 3 -> 1 (next point); 10 -> 7 (to 3).
    reference = np.array([[0.0], [1.0], [2.0], [3.0], [10.0]])
    # 0.5 lies in the ball of 0; 5.5 in the ball of 10 (4.5 <= 7); 20 is 10 from 10 > 7: precision 2/3.
    # Sample radii (k = 1): 0.5 -> 5, 5.5 -> 5, 20 -> 14.5; every reference point is within 5 of 0.5 or 5.5.
    samples = np.array([[0.5], [5.5], [20.0]])
    precision, recall = precision_recall(samples, reference, k=1)
    assert precision == pytest.approx(2 / 3) and recall == 1.0  # counting self as a neighbour would give 0, 0
    with pytest.raises(ValueError, match="N > k=3"):
        precision_recall(samples, reference, k=3)  # 3 samples have no 3rd other neighbour


def test_kid_of_point_masses_is_the_kernel_mmd():
    d = 8
    a, b = np.full((30, d), 0.5), np.full((30, d), -1.0)

    def k(x, y):
        return (x @ y / d + 1) ** 3

    mean, std, size = kid(a, b, num_subsets=5, subset_size=20)
    assert mean == pytest.approx(k(a[0], a[0]) + k(b[0], b[0]) - 2 * k(a[0], b[0]), rel=1e-12)
    assert std == pytest.approx(0.0, abs=1e-12) and size == 20


def test_kid_matches_the_unbiased_estimator_and_is_zero_for_a_set_against_itself():
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(200, 16)), rng.normal(size=(200, 16)) + 0.5
    kxx, kyy, kxy = ((x @ x.T / 16 + 1) ** 3, (y @ y.T / 16 + 1) ** 3, (x @ y.T / 16 + 1) ** 3)
    m = len(x)
    direct = (kxx.sum() - np.trace(kxx) + kyy.sum() - np.trace(kyy)) / (m * (m - 1)) - 2 * kxy.mean()
    # One subset of the whole set: any permutation gives the same value.
    assert kid(x, y, num_subsets=1, subset_size=m)[0] == pytest.approx(direct, rel=1e-10)
    far = kid(x, y)[0]
    assert far > 0.5
    # A set against itself: the unbiased estimator leaves -2 (mean k(x, x) - mean k(x, x')) / m, -> 0 in m.
    off_diagonal_mean = (kxx.sum() - np.trace(kxx)) / (m * (m - 1))
    itself = -2 * (np.trace(kxx) / m - off_diagonal_mean) / m
    assert kid(x, x, num_subsets=1, subset_size=m)[0] == pytest.approx(itself, rel=1e-10)
    assert abs(kid(x, x)[0]) < 0.1 * far
    assert abs(kid(x[:100], x[100:])[0]) < 0.1 * far  # two halves of one distribution


def test_parse_metrics():
    assert parse_metrics("fid,pr") == ("fid", "precision", "recall")
    assert parse_metrics(["kid", "fid", "is"]) == ("fid", "is", "kid")
    with pytest.raises(EvalError, match="unknown metric 'fdi'"):
        parse_metrics("fdi")


def test_evaluate_on_features_reports_skipped_metrics_with_reasons():
    rng = np.random.default_rng(7)
    samples = Features(rng.normal(size=(40, 16)).astype(np.float32), logits=None)
    reference = Features(rng.normal(size=(40, 16)).astype(np.float32))
    result = evaluate(samples, reference, progress=False, kid_subset_size=20)
    assert set(result) >= {"fid", "precision", "recall", "kid", "kid_std", "skipped"}
    assert "is" in result["skipped"] and "logits" in result["skipped"]["is"]
    assert "sfid" in result["skipped"] and "sFID features" in result["skipped"]["sfid"]
    table = format_markdown(result)
    assert "| FID | sFID | IS | Precision | Recall | KID |" in table and "- is: n/a" in table


def test_evaluate_computes_inception_score_from_logits():
    rng = np.random.default_rng(8)
    logits = np.full((20, 1008), -50.0)
    logits[np.arange(20), np.tile(np.arange(2), 10)] = 50.0
    samples = Features(rng.normal(size=(20, 16)), logits=logits)
    result = evaluate(samples, Features(rng.normal(size=(20, 16))), metrics="is", progress=False)
    assert result["is"] == pytest.approx(2.0) and result["skipped"] == {}


def test_frechet_distance_matches_scipy_sqrtm_on_non_commuting_covariances():
    import scipy.linalg

    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(200, 32)), rng.normal(size=(200, 32)) @ rng.normal(size=(32, 32))
    mu1, s1 = a.mean(0), np.cov(a, rowvar=False)
    mu2, s2 = b.mean(0), np.cov(b, rowvar=False)
    ref = ((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2 - 2 * scipy.linalg.sqrtm(s1 @ s2).real)
    assert frechet_distance(mu1, s1, mu2, s2) == pytest.approx(ref, rel=1e-8)
