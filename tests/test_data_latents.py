"""VAE wrapper and latent cache, with a tiny randomly initialised AutoencoderKL (no weights are reachable)."""

import json
import os
import pickle
import re
import time

import numpy as np
import pytest
import torch
from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before diffusers is imported: never wait on the network

from vit5_sit.data import (  # noqa: E402
    SD_VAE_SCALING_FACTOR,
    ImageFolderDataset,
    LatentDataset,
    VAELoadError,
    build_dataset,
    decode,
    encode,
    encode_dataset,
    encode_moments,
    latent_scaling,
    load_vae,
)
from vit5_sit.data import latents as latents_module  # noqa: E402
from vit5_sit.data import vae as vae_module  # noqa: E402
from vit5_sit.data.__main__ import main as data_cli  # noqa: E402

RES = 16
LATENT_SHAPE = (4, 8, 8)  # 2 VAE blocks: one 2x downsampling


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1,
        latent_channels=4,
        sample_size=RES,
        norm_num_groups=8,
    )
    path = tmp_path_factory.mktemp("vae") / "tiny-vae"
    vae.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def vae(vae_dir):
    return load_vae(str(vae_dir))


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
    """6 files in 2 classes, one of them corrupt."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name, count in [("ant", 3), ("bee", 2)]:
        (root / name).mkdir()
        for i in range(count):
            size = (int(rng.integers(RES, 3 * RES)), int(rng.integers(RES, 3 * RES)), 3)
            Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)).save(root / name / f"{i}.png")
    (root / "ant" / "1_corrupt.png").write_bytes(b"\x89PNG garbage")
    return root


def encode_tiny(images_dir, out, vae, **kwargs):
    kwargs = dict(resolution=RES, batch_size=2, shard_size=2, device="cpu", progress=False) | kwargs
    return encode_dataset(images_dir, out, vae=vae, **kwargs)


def file_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_load_vae_encode_decode(vae):
    assert not vae.training and not any(p.requires_grad for p in vae.parameters())
    assert latent_scaling(vae) == (SD_VAE_SCALING_FACTOR, 0.0)
    x = torch.rand(2, 3, RES, RES) * 2 - 1
    moments = encode_moments(vae, x)
    assert moments.shape == (2, 2 * LATENT_SHAPE[0], *LATENT_SHAPE[1:])
    mean = encode(vae, x, sample=False)
    torch.testing.assert_close(mean, moments[:, :4] * SD_VAE_SCALING_FACTOR)
    a = encode(vae, x, generator=torch.Generator().manual_seed(1))
    b = encode(vae, x, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, mean)
    images = decode(vae, mean)
    assert images.shape == x.shape and images.min() >= -1 and images.max() <= 1


def test_load_vae_offline_error_is_immediate(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(VAELoadError, match="VAE 'nobody/no-such-vae': offline .* not in the Hugging Face"):
        load_vae("nobody/no-such-vae")
    # Offline not declared, but the hub does not answer: still immediate, no retry loop.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(vae_module, "hub_reachable", lambda: False)
    with pytest.raises(VAELoadError, match=r"unreachable\) and not in the Hugging Face cache.*hf download"):
        load_vae("nobody/no-such-vae")
    assert time.perf_counter() - start < 5
    with pytest.raises(VAELoadError, match="no such folder"):
        load_vae(str(tmp_path / "missing" / "vae"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(VAELoadError, match="expected a config.json"):
        load_vae(str(tmp_path / "empty"))


def test_encode_dataset_writes_shards_meta_and_reads_back(images_dir, vae, tmp_path):
    out = tmp_path / "cache"
    meta = encode_tiny(images_dir, out, vae)
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json", "shard_00000.safetensors", "shard_00001.safetensors", "shard_00002.safetensors"]
    assert meta == json.loads((out / "meta.json").read_text())
    assert meta["num_images"] == 5 and meta["num_classes"] == 2 and meta["class_names"] == ["ant", "bee"]
    assert meta["skipped_count"] == 1 and meta["skipped"][0]["path"] == os.path.join("ant", "1_corrupt.png")
    assert meta["latent_shape"] == list(LATENT_SHAPE) and meta["resolution"] == RES
    assert meta["scaling_factor"] == SD_VAE_SCALING_FACTOR and meta["vae"] == str(vae.config._name_or_path)
    assert [s["count"] for s in meta["shards"]] == [2, 1, 2]  # shard 1 lost its corrupt image

    images = ImageFolderDataset(images_dir, RES, random_flip=False)
    readable = [i for i in range(len(images)) if i != 2]  # ant/1_corrupt.png sorts third
    x = torch.stack([images.load(i)[0] for i in readable])
    ds = LatentDataset(out, random_flip=False, sample_posterior=False)
    assert len(ds) == 5 and ds.sample_shape == LATENT_SHAPE and ds.num_classes == 2
    assert ds.labels.tolist() == [0, 0, 0, 1, 1]
    latent, label = ds[2]
    assert latent.shape == LATENT_SHAPE and latent.dtype == torch.float32 and label.dtype == torch.long
    means = torch.stack([ds[i][0] for i in range(5)])
    torch.testing.assert_close(means, encode(vae, x, sample=False), atol=1e-5, rtol=1e-5)
    flipped = torch.stack([ds.moments(i, flip=1) for i in range(5)])
    torch.testing.assert_close(flipped, encode_moments(vae, x.flip(-1)), atol=1e-5, rtol=1e-5)

    # meta's per-channel statistics are those of the scaled posterior samples of both flips.
    both = torch.cat([torch.stack([ds.moments(i, f) for i in range(5)]) for f in (0, 1)]).double()
    mean, logvar = both.chunk(2, dim=1)
    mean = mean * SD_VAE_SCALING_FACTOR
    channel_mean = mean.mean(dim=(0, 2, 3))
    second = (mean.square() + logvar.exp() * SD_VAE_SCALING_FACTOR**2).mean(dim=(0, 2, 3))
    np.testing.assert_allclose(meta["channel_mean"], channel_mean, rtol=1e-6)
    np.testing.assert_allclose(meta["channel_std"], (second - channel_mean.square()).sqrt(), rtol=1e-6)

    assert build_dataset("latents", out, resolution=RES).sample_shape == LATENT_SHAPE
    with pytest.raises(ValueError, match="holds resolution 16, not 256"):
        build_dataset("latents", out, resolution=256)


def test_encode_dataset_resumes_to_identical_files(images_dir, vae, tmp_path, monkeypatch):
    clean = tmp_path / "clean"
    encode_tiny(images_dir, clean, vae)
    reference = file_bytes(clean)

    # Interrupted during the second shard: the first is kept, nothing half-written is visible.
    real_encode_shard = latents_module._encode_shard
    calls = []

    def crash_on_second(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 2:
            (args[3]).write_bytes(b"half a shard")
            raise KeyboardInterrupt
        return real_encode_shard(*args, **kwargs)

    resumed = tmp_path / "resumed"
    monkeypatch.setattr(latents_module, "_encode_shard", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        encode_tiny(images_dir, resumed, vae)
    assert sorted(p.name for p in resumed.iterdir() if ".tmp-" not in p.name) == ["shard_00000.safetensors"]
    monkeypatch.setattr(latents_module, "_encode_shard", real_encode_shard)

    encoded = []
    real_encode_moments = latents_module.encode_moments
    monkeypatch.setattr(latents_module, "encode_moments",
                        lambda vae, x: encoded.append(len(x)) or real_encode_moments(vae, x))
    encode_tiny(images_dir, resumed, vae)
    assert sum(encoded) == 2 * 3  # shards 1 and 2 only (1 + 2 images), each image and its mirror
    assert file_bytes(resumed) == reference

    # A deleted last shard (and meta.json) is re-encoded to the same bytes.
    (clean / "shard_00002.safetensors").unlink()
    (clean / "meta.json").unlink()
    encode_tiny(images_dir, clean, vae)
    assert file_bytes(clean) == reference

    with pytest.raises(ValueError, match="encoded with other settings"):
        encode_tiny(images_dir, clean, vae, save_dtype="float16")


def test_latent_dataset_seeded_flips_and_samples(images_dir, vae, tmp_path):
    out = tmp_path / "cache"
    encode_tiny(images_dir, out, vae, save_dtype="bfloat16")
    a, b = LatentDataset(out, seed=7), LatentDataset(out, seed=7)
    first = [a[i][0] for i in range(5)]
    assert all(torch.equal(x, b[i][0]) for i, x in enumerate(first))
    assert first[0].dtype == torch.float32
    a.set_epoch(1)
    assert not any(torch.equal(x, a[i][0]) for i, x in enumerate(first))  # fresh posterior samples
    means = LatentDataset(out, random_flip=True, seed=7, sample_posterior=False)
    used_mirror = set()
    for epoch in range(6):
        means.set_epoch(epoch)
        for i in range(5):
            x = means[i][0]
            flip = [torch.equal(x, means.moments(i, f)[:4].float() * SD_VAE_SCALING_FACTOR) for f in (0, 1)]
            assert any(flip)
            used_mirror.add(flip[1] and not flip[0])
    assert used_mirror == {True, False}
    restored = pickle.loads(pickle.dumps(a))  # DataLoader workers with spawn: handles are reopened
    assert torch.equal(restored[3][0], a[3][0])


def test_latent_dataset_needs_a_finished_cache(tmp_path):
    with pytest.raises(ValueError, match="not a finished latent cache.*python -m vit5_sit.data encode"):
        LatentDataset(tmp_path)


@pytest.mark.parametrize("meta, shard, message", [
    (b"\xff{not json", None, "meta.json: unreadable"),
    (b"[1, 2]", None, "cache format list, expected"),
    (json.dumps({"format": latents_module.CACHE_FORMAT}).encode(), None, "meta.json: malformed (KeyError"),
    (json.dumps({"format": latents_module.CACHE_FORMAT, "class_names": ["a"], "scaling_factor": 0.18,
                 "shift_factor": 0.0, "shards": [{"file": "shard_00000.safetensors", "count": 1}]}).encode(),
     b"garbage", "shard_00000.safetensors: unreadable latent shard"),
    (json.dumps({"format": latents_module.CACHE_FORMAT, "class_names": ["a"], "scaling_factor": 0.18,
                 "shift_factor": 0.0, "shards": [{"file": "shard_00000.safetensors", "count": 1}]}).encode(),
     None, "shard_00000.safetensors: unreadable latent shard"),
])
def test_a_damaged_latent_cache_is_a_named_error(tmp_path, meta, shard, message):
    """A damaged meta.json or shard is a ValueError naming the file and the command that re-encodes (train.py
    prints it as one line), not a KeyError or a safetensors traceback."""
    (tmp_path / "meta.json").write_bytes(meta)
    if shard is not None:
        (tmp_path / "shard_00000.safetensors").write_bytes(shard)
    with pytest.raises(ValueError, match=re.escape(message)):
        LatentDataset(tmp_path)


def test_cli_encode_in_two_parts(images_dir, vae_dir, tmp_path, capsys):
    out = tmp_path / "cache"
    common = ["encode", "--data", str(images_dir), "--out", str(out), "--vae", str(vae_dir),
              "--resolution", str(RES), "--shard-size", "2", "--num-workers", "0", "--device", "cpu"]
    assert data_cli([*common, "--part", "1", "--num-parts", "2"]) == 0
    assert [p.name for p in out.iterdir()] == ["shard_00001.safetensors"]  # no meta.json yet
    assert data_cli([*common, "--part", "0", "--num-parts", "2"]) == 0
    assert "5 images encoded" in capsys.readouterr().out
    assert LatentDataset(out).meta["num_images"] == 5

    with pytest.raises(SystemExit):
        data_cli(["encode", "--data", str(tmp_path / "nope"), "--out", str(out)])
    assert "--data: image folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        data_cli(["encode", "--data", str(images_dir), "--out", str(out), "--vae", str(tmp_path / "nope")])
    assert "--vae: could not load VAE" in capsys.readouterr().err
