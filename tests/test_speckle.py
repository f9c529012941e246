"""The background-speckle measure (issue #51) on hand-made images with known answers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from vit5_sit.eval.speckle import background_mask, speckle_share


def digit() -> np.ndarray:
    img = np.zeros((1, 16, 16), np.uint8)
    img[0, 4:12, 7] = 255  # a vertical stroke
    return img


def test_background_is_beyond_the_margin_of_every_stroke():
    bg = background_mask(digit()[..., None][..., 0])
    assert not bg[0, 8, 7] and not bg[0, 8, 9] and not bg[0, 8, 5]  # the stroke and 2 px either side
    assert bg[0, 8, 10] and bg[0, 8, 4] and bg[0, 0, 0]
    assert not bg[0, 2, 7] and bg[0, 1, 7]  # 2 px above the stroke's end is edge, 3 px is background


def test_share_counts_background_pixels_at_or_above_the_level():
    img = digit()
    n_bg = int(background_mask(img).sum())
    assert speckle_share(img) == 0.0
    img[0, 0, 0], img[0, 15, 15], img[0, 0, 15] = 16, 127, 15  # two count (127: not yet a stroke), one is below
    assert speckle_share(img) == pytest.approx(2 / n_bg)
    img[0, 8, 8] = 100  # an edge pixel is not background
    assert speckle_share(img) == pytest.approx(2 / n_bg)
    rgb = np.repeat(img[..., None], 3, axis=-1)  # sample.py's (N, H, W, 3)
    assert speckle_share(rgb) == speckle_share(img)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="uint8"):
        speckle_share(np.zeros((1, 8, 8), np.float32))


def test_speckle_sources_splits_the_share_by_the_starting_noise():
    """benchmarks/speckle_sources.py on the bundled one-step demo: shares in [0, 1], the table names the output; a
    flow model is refused."""
    spec = importlib.util.spec_from_file_location(
        "speckle_sources", Path(__file__).parents[1] / "benchmarks" / "speckle_sources.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    row = tool.sources("demo-1step", 20, 3.0)
    assert row["x_prediction"] is True
    assert all(0 <= row[k] <= 1 for k in ("speckle", "speckle_small", "speckle_z2", "speckle_z2.5"))
    assert "| demo-1step | data point |" in tool.table([row], 20, 3.0)
    with pytest.raises(SystemExit, match="a flow model"):
        tool.sources("demo", 4, 1.0)
