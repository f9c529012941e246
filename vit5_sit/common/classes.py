"""Class labels for sampling: ImageNet names, and `--classes` lists of ids, id ranges and names.

A `--classes` value is a comma-separated list of items; each item is a class id (``207``), an id range
(``0-9``, both ends included) or, for 1000-class (ImageNet) models, a class name matched
case-insensitively against any synonym in ``assets/imagenet_classes.txt`` (``golden retriever``,
``Carassius auratus``). No single name contains a comma, so commas always separate items.
"""

from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path

IMAGENET_CLASSES_FILE = Path(__file__).parent.parent / "assets" / "imagenet_classes.txt"
IMAGENET_NUM_CLASSES = 1000
DEFAULT_IMAGENET_CLASSES = [207, 360, 387, 974, 88, 979, 417, 279]  # DiT's sample.py grid
MAX_GRID_CLASSES = 16  # a grid shows every class of a model with at most this many
_RANGE = re.compile(r"^([0-9]+)\s*-\s*([0-9]+)$")
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"  # a number as written: -1, +3, 1.5, 1e3
_NUMBER = re.compile(rf"^(?:{_NUM}|[-+]?inf|[-+]?nan)$", re.IGNORECASE | re.ASCII)
_NUMBER_RANGE = re.compile(rf"^{_NUM}\s*-\s*{_NUM}$", re.ASCII)
_SAME_NAME = {134: "crane, the bird", 517: "crane, the machine"}  # one name, two classes, no other synonym


class ClassSpecError(ValueError):
    """A class id or name that the model does not have; the message names it and the nearest matches."""


@functools.lru_cache(maxsize=1)
def imagenet_synonyms() -> tuple[tuple[str, ...], ...]:
    """The synonyms of each ImageNet class, by class id; the first one is the display name."""
    classes = []
    for line in IMAGENET_CLASSES_FILE.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        index, _, names = line.partition("\t")
        if int(index) != len(classes):
            raise RuntimeError(f"{IMAGENET_CLASSES_FILE}: line for class {index}, expected {len(classes)}")
        classes.append(tuple(n.strip() for n in names.split(";") if n.strip()))
    if len(classes) != IMAGENET_NUM_CLASSES:
        raise RuntimeError(f"{IMAGENET_CLASSES_FILE}: {len(classes)} classes, not {IMAGENET_NUM_CLASSES}")
    return tuple(classes)


def imagenet_name(class_id: int) -> str:
    return imagenet_synonyms()[class_id][0]


def class_label(class_id: int, num_classes: int) -> str:
    """What a grid row says: ``207 golden retriever`` for ImageNet models, ``class 3`` otherwise."""
    if num_classes == IMAGENET_NUM_CLASSES:
        return f"{class_id} {imagenet_name(class_id)}"
    return f"class {class_id}"


def grid_classes(num_classes: int) -> list[int]:
    """The rows of a grid when no classes are asked for: every class of models with at most
    MAX_GRID_CLASSES, DiT's eight ImageNet classes, else the first eight."""
    if num_classes <= MAX_GRID_CLASSES:
        return list(range(num_classes))
    if num_classes == IMAGENET_NUM_CLASSES:
        return list(DEFAULT_IMAGENET_CLASSES)
    return list(range(len(DEFAULT_IMAGENET_CLASSES)))


def _name_index() -> dict[str, list[int]]:
    index: dict[str, list[int]] = {}
    for i, names in enumerate(imagenet_synonyms()):
        for name in names:
            ids = index.setdefault(name.lower(), [])
            if i not in ids:
                ids.append(i)
    return index


def _lookup_name(name: str) -> int:
    index = _name_index()
    key = " ".join(name.lower().split())
    ids = index.get(key)
    if ids is None:
        # Names that contain it ('retriever' -> the retrievers), then similar spellings.
        contain = [k for k in index if key in k]
        similar = difflib.get_close_matches(key, list(index), n=5, cutoff=0.6)
        close = list(dict.fromkeys(contain + similar))[:5]
        nearest = ", ".join(f"{k!r} ({', '.join(map(str, index[k]))})" for k in close)
        hint = f"; nearest: {nearest}" if close else ""
        raise ClassSpecError(f"unknown ImageNet class name {name!r}{hint}. Give a name from "
                             f"{IMAGENET_CLASSES_FILE.name} or a class id 0-999")
    if len(ids) > 1:
        # A name shared by several classes: the class whose display name it is wins (crayfish -> 124).
        primary = [i for i in ids if imagenet_synonyms()[i][0].lower() == key]
        if len(primary) == 1:
            return primary[0]
        synonyms = imagenet_synonyms()
        choices = ", ".join(f"{i} ({_SAME_NAME.get(i) or '; '.join(synonyms[i][:3])})" for i in ids)
        raise ClassSpecError(f"class name {name!r} is ambiguous: it names classes {choices}; give the id")
    return ids[0]


def check_class_id(class_id: int | str, num_classes: int) -> int:
    """``class_id`` (an int, or a string of ASCII digits) as an int, if the model has that class; else
    ClassSpecError. Huge digit strings are refused without being converted."""
    text = str(class_id)
    if isinstance(class_id, str) and not (text.isascii() and text.isdigit()):  # int('٣') is 3
        raise ClassSpecError(f"class id {text[:18]!r}: expected a whole number in ASCII digits (0-9)")
    i = int(class_id) if len(text) <= 18 else None
    if i is None or not 0 <= i < num_classes:
        shown = text if len(text) <= 18 else f"{text[:8]}...({len(text)} digits)"
        raise ClassSpecError(f"class id {shown} out of range: this model has {num_classes} classes "
                             f"(ids 0-{num_classes - 1})")
    return i


def parse_classes(spec: str, num_classes: int) -> list[int]:
    """Class ids from a `--classes` value: comma-separated ids, ranges ``a-b`` and (ImageNet) names."""
    out: list[int] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item.isascii() and item.isdigit():
            ids = [check_class_id(item, num_classes)]
        elif m := _RANGE.match(item):
            lo, hi = (check_class_id(g, num_classes) for g in m.groups())  # checked before the range is built
            if lo > hi:
                raise ClassSpecError(f"class range {item!r}: start is after end (write {hi}-{lo})")
            ids = list(range(lo, hi + 1))
        elif _NUMBER.match(item) or _NUMBER_RANGE.match(item):  # -1, 1.5, 1e3, -1-5: numbers, not names
            what = "range" if _NUMBER_RANGE.match(item) else "id"
            raise ClassSpecError(f"class {what} {item if len(item) <= 18 else item[:15] + '...'} out of range: "
                                 f"this model has {num_classes} classes (ids 0-{num_classes - 1}, whole numbers; "
                                 f"a range is START-END, e.g. 0-{min(9, num_classes - 1)})")
        elif num_classes == IMAGENET_NUM_CLASSES:
            ids = [_lookup_name(item)]
        else:
            raise ClassSpecError(f"class {item!r}: names are known only for 1000-class ImageNet models; this "
                                 f"model has {num_classes} classes, give ids 0-{num_classes - 1}")
        out.extend(ids)
    if not out:
        raise ClassSpecError(f"no classes in {spec!r}: give ids or names separated by commas, e.g. 207,360")
    return out
