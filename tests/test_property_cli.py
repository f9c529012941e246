"""Property-based (hypothesis): values from outside each command-line contract, for every flag of every command.

Each case calls the command's ``main(argv)`` in this process and asserts what docs/robustness.md promises: one line
on stderr starting with ``error:``, exit code 2, no traceback, nothing written, every input file unchanged. The
flags come from the parsers themselves (tests/test_contract.py walks them), so a new flag is drawn for as soon as
it has its contract entry.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import math
import os
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import stated_bounds as stated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_contract import ALL, ENTRY_POINTS

from vit5_sit.common import contract

FAST = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Text that is no number in any contract: empty, words, non-ASCII digits (Python's int() reads '٣' as 3), numbers
# too large for a float, not-a-number, infinities, hexadecimal.
NOT_NUMBERS = st.sampled_from(["", " ", "abc", "nan", "NaN", "inf", "-inf", "1e400", "-1e400", "٣", "１２", "0x1F",
                               "1,5", "None", "ü", "1e", "--"])


def outside(bound: stated.Bound, kind: str) -> st.SearchStrategy[str]:
    """Text for a flag of kind int / float / list that its stated bound (tests/stated_bounds.py, not the contract
    the flag is checked by) refuses."""
    options = [NOT_NUMBERS]
    whole = kind == "int" or (kind == "list" and bound.integer)
    if bound.lo is not None:
        if whole:
            options.append(st.integers(min_value=-10**40, max_value=math.ceil(bound.lo) - 1 + bound.lo_open).map(str))
        else:
            options.append(st.floats(max_value=bound.lo, exclude_max=not bound.lo_open, allow_nan=False,
                                     allow_infinity=False).map(repr))
    if bound.hi is not None:
        if whole:
            options.append(st.integers(min_value=math.floor(bound.hi) + 1 - bound.hi_open, max_value=10**40).map(str))
        else:
            options.append(st.floats(min_value=bound.hi, exclude_min=not bound.hi_open, allow_nan=False,
                                     allow_infinity=False).map(repr))
    if kind == "int":  # not a whole number
        options.append(st.floats(min_value=-1e6, max_value=1e6).filter(lambda x: not x.is_integer()).map(repr))
    strategy = st.one_of(*options)
    if kind == "list":  # one bad item among good ones
        good = repr(stated.edges(bound)[1][0])
        strategy = strategy.filter(lambda s: "," not in s and s.strip()).map(lambda s: f"{good},{s}")
    return strategy


def _numeric(parser, action) -> bool:
    entry = parser.contract(action)
    return entry is not None and (entry.kind in ("int", "float") or entry.kind == "list" and entry.range is not None)


# Every flag with a number in it: the contract's numeric flags and every flag the stated bounds name (a flag whose
# range was deleted from the contract stays here, and its stated bound is drawn from).
NUMERIC = [(name, parser, action) for name, parser, action in ALL
           if _numeric(parser, action) or stated.lookup(stated.FLAGS, parser.command, contract._name(action))]


def _bound(parser, action) -> stated.Bound:
    line = stated.lookup(stated.FLAGS, parser.command, contract._name(action))
    assert line is not None, (f"{parser.command} {contract._name(action)}: a numeric flag without a stated bound; add "
                              "its line to tests/stated_bounds.py FLAGS")
    return stated.parse(line)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes (a folder: its name)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(root.rglob("*"))}


def _never_serve(*args, **kwargs):
    raise AssertionError("the page was built: a drawn value was accepted, and the server would start (and hang)")


def run_main(name: str, argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` of command ``name``: (exit code, stderr). The page (app) is never served: a value that
    passes its checks fails the test instead of starting a server that never returns."""
    err = io.StringIO()
    main = importlib.import_module(ENTRY_POINTS[name]).main
    serving = mock.patch("vit5_sit.demo.app.build_app", _never_serve) if name == "app" else contextlib.nullcontext()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), serving:
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
    bad = data.draw(outside(_bound(parser, action), parser.contract(action).kind), label=flag)
    values = [bad] * (action.nargs if isinstance(action.nargs, int) else 1)
    argv = [*parser.command.split()[1:], *([f"{flag}={bad}"] if len(values) == 1 else [flag, *values])]
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        code, err = run_main(name, argv)
        assert not os.listdir(tmp), "something was written"
    assert_one_line_usage_error(code, err, flag)


def test_every_stated_bound_is_a_flags():
    """No stale line in tests/stated_bounds.py FLAGS: each names a numeric flag of some command."""
    used = {line for _, parser, action in NUMERIC
            for line in [f"{' '.join(parser.command.split()[:n])} {contract._name(action)}"
                         for n in range(1, len(parser.command.split()) + 1)] + [contract._name(action)]}
    assert not set(stated.FLAGS) - used, sorted(set(stated.FLAGS) - used)


@pytest.mark.parametrize("name, parser, action", NUMERIC,
                         ids=[f"{p.command}:{contract._name(a)}" for _, p, a in NUMERIC])
def test_a_flags_check_refuses_just_outside_and_takes_the_ends_of_its_stated_bound(name, parser, action):
    """The ends of each stated bound, through the flag's own parsing (its type and the contract's checks): a bound
    loosened in the contract lets a refused value through; a tightened one refuses an end."""
    bound, kind = _bound(parser, action), parser.contract(action).kind
    refused, accepted = stated.edges(bound)
    good = repr(accepted[0])
    def text(value) -> str:
        written = value if isinstance(value, str) else repr(value)
        return f"{good},{written}" if kind == "list" else written

    for value in [*refused, "٣", "１２", "٣.٥"]:
        with pytest.raises(argparse.ArgumentTypeError):
            action.type(text(value))
    for value in accepted:
        action.type(text(value))  # no error


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
