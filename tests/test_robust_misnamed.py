"""Errors that named the wrong thing (issue #32): a negative or fractional class id was read as a class name,
an --image-size too large was blamed on --classes/--per-class. Each names the value the user gave and why."""

import math

import pytest

from vit5_sit.common.classes import ClassSpecError, parse_classes


@pytest.mark.parametrize("num_classes", [10, 1000])
@pytest.mark.parametrize("spec, what", [("-1", "class id -1"), ("+3", "class id +3"), ("1.5", "class id 1.5"),
                                        ("1e3", "class id 1e3"), ("2,-7", "class id -7"), ("-1-5", "class range -1-5"),
                                        ("0-1.5", "class range 0-1.5"), ("nan", "class id nan")])
def test_numbers_that_are_no_class_ids_are_named_as_ids(spec, what, num_classes):
    with pytest.raises(ClassSpecError) as e:
        parse_classes(spec, num_classes)
    line = str(e.value)
    assert line.startswith(what + " out of range: this model has") and f"ids 0-{num_classes - 1}" in line
    assert "name" not in line  # not "names are known only for ImageNet" nor "unknown ImageNet class name"


def test_names_and_ids_still_work():
    assert parse_classes("3, 0-2", 10) == [3, 0, 1, 2]
    assert parse_classes("goldfish,207", 1000) == [1, 207]
    with pytest.raises(ClassSpecError, match="names are known only for 1000-class ImageNet models"):
        parse_classes("goldfish", 10)


def test_max_image_size_is_what_pil_opens():
    from vit5_sit.cli.sample import MAX_IMAGE_SIZE
    from vit5_sit.sampling.generate import MAX_GRID_PIXELS

    assert MAX_IMAGE_SIZE == math.isqrt(MAX_GRID_PIXELS)


@pytest.mark.parametrize("flags, start", [
    (["--image-size", "100000"], "error: argument --image-size: must be in [1, 9459]"),
    (["--classes=-1"], "error: --classes: class id -1 out of range"),
    (["--image-size", "4096"], "error: --classes/--per-class/--image-size: a grid of 10 x 4 images of 4096px"),
])
def test_sample_names_the_flag_at_fault(tmp_path, capsys, flags, start):
    from vit5_sit.cli.sample import main

    out = tmp_path / "grid.png"
    try:
        code = main([*flags, "--out", str(out), "--no-progress"])
    except SystemExit as e:  # refused while parsing (the flag's contract)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(start), err
    assert list(tmp_path.iterdir()) == []
