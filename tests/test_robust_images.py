"""Every Pillow mode is converted with its values kept (16-bit included) or refused by name; unreadable files
are skipped and reported, in training and in evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vit5_sit.data.images import ImageFolderDataset, UnreadableDataError, to_mode, to_rgb_uint8
from vit5_sit.eval import Features, evaluate, format_markdown
from vit5_sit.eval.sources import FolderImages

RAMP8 = np.tile(np.arange(0, 256, 16, dtype=np.uint8), (16, 1))  # 16x16, values 0..240


def _dataset(tmp_path, image: Image.Image, channels: int, name: str = "x.png") -> ImageFolderDataset:
    (tmp_path / "c").mkdir(exist_ok=True)
    image.save(tmp_path / "c" / name)
    return ImageFolderDataset(tmp_path, 16, random_flip=False, channels=channels)


@pytest.mark.parametrize("channels", [1, 3])
def test_16_bit_png_keeps_its_values(tmp_path, channels):
    ramp16 = (np.linspace(0, 65535, 256).reshape(16, 16)).astype(np.uint16)
    ds = _dataset(tmp_path, Image.fromarray(ramp16), channels)
    assert Image.open(tmp_path / "c/x.png").mode == "I;16"
    x, _ = ds[0]
    expected = torch.from_numpy(ramp16.astype(np.float32) / 65535 * 2 - 1)
    assert x.shape == (channels, 16, 16)
    for c in range(channels):
        torch.testing.assert_close(x[c], expected, atol=1e-5, rtol=0)
    assert float((x >= 0.999).float().mean()) < 0.01  # Pillow's own conversion saturates 99% of pixels


@pytest.mark.parametrize("mode", ["1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr", "HSV", "I", "La",
                                  "RGBa", "LAB"])
@pytest.mark.parametrize("channels", [1, 3])
def test_every_mode_converts_to_the_gray_values(mode, channels):
    base = Image.fromarray(RAMP8)
    if mode == "I":  # 16-bit values in a 32-bit mode: how older Pillow opens 16-bit PNGs
        image = Image.fromarray(RAMP8.astype(np.int32) * 257, mode="I")
    elif mode == "1":
        image = base.convert("1", dither=Image.Dither.NONE)
    elif mode == "PA":
        image = base.convert("P").convert("PA")
    else:
        via = {"La": "LA", "RGBa": "RGBA", "LAB": "RGB"}.get(mode)
        image = base.convert(via).convert(mode) if via else base.convert(mode)
    out = np.asarray(to_mode(image, channels), dtype=np.float32)
    gray = out if out.ndim == 2 else out.mean(axis=2)
    expected = (RAMP8 >= 128).astype(np.float32) * 255 if mode == "1" else RAMP8.astype(np.float32)
    tol = 3.0 if mode in ("CMYK", "YCbCr", "HSV", "LAB") else 0.5
    assert np.abs(gray - expected).max() <= tol, (mode, np.abs(gray - expected).max())


@pytest.mark.parametrize("mode, words", [("F", "32-bit float")])
def test_modes_without_a_defined_conversion_are_refused_by_name(tmp_path, mode, words):
    image = Image.new(mode, (8, 8))
    with pytest.raises(UnreadableDataError, match=f"image mode '{mode}' is not supported.*{words}"):
        to_mode(image, 3)


def test_out_of_range_32_bit_values_are_refused():
    with pytest.raises(UnreadableDataError, match="only 16-bit values"):
        to_mode(Image.fromarray(np.full((4, 4), 70000, np.int32), mode="I"), 1)


def test_eval_converts_16_bit_like_training():
    ramp16 = (np.linspace(0, 65535, 256).reshape(16, 16)).astype(np.uint16)
    rgb = to_rgb_uint8(Image.fromarray(ramp16))
    assert rgb.shape == (16, 16, 3) and rgb.dtype == np.uint8
    np.testing.assert_array_equal(rgb[..., 0], np.rint(ramp16 / 257).astype(np.uint8))


def test_folder_where_nothing_is_readable_is_one_line(tmp_path):
    (tmp_path / "c").mkdir()
    for i in range(3):
        (tmp_path / "c" / f"{i}.png").write_bytes(b"\x89PNG broken")
    ds = ImageFolderDataset(tmp_path, 8, channels=3)
    with pytest.raises(UnreadableDataError) as e:
        ds[0]
    msg = str(e.value)
    assert "\n" not in msg and "none of the 3 images" in msg and "first: c/0.png" in msg
    with pytest.raises(UnreadableDataError, match="none of the 3 images"):
        ImageFolderDataset(tmp_path, 8, channels=3, verify=True)


class _FakeInception:
    """Random pool features per image: enough to check which images reached the network."""

    has_logits = False
    device = "cpu"

    def __init__(self):
        self.seen = 0

    def __call__(self, batch):
        self.seen += len(batch)
        return np.random.default_rng(self.seen).normal(size=(len(batch), 2048)).astype(np.float32), None

    def describe(self):
        return "fake"


def test_eval_skips_a_truncated_image_and_reports_it(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    good = (tmp_path / "0.png").read_bytes()
    (tmp_path / "9_truncated.png").write_bytes(good[: len(good) // 2])
    net = _FakeInception()
    ref = Features(np.random.default_rng(1).normal(size=(10, 2048)).astype(np.float32))
    result = evaluate(tmp_path, ref, "fid", inception=net, progress=False)
    assert net.seen == 4 and result["num_samples"] == 4
    assert len(result["unreadable_files"]) == 1 and "9_truncated.png" in result["unreadable_files"][0]
    assert "1 unreadable image(s) skipped" in format_markdown(result)


def test_eval_folder_with_nothing_readable(tmp_path):
    from vit5_sit.eval import EvalError

    (tmp_path / "a.png").write_bytes(b"nope")
    with pytest.raises(EvalError, match="none of the 1 images"):
        list(FolderImages(tmp_path).iter_batches(4))


def test_a_link_loop_and_a_fifo_in_an_image_folder(tmp_path):
    """A folder link back up the tree listed every image again at each level (until the OS gave up on the
    path, ~40 levels); a FIFO named like an image blocked its reader forever. Both readers agree."""
    import os

    from vit5_sit.data.images import find_images
    from vit5_sit.eval.sources import open_images

    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    for i in range(2):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(root / "a" / f"{i}.png")
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)
    os.mkfifo(root / "a" / "pipe.png")
    _, samples = find_images(root)
    assert samples == [("a/0.png", 0), ("a/1.png", 0)]
    assert open_images(root).num_images == 2
