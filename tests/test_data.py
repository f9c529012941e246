"""Image-folder dataset, ADM centre crop, offline digit exports, build_dataset, the data CLI."""

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from vit5_sit.data import (
    ImageFolderDataset,
    adm_center_crop,
    build_dataset,
    export_mnist,
    export_sklearn_digits,
    load_mnist_arrays,
)
from vit5_sit.data.__main__ import main as data_cli

RES = 16


def reference_center_crop_arr(pil_image, image_size):
    """guided-diffusion's image_datasets.center_crop_arr, verbatim apart from names."""
    while min(*pil_image.size) >= 2 * image_size:
        pil_image = pil_image.resize(tuple(x // 2 for x in pil_image.size), resample=Image.BOX)
    scale = image_size / min(*pil_image.size)
    pil_image = pil_image.resize(tuple(round(x * scale) for x in pil_image.size), resample=Image.BICUBIC)
    arr = np.array(pil_image)
    crop_y = (arr.shape[0] - image_size) // 2
    crop_x = (arr.shape[1] - image_size) // 2
    return arr[crop_y : crop_y + image_size, crop_x : crop_x + image_size]


def random_image(w, h, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    shape = (h, w) if mode == "L" else (h, w, len(mode))
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode)


@pytest.mark.parametrize("size", [(16, 16), (37, 23), (100, 64), (64, 129), (300, 70)])
def test_adm_center_crop_matches_guided_diffusion(size):
    image = random_image(*size)
    out = adm_center_crop(image, RES)
    assert out.size == (RES, RES)
    np.testing.assert_array_equal(np.asarray(out), reference_center_crop_arr(image, RES))


def test_adm_center_crop_keeps_the_centre():
    # Three vertical bands, red | green | blue, 100 px each: a 32 px crop of a 300x100 image sees green only.
    arr = np.zeros((100, 300, 3), dtype=np.uint8)
    arr[:, :100, 0] = arr[:, 100:200, 1] = arr[:, 200:, 2] = 255
    out = np.asarray(adm_center_crop(Image.fromarray(arr), 32)).astype(int)
    assert out.shape == (32, 32, 3)
    inner = out[:, 4:-4]  # away from the bicubic ringing at the band edges
    assert (inner[..., 1] == 255).all() and (inner[..., [0, 2]] == 0).all()
    np.testing.assert_array_equal(out[..., 0], out[:, ::-1, 2])  # red leaks in as much as blue: centred


def write_folder(root):
    """3 classes: RGB png/jpg/webp, grayscale png in a nested folder, RGBA, palette bmp, two corrupt files."""
    (root / "cat" / "nested").mkdir(parents=True)
    (root / "dog").mkdir()
    (root / "bird").mkdir()
    random_image(40, 30, seed=1).save(root / "cat" / "a.png")
    random_image(30, 40, seed=2).save(root / "cat" / "b.JPG", format="JPEG")
    random_image(20, 20, mode="L", seed=3).save(root / "cat" / "nested" / "c.png")
    random_image(24, 18, mode="RGBA", seed=4).save(root / "dog" / "d.png")
    (root / "dog" / "e_garbage.png").write_bytes(b"this is not an image" * 10)
    random_image(32, 32, seed=5).save(root / "dog" / "f.webp")
    full = root / "dog" / "full.jpg"
    random_image(64, 64, seed=6).save(full, format="JPEG")
    (root / "dog" / "g_truncated.jpg").write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    full.unlink()
    (root / "dog" / "notes.txt").write_text("ignored")
    random_image(20, 20, seed=7).convert("P").save(root / "bird" / "h.bmp")
    return root


@pytest.fixture
def folder(tmp_path):
    return write_folder(tmp_path / "images")


def test_image_folder_layout_and_outputs(folder):
    ds = ImageFolderDataset(folder, RES, random_flip=False)
    assert ds.classes == ["bird", "cat", "dog"] and ds.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    assert [p for p, _ in ds.samples] == [
        "bird/h.bmp", "cat/a.png", "cat/b.JPG", "cat/nested/c.png",
        "dog/d.png", "dog/e_garbage.png", "dog/f.webp", "dog/g_truncated.jpg",
    ]
    assert ds.num_classes == 3 and ds.sample_shape == (3, RES, RES)
    x, y = ds[1]
    assert x.shape == (3, RES, RES) and x.dtype == torch.float32 and y.dtype == torch.long and int(y) == 1
    expected = np.asarray(adm_center_crop(Image.open(folder / "cat" / "a.png"), RES), dtype=np.float32)
    torch.testing.assert_close(x, torch.from_numpy(expected).permute(2, 0, 1) / 127.5 - 1)
    gray = ds[3][0]
    torch.testing.assert_close(gray[0], gray[1])  # grayscale -> RGB repeats the channel
    assert ImageFolderDataset(folder, RES, channels=1)[3][0].shape == (1, RES, RES)


def test_corrupt_images_are_skipped_counted_and_replaced(folder, caplog):
    ds = ImageFolderDataset(folder, RES, random_flip=False)
    assert len(ds) == 8
    with caplog.at_level(logging.WARNING, logger="vit5_sit.data.images"):
        for _ in range(2):
            items = [ds[i] for i in range(len(ds))]
    for x, _ in items:
        assert x.shape == (3, RES, RES) and x.min() >= -1 and x.max() <= 1
    assert ds.num_skipped == 2 and {s.stage for s in ds.skipped} == {"load"}
    assert sorted(s.path for s in ds.skipped) == ["dog/e_garbage.png", "dog/g_truncated.jpg"]
    assert "truncated" in next(s.reason for s in ds.skipped if s.path.endswith("truncated.jpg"))
    assert sum("skipping unreadable image" in r.message for r in caplog.records) == 2  # once per file
    # A bad index is replaced by the next readable one (wrapping around), deterministically.
    torch.testing.assert_close(items[5][0], items[6][0])
    torch.testing.assert_close(items[7][0], items[0][0])
    assert int(items[7][1]) == 0


def test_verify_drops_unreadable_headers_at_construction(folder):
    ds = ImageFolderDataset(folder, RES, verify=True)
    assert len(ds) == 7 and [s.path for s in ds.skipped] == ["dog/e_garbage.png"]
    assert ds.skipped[0].stage == "scan"
    [ds[i] for i in range(len(ds))]  # the truncated JPEG passes the header check, fails at load
    assert [s.stage for s in ds.skipped] == ["scan", "load"]


def test_empty_or_wrong_layout_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        ImageFolderDataset(tmp_path / "missing", RES)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"no images found in .*empty.*one subfolder per class"):
        ImageFolderDataset(empty, RES)
    random_image(8, 8).save(empty / "loose.png")
    (empty / "class_without_images").mkdir()
    with pytest.raises(ValueError, match="1 images lie directly in the root"):
        ImageFolderDataset(empty, RES)


def test_seeded_flips_are_reproducible_and_change_with_epoch(tmp_path):
    root = tmp_path / "flips"
    (root / "a").mkdir(parents=True)
    for i in range(8):
        random_image(RES, RES, seed=i).save(root / "a" / f"{i}.png")
    ds = ImageFolderDataset(root, RES, seed=123)
    flips = {}
    for epoch in range(4):
        ds.set_epoch(epoch)
        order = torch.randperm(len(ds)).tolist()  # access order must not matter
        got = {i: ds[i][0] for i in order}
        flips[epoch] = [not torch.equal(got[i], ds.load(i)[0]) for i in range(len(ds))]
        for i in range(len(ds)):
            assert torch.equal(got[i], ds.load(i)[0].flip(-1) if flips[epoch][i] else ds.load(i)[0])
    assert 0 < sum(map(sum, flips.values())) < 32
    assert len({tuple(f) for f in flips.values()}) > 1
    again = ImageFolderDataset(root, RES, seed=123)
    again.set_epoch(2)
    assert [not torch.equal(again[i][0], again.load(i)[0]) for i in range(8)] == flips[2]
    unflipped = ImageFolderDataset(root, RES, random_flip=False, seed=123)
    assert all(torch.equal(unflipped[i][0], unflipped.load(i)[0]) for i in range(8))


def test_load_mnist_arrays_are_real_digits():
    images, labels = load_mnist_arrays()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [500] * 10
    assert 20 < images.mean() < 50  # MNIST's mean intensity is about 33; blank or noise would not be
    assert (images[:, 0, :] == 0).all()  # black border


def test_export_mnist_image_folder_is_idempotent(tmp_path):
    out = tmp_path / "mnist"
    export_mnist(out, resolution=32, limit_per_class=3)
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == [str(d) for d in range(10)]
    files = sorted(out.rglob("*.png"))
    assert len(files) == 30
    images, labels = load_mnist_arrays()
    first = files[0]
    index = int(first.stem)
    assert first.parent.name == str(labels[index])
    with Image.open(first) as im:
        assert im.mode == "L" and im.size == (32, 32)
        np.testing.assert_array_equal(np.asarray(im), np.pad(images[index], 2))
    stamps = [p.stat().st_mtime_ns for p in files]
    export_mnist(out, resolution=32, limit_per_class=3)  # complete: nothing rewritten
    assert [p.stat().st_mtime_ns for p in files] == stamps
    with pytest.raises(ValueError, match="already holds a different export"):
        export_mnist(out, resolution=16, limit_per_class=3)
    (out / ".export_complete.json").write_bytes(b"\xff damaged")  # a damaged marker: a named error
    with pytest.raises(ValueError, match="export_complete.json: unreadable .*delete .* and export again"):
        export_mnist(out, resolution=32, limit_per_class=3)


def test_export_sklearn_digits(tmp_path):
    pytest.importorskip("sklearn")
    out = export_sklearn_digits(tmp_path / "digits", resolution=16, limit_per_class=2)
    files = sorted(out.rglob("*.png"))
    assert len(files) == 20
    with Image.open(files[0]) as im:
        assert im.size == (16, 16) and np.asarray(im).max() > 128


# One export of 400 synthetic 8x8 "digits" into argv[1], in a process of its own.
_EXPORT_400 = (
    "import sys, numpy as np; from PIL import Image; from vit5_sit.data.digits import _export; "
    "imgs = (np.arange(400 * 64) % 251).astype(np.uint8).reshape(400, 8, 8); "
    "_export(sys.argv[1], imgs, np.arange(400) % 10, np.arange(400), "
    "dict(source='test', resolution=8, limit_per_class=None, count=400), Image.fromarray)"
)


def test_concurrent_first_uses_export_once_and_all_succeed(tmp_path):
    """A study's parallel jobs (or a multi-GPU run's ranks) reach the first use at once: each must succeed.
    Without the export lock, one process removed the others' temporary files as stale (a real failure:
    "No such file or directory: 'data/mnist32/8/.04414.png....tmp'")."""
    out = tmp_path / "digits"
    procs = [subprocess.Popen([sys.executable, "-c", _EXPORT_400, str(out)], stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert len(list(out.rglob("*.png"))) == 400 and (out / ".export_complete.json").is_file()
    assert not list(out.rglob("*.tmp"))


def test_an_export_waits_for_the_one_in_progress(tmp_path):
    import threading

    from vit5_sit.common.utils import exclusive_lock
    from vit5_sit.data.digits import LOCK, _export

    out = tmp_path / "digits"
    out.mkdir()
    imgs = np.zeros((20, 8, 8), np.uint8)
    settings = dict(source="test", resolution=8, limit_per_class=None, count=20)
    job = threading.Thread(target=_export, args=(out, imgs, np.arange(20) % 10, np.arange(20), settings,
                                                 Image.fromarray))
    with exclusive_lock(out / LOCK):  # another process's export in progress
        job.start()
        job.join(timeout=1.0)
        assert job.is_alive() and not list(out.rglob("*.png"))  # it waits, writing nothing
    job.join()
    assert len(list(out.rglob("*.png"))) == 20 and (out / ".export_complete.json").is_file()


def test_a_filesystem_without_locks_still_exports(tmp_path, monkeypatch):
    import errno
    import fcntl

    from vit5_sit.data.digits import _export

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)  # some network mounts
    settings = dict(source="test", resolution=8, limit_per_class=None, count=10)
    _export(tmp_path / "d", np.zeros((10, 8, 8), np.uint8), np.arange(10), np.arange(10), settings, Image.fromarray)
    assert len(list((tmp_path / "d").rglob("*.png"))) == 10


def test_export_into_a_folder_with_other_images_is_refused_hidden_files_are_not_in_the_way(tmp_path):
    from vit5_sit.data.digits import _export

    imgs, settings = np.zeros((10, 8, 8), np.uint8), dict(source="test", resolution=8, limit_per_class=None,
                                                         count=10)
    out = tmp_path / "digits"
    (out / "3").mkdir(parents=True)
    (out / ".DS_Store").write_bytes(b"x")  # hidden: the dataset does not read it
    (out / "3" / "extra.png").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"holds 1 files that are not part of this export .*extra\.png"):
        _export(out, imgs, np.arange(10), np.arange(10), settings, Image.fromarray)
    (out / "3" / "extra.png").unlink()
    _export(out, imgs, np.arange(10), np.arange(10), settings, Image.fromarray)
    assert len(list(out.rglob("*.png"))) == 10


def test_build_dataset(tmp_path):
    ds = build_dataset("mnist", tmp_path / "mnist", resolution=32, limit_per_class=2, seed=0)
    x, y = ds[0]
    assert x.shape == (1, 32, 32) and ds.num_classes == 10 and int(y) == 0
    assert build_dataset("images", tmp_path / "mnist", resolution=8).sample_shape == (3, 8, 8)
    with pytest.raises(ValueError, match="needs a resolution"):
        build_dataset("images", tmp_path / "mnist")
    with pytest.raises(ValueError, match="kind='cifar': must be one of 'images', 'latents', 'mnist', 'digits'"):
        build_dataset("cifar", tmp_path)


def test_cli_mnist(tmp_path, capsys):
    assert data_cli(["mnist", str(tmp_path / "m"), "--resolution", "28", "--limit-per-class", "1"]) == 0
    assert len(list((tmp_path / "m").rglob("*.png"))) == 10
    with pytest.raises(SystemExit):
        data_cli(["mnist", str(tmp_path / "m"), "--resolution", "32", "--limit-per-class", "1"])
    assert "already holds a different export" in capsys.readouterr().err


def test_importing_the_package_does_not_import_diffusers():
    code = "import sys, vit5_sit.data; assert 'diffusers' not in sys.modules, 'diffusers imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
