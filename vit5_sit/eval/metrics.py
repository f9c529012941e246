"""Sample-quality metrics: pure functions of Inception features (numpy arrays or tensors, a row per image).

- FID (Heusel et al. 2017): Fréchet distance between Gaussians fitted to pool3 features.
- Inception Score (Salimans et al. 2016): exp E_x KL(p(y|x) || p(y)) from classifier logits, in splits.
- Precision / recall (Kynkäänniemi et al. 2019): each set's manifold is the union of balls reaching every
  feature's k-th nearest neighbour (k = 3); precision = share of samples inside the reference manifold, recall
  = share of reference features inside the samples' manifold. By default computed as ADM's evaluator does
  (float16 squared distances), which the papers print; `mode='exact'` is torch-fidelity's float32 `prc`.
- KID (Bińkowski et al. 2018): unbiased MMD² with the cubic polynomial kernel (x·y / d + 1)³, averaged over
  random subsets; the estimator torch-fidelity uses.
"""

from __future__ import annotations

import numpy as np
import torch


def _as_float64(x) -> np.ndarray:
    if torch.is_tensor(x):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def feature_statistics(features) -> tuple[np.ndarray, np.ndarray]:
    """Mean (D,) and covariance (D, D) of features (N, D), in float64; the covariance uses N - 1."""
    f = _as_float64(features)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"feature statistics need features (N >= 2, D), got shape {f.shape}")
    return f.mean(axis=0), np.cov(f, rowvar=False)


def frechet_distance(mu1, sigma1, mu2, sigma2) -> float:
    """||mu1 - mu2||² + Tr(sigma1 + sigma2 - 2 (sigma1 sigma2)^½), the FID of pytorch-fid and ADM.

    Tr((sigma1 sigma2)^½) is computed as Tr((A sigma2 A)^½) with A = sigma1^½: the same eigenvalues, but of a
    symmetric positive semi-definite matrix, so two symmetric eigendecompositions (a few seconds at 2048
    dimensions) replace scipy's general sqrtm (a minute on a small CPU) and no complex round-off arises.
    Eigenvalues below zero from round-off are clipped, so singular covariances (N < D) need no eps fallback
    (pytorch-fid's sqrtm retries with eps * I added when its result is not finite).
    """
    mu1, mu2 = np.atleast_1d(_as_float64(mu1)), np.atleast_1d(_as_float64(mu2))
    sigma1, sigma2 = np.atleast_2d(_as_float64(sigma1)), np.atleast_2d(_as_float64(sigma2))
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape or sigma1.shape != (len(mu1), len(mu1)):
        raise ValueError(
            f"mismatched statistics: mu {mu1.shape} vs {mu2.shape}, sigma {sigma1.shape} vs {sigma2.shape}"
        )
    for name, s in (("sigma1", sigma1), ("sigma2", sigma2)):
        if not np.allclose(s, s.T, atol=1e-6 * max(1.0, float(np.abs(s).max()))):
            raise ValueError(f"{name} is not symmetric: not a covariance matrix")
    diff = mu1 - mu2
    w, v = np.linalg.eigh((sigma1 + sigma1.T) / 2)
    root1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    inner = root1 @ sigma2 @ root1
    tr_covmean = np.sqrt(np.clip(np.linalg.eigvalsh((inner + inner.T) / 2), 0, None)).sum()
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * tr_covmean)


