"""Property-based (hypothesis): values from outside each command-line contract, for every flag of every command.

Each case calls the command's ``main(argv)`` in this process and asserts what docs/robustness.md promises: one line
on stderr starting with ``error:``, exit code 2, no traceback, nothing written, every input file unchanged. The
flags come from the parsers themselves (tests/test_contract.py walks them), so a new flag is drawn for as soon as
it has its contract entry.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_contract import ALL, ENTRY_POINTS

from vit5_sit.common import contract

FAST = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Text that is no number in any contract: empty, words, non-ASCII digits (Python's int() reads '٣' as 3), numbers
# too large for a float, not-a-number, infinities, hexadecimal.
NOT_NUMBERS = st.sampled_from(["", " ", "abc", "nan", "NaN", "inf", "-inf", "1e400", "-1e400", "٣", "１２", "0x1F",
                               "1,5", "None", "ü", "1e", "--"])


def outside(entry: contract.Arg) -> st.SearchStrategy[str]:
    """Text for a flag of kind int / float / list that its entry refuses."""
    r = entry.range
    options = [NOT_NUMBERS]
    if r is not None and r.lo is not None:
        if entry.kind == "int" or (entry.kind == "list" and isinstance(r.lo, int)):
            options.append(st.integers(min_value=-10**40, max_value=math.ceil(r.lo) - 1).map(str))
        else:
            options.append(st.floats(max_value=r.lo, exclude_max=not r.lo_open, allow_nan=False,
                                     allow_infinity=False).map(repr))
    if r is not None and r.hi is not None:
        if entry.kind == "int" or (entry.kind == "list" and isinstance(r.hi, int)):
            options.append(st.integers(min_value=math.floor(r.hi) + 1, max_value=10**40).map(str))
        else:
            options.append(st.floats(min_value=r.hi, exclude_min=not r.hi_open, allow_nan=False,
                                     allow_infinity=False).map(repr))
    if entry.kind == "int":  # not a whole number
        options.append(st.floats(min_value=-1e6, max_value=1e6).filter(lambda x: not x.is_integer()).map(repr))
    strategy = st.one_of(*options)
    if entry.kind == "list":  # one bad item among good ones
        good = "1" if r is None or r.lo is None or r.lo <= 1 <= (r.hi if r.hi is not None else 2) else str(r.lo)
        strategy = strategy.filter(lambda s: "," not in s and s.strip()).map(lambda s: f"{good},{s}")
    return strategy


NUMERIC = [(name, parser, action) for name, parser, action in ALL
           if (entry := parser.contract(action)) is not None and entry.kind in ("int", "float")
           or entry is not None and entry.kind == "list" and entry.range is not None]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes (a folder: its name)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(root.rglob("*"))}


def run_main(name: str, argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    main = importlib.import_module(ENTRY_POINTS[name]).main
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def assert_one_line_usage_error(code, err: str, *names: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    if names:
        assert any(n in lines[0] for n in names), (names, lines[0])


@pytest.mark.parametrize("name, parser, action", NUMERIC,
                         ids=[f"{p.command}:{contract._name(a)}" for _, p, a in NUMERIC])
@FAST
@given(data=st.data())
def test_a_number_outside_a_flags_contract_is_one_line_and_exit_2(name, parser, action, data):
    flag = contract._name(action)
    bad = data.draw(outside(parser.contract(action)), label=flag)
    values = [bad] * (action.nargs if isinstance(action.nargs, int) else 1)
    argv = [*parser.command.split()[1:], *([f"{flag}={bad}"] if len(values) == 1 else [flag, *values])]
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        code, err = run_main(name, argv)
        assert not os.listdir(tmp), "something was written"
    assert_one_line_usage_error(code, err, flag)


# ----------------------------------------------------------------------------------------------------------
# Paths: an output that is an input (spelled the same, through '..', a link, absolute), a folder where a file
# is written, a missing input. Each case: (command, argv with {in} / {out} / {tmp}, how the input is made).

def _npz(path: Path, payload: bytes) -> None:
    np.savez(path, arr_0=np.frombuffer(payload.ljust(12, b"\0")[:12], np.uint8).reshape(1, 2, 2, 3))


def _file(path: Path, payload: bytes) -> None:
    path.write_bytes(payload)


def _folder(path: Path, payload: bytes) -> None:
    path.mkdir()
    (path / "config.yaml").write_bytes(payload)


SAME_FILE_CASES = {
    "eval_fid ref": ("eval_fid", ["ref", "--data", "{in}", "--out", "{out}"], "x.npz", _npz),
    "eval_fid calc": ("eval_fid", ["calc", "--samples", "{in}", "--ref", "{tmp}/r.npz", "--json", "{out}"], "s.npz",
                      _npz),
    "eval_fid calc ref": ("eval_fid", ["calc", "--samples", "{tmp}/s.npz", "--ref", "{in}", "--json", "{out}"],
                          "r.npz", _npz),
    "eval_fid compare": ("eval_fid", ["compare", "{in}", "--ref", "{tmp}/r.npz", "--out", "{out}"], "run", _folder),
    "sample --ckpt": ("sample", ["--ckpt", "{in}", "--out", "{out}"], "m.npz", _npz),
    "sample --save-images": ("sample", ["--ckpt", "{in}", "--save-images", "{out}"], "run", _folder),
    "data encode": ("data", ["encode", "--data", "{in}", "--out", "{out}"], "imgs", _folder),
    "demo export": ("demo", ["export", "{in}", "--out", "{out}"], "run", _folder),
    "repa classifier": ("repa_classifier", ["--data", "{in}", "--out", "{out}"], "d.safetensors", _file),
    "attention": ("attention", ["{in}", "--json", "{out}"], "m.json", _file),
    "study": ("study", ["report", "{in}", "--out", "{out}"], "study.yaml", _file),
}
SPELLINGS = ("same", "dot", "dotdot", "link", "absolute")


def spelled(path: Path, how: str, tmp: Path) -> str:
    if how == "dot":
        return f"./{path.relative_to(tmp)}"
    if how == "dotdot":
        (tmp / "sub").mkdir(exist_ok=True)
        return f"sub/../{path.relative_to(tmp)}"
    if how == "link":
        link = tmp / f"link{path.suffix}"
        link.symlink_to(path)
        return str(link.relative_to(tmp))
    if how == "absolute":
        return str(path.resolve())
    return str(path.relative_to(tmp))


@pytest.mark.parametrize("case", list(SAME_FILE_CASES))
@FAST
@given(how=st.sampled_from(SPELLINGS), payload=st.binary(min_size=1, max_size=64))
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(case, how, payload):
    name, argv, input_name, make = SAME_FILE_CASES[case]
    with tempfile.TemporaryDirectory() as tmp_, contextlib.chdir(tmp_):
        tmp = Path(tmp_)
        source = tmp / input_name
        make(source, payload)
        out = spelled(source, how, tmp)
        before = tree(tmp)
        code, err = run_main(name, [a.format(**{"in": input_name, "out": out, "tmp": "."}) for a in argv])
        assert tree(tmp) == before, "a file was written or changed"
    assert_one_line_usage_error(code, err, "same file", "same folder")


FOLDER_OUTPUT_CASES = {  # a folder where a file is written
    "sample": ("sample", ["--out", "{dir}.png"]),
    "sample npz": ("sample", ["--out", "{dir}.npz"]),
    "eval_fid ref": ("eval_fid", ["ref", "--data", "{tmp}/x.npz", "--out", "{dir}.npz"]),
    "eval_fid calc": ("eval_fid", ["calc", "--samples", "{tmp}/x.npz", "--ref", "{tmp}/x.npz", "--json", "{dir}"]),
    "repa classifier": ("repa_classifier", ["--out", "{dir}.safetensors"]),
    "attention": ("attention", ["{tmp}/x.npz", "--json", "{dir}"]),
}
MISSING_INPUT_CASES = {
    "eval_fid ref": ("eval_fid", ["ref", "--data", "{missing}", "--out", "{tmp}/r.npz"]),
    "eval_fid calc samples": ("eval_fid", ["calc", "--samples", "{missing}", "--ref", "{tmp}/x.npz"]),
    "eval_fid calc ref": ("eval_fid", ["calc", "--samples", "{tmp}/x.npz", "--ref", "{missing}"]),
    "eval_fid compare ref": ("eval_fid", ["compare", "{tmp}/x.npz", "--ref", "{missing}", "--out", "{tmp}/o"]),
    "sample": ("sample", ["--ckpt", "{missing}", "--out", "{tmp}/s.png"]),
    "study": ("study", ["status", "{missing}"]),
    "train": ("train", ["--config", "{missing}"]),
}
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"], exclude_characters="/\\."),
                min_size=1, max_size=12).filter(lambda s: s.strip() and s not in (".", "..") and not s.startswith("-"))
# (a value that starts with '-' reads as a flag: --json=-x is how it is passed; argparse says "expected one argument")


@pytest.mark.parametrize("case", list(FOLDER_OUTPUT_CASES))
@FAST
@given(folder=NAMES)
def test_a_folder_where_a_file_is_written_is_one_line(case, folder):
    name, argv = FOLDER_OUTPUT_CASES[case]
    with tempfile.TemporaryDirectory() as tmp_, contextlib.chdir(tmp_):
        tmp = Path(tmp_)
        _npz(tmp / "x.npz", b"\1" * 12)
        target = argv[-1].format(dir=folder)
        (tmp / target).mkdir()
        before = tree(tmp)
        code, err = run_main(name, [a.format(dir=folder, tmp=".") for a in argv])
        assert tree(tmp) == before
    assert_one_line_usage_error(code, err, "folder")


@pytest.mark.parametrize("case", list(MISSING_INPUT_CASES))
@FAST
@given(missing=NAMES)
def test_a_missing_input_is_one_line(case, missing):
    name, argv = MISSING_INPUT_CASES[case]
    with tempfile.TemporaryDirectory() as tmp_, contextlib.chdir(tmp_):
        tmp = Path(tmp_)
        _npz(tmp / "x.npz", b"\1" * 12)
        before = tree(tmp)
        code, err = run_main(name, [a.format(missing=f"nothere-{missing}.npz", tmp=".") for a in argv])
        assert tree(tmp) == before
    assert_one_line_usage_error(code, err, "nothere")
