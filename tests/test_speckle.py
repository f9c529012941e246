"""The background-speckle measure (issue #51) on hand-made images with known answers."""

from __future__ import annotations

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