def inception_score(logits, splits: int = 10) -> tuple[float, float]:
    """Mean and standard deviation over `splits` consecutive splits of exp(mean KL(p(y|x) || p(y))).

    `logits` (N, C): pre-softmax classifier outputs (torch-fidelity's unbiased logits for the FID Inception).
    Uniform predictions give 1; confident predictions spread evenly over C classes in every split give C.
    """
    x = _as_float64(logits)
    if x.ndim != 2 or len(x) < splits:
        raise ValueError(f"inception_score needs logits (N >= splits={splits}, C), got shape {x.shape}")
    log_p = x - x.max(axis=1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))  # log softmax
    scores = []
    n = len(log_p)
    for i in range(splits):  # torch-fidelity's split boundaries (i * N // splits), also when N % splits != 0
        part = log_p[i * n // splits:(i + 1) * n // splits]
        p = np.exp(part)
        log_marginal = np.log(p.mean(axis=0) + 1e-30)  # log p(y) of this split
        kl = (p * (part - log_marginal)).sum(axis=1)  # KL(p(y|x) || p(y)) per image
        scores.append(np.exp(kl.mean()))
    return float(np.mean(scores)), float(np.std(scores))


def _kth_neighbour_radii(x: torch.Tensor, k: int, chunk: int) -> torch.Tensor:
    """Distance from each row of x to its k-th nearest other row (itself, at distance 0, excluded)."""
    radii = [torch.cdist(rows, x).kthvalue(k + 1, dim=1).values for rows in x.split(chunk)]
    return torch.cat(radii)


def _share_inside(points: torch.Tensor, centres: torch.Tensor, radii: torch.Tensor, chunk: int) -> float:
    """Share of `points` inside at least one ball (centre, radius)."""
    inside = [(torch.cdist(p, centres) <= radii).any(dim=1) for p in points.split(chunk)]
    return torch.cat(inside).double().mean().item()


# ADM's evaluator (ManifoldEstimator): its distance blocks are 10,000 x 10,000, and a block falls back to
# float32 as a whole when its float16 distances are not all finite. Our blocks of `chunk` rows subdivide these,
# so the fallback (and the result) never depends on `chunk`.
ADM_BLOCK = 10_000


def _squared_distances_fp16(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """ADM's float16 block max(|u|² - 2 u·v + |v|², 0), each step rounded to float16 as its graph does on a
    GPU: features cast to float16, squares rounded to float16 and summed in float32, u·v of the float16
    features accumulated in float32 (exact products), every result then rounded to float16. Float16 (N, M)."""
    u16, v16 = u.half().float(), v.half().float()
    norm_u = (u16 * u16).half().float().sum(1).half()  # (N,)
    norm_v = (v16 * v16).half().float().sum(1).half()  # (M,)
    dot = (u16 @ v16.T).half()  # (N, M)
    return ((norm_u[:, None] - 2 * dot) + norm_v[None, :]).clamp_min(0)


def _squared_distances_fp32(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """ADM's float32 fallback: the same formula in float32."""
    return ((u * u).sum(1)[:, None] - 2 * (u @ v.T) + (v * v).sum(1)[None, :]).clamp_min(0)


def _adm_block(u: torch.Tensor, v: torch.Tensor, chunk: int, reduce) -> list:
    """reduce(distances (rows, M) float32, first row) over the rows of one ADM block u x v, in `chunk` rows at
    a time; float16 distances unless some are not finite, then float32 for the whole block (as ADM)."""
    out = []
    for start in range(0, len(u), chunk):
        d = _squared_distances_fp16(u[start:start + chunk], v)
        if not torch.isfinite(d).all():
            return [reduce(_squared_distances_fp32(u[s:s + chunk], v), s) for s in range(0, len(u), chunk)]
        out.append(reduce(d.float(), start))
    return out


def _adm_radii(x: torch.Tensor, k: int, chunk: int) -> torch.Tensor:
    """ADM's manifold radii: entry k of each row of the squared-distance matrix x x x, sorted (entry 0 being the
    point itself, at distance 0 up to float16 round-off). Float32 (N,)."""
    radii = []
    for i in range(0, len(x), ADM_BLOCK):
        rows = x[i:i + ADM_BLOCK]
        smallest = []  # per column block: the k + 1 smallest entries of each row
        for j in range(0, len(x), ADM_BLOCK):
            cols = x[j:j + ADM_BLOCK]
            take = min(k + 1, len(cols))
            smallest.append(torch.cat(_adm_block(rows, cols, chunk,
                                                 lambda d, _, take=take: d.topk(take, dim=1, largest=False).values)))
        radii.append(torch.cat(smallest, dim=1).kthvalue(k + 1, dim=1).values)
    return torch.cat(radii)


def _adm_precision_recall(s: torch.Tensor, r: torch.Tensor, k: int, chunk: int) -> tuple[float, float]:
    """ADM's compute_prec_recall: reference rows x sample columns, a point inside when its squared distance to
    a centre is <= that centre's radius."""
    radii_r, radii_s = _adm_radii(r, k, chunk), _adm_radii(s, k, chunk)
    sample_in = torch.zeros(len(s), dtype=torch.bool, device=s.device)  # inside the reference manifold
    reference_in = torch.zeros(len(r), dtype=torch.bool, device=s.device)  # inside the samples' manifold
    for i in range(0, len(r), ADM_BLOCK):
        rows, rows_radii = r[i:i + ADM_BLOCK], radii_r[i:i + ADM_BLOCK]
        for j in range(0, len(s), ADM_BLOCK):
            cols, cols_radii = s[j:j + ADM_BLOCK], radii_s[j:j + ADM_BLOCK]

            def reduce(d, start, rows_radii=rows_radii, cols_radii=cols_radii):
                return ((d <= cols_radii[None, :]).any(dim=1),
                        (d <= rows_radii[start:start + len(d), None]).any(dim=0))

            parts = _adm_block(rows, cols, chunk, reduce)
            reference_in[i:i + len(rows)] |= torch.cat([p[0] for p in parts])
            for p in parts:
                sample_in[j:j + len(cols)] |= p[1]
    return sample_in.double().mean().item(), reference_in.double().mean().item()


PR_MODES = ("adm", "exact")


def precision_recall(
    samples,
    reference,
    k: int = 3,                         # each feature's ball reaches its k-th nearest neighbour
    chunk: int = 1024,                  # rows of the distance matrix held at once (the result does not depend on it)
    device: str | torch.device = "cpu", # where distances are computed; a GPU makes 50k x 50k practical
    mode: str = "adm",                  # 'adm': ADM's float16 squared distances; 'exact': float32 Euclidean
) -> tuple[float, float]:
    """Improved precision and recall (Kynkäänniemi et al. 2019) of samples against reference features.

    mode 'adm' (the papers' number): ADM's evaluator exactly: squared distances max(|u|² - 2 u·v + |v|², 0) in
    float16 (float32 for a 10,000 x 10,000 block whose float16 values are not all finite), the radius of a
    point the entry k of its sorted row (the point itself included, at entry 0), inside when distance <= a
    radius. mode 'exact': float32 Euclidean distances (torch.cdist), the point itself excluded from its
    neighbours: torch-fidelity's `prc`. They differ by float16 round-off near the radii (docs/evaluation.md).
    """
    if mode not in PR_MODES:
        raise ValueError(f"precision_recall mode must be one of {', '.join(PR_MODES)}, got {mode!r}")
    s = torch.as_tensor(_as_float64(samples), dtype=torch.float32, device=device)
    r = torch.as_tensor(_as_float64(reference), dtype=torch.float32, device=device)
    if s.ndim != 2 or r.ndim != 2 or s.shape[1] != r.shape[1] or min(len(s), len(r)) <= k:
        raise ValueError(
            f"precision_recall needs features (N > k={k}, D), equal D; got {tuple(s.shape)}, {tuple(r.shape)}"
        )
    if mode == "adm":
        return _adm_precision_recall(s, r, k, chunk)
    precision = _share_inside(s, r, _kth_neighbour_radii(r, k, chunk), chunk)
    recall = _share_inside(r, s, _kth_neighbour_radii(s, k, chunk), chunk)
    return precision, recall


def _polynomial_mmd2(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased MMD² of equal-size sets with the kernel (x·y / d + 1)³."""
    m, d = x.shape
    k_xx = (x @ x.T / d + 1) ** 3
    k_yy = (y @ y.T / d + 1) ** 3
    k_xy = (x @ y.T / d + 1) ** 3
    within = (k_xx.sum() - np.trace(k_xx) + k_yy.sum() - np.trace(k_yy)) / (m * (m - 1))
    return float(within - 2 * k_xy.sum() / (m * m))


def kid(
    samples,
    reference,
    num_subsets: int = 100,             # random subset pairs averaged
    subset_size: int = 1000,            # images per subset; clipped to the smaller set
    seed: int = 0,                      # subsets are drawn from np.random.RandomState(seed)
) -> tuple[float, float, int]:
    """Kernel Inception Distance: (mean, std over subsets, subset size used)."""
    x, y = _as_float64(samples), _as_float64(reference)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"kid needs features (N, D) of equal D, got {x.shape} and {y.shape}")
    size = min(subset_size, len(x), len(y))
    if size < 2:
        raise ValueError(f"kid needs at least 2 features in each set, got {len(x)} and {len(y)}")
    rng = np.random.RandomState(seed)
    mmds = []
    for _ in range(num_subsets):
        xs, ys = x[rng.choice(len(x), size, replace=False)], y[rng.choice(len(y), size, replace=False)]
        mmds.append(_polynomial_mmd2(xs, ys))
    return float(np.mean(mmds)), float(np.std(mmds)), size
