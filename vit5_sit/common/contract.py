"""The contract of every command-line flag: what its value is and which values it takes, in one table.

`FLAGS` maps each flag (``--steps``), or a flag of one command (``"study --steps"``, ``"eval_fid ref --out"``:
that command's own entry wins), to an `Arg`: its kind, its range with the reason for each bound, and, for paths,
whether the command reads or writes it. Every CLI builds its parser with `Parser`, an ``argparse.ArgumentParser``
that reads the table:

- a flag with an entry gets the entry's checks after its own ``type`` (a value out of range is refused while the
  arguments are parsed, naming the flag, the bound and why), and an output path that is, or resolves to, the same
  file as an input path of the same command is refused before any work;
- every mistake argparse finds is one line, ``error: ...``, exit code 2; an unknown flag names the closest right
  one (``error: unrecognized argument --stpes; did you mean --steps?``).

``tests/test_contract.py`` walks every parser of every command and fails for a flag without an entry: adding a
flag means adding its entry here. Only the standard library is imported (``--help`` stays fast).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------------------------------------
# Bounds shared by the CLIs, the config (vit5_sit.config.RANGES) and the pipeline.

MAX_STEPS = 10_000         # sampler steps: SiT's best sampler takes 250; a time grid of 1e9 steps allocated 8 GB
                           # before the first network call
MIN_TOL = 1e-10            # adaptive solvers' atol / rtol: far below float32's precision (1e-7), dopri5's step
                           # underflows ('underflow in dt') long before it is met
MAX_NFE = 2 * MAX_STEPS    # network evaluations of one batch by an adaptive solver (dopri5, ...): as many as the
                           # costliest fixed-step sampler may take (Heun at MAX_STEPS); dopri5 takes ~100-300 at its
                           # default tolerance, at tol 1e-10 with guidance 1000 it never stopped
MAX_GUIDANCE = 1_000.0     # classifier-free guidance: SiT and DiT use 1.5-4; far larger scales only overflow
MAX_IMAGES = 1_000_000     # images of one command (sample.py --num-samples, compare): 20x FID-50K
MAX_CALL_IMAGES = 10_000   # images of one pipeline call, held in memory together; more: sample.py --out X.npz
MAX_BATCH = 65_536         # images per forward: a larger batch does not fit any accelerator's memory
MAX_IMAGE_SIZE = 9_459     # pixels a side: the largest image PIL opens again (sample.py's grid)
MAX_SEED = 2**32 - 1       # seeds are non-negative 32-bit integers
MAX_WORKERS = 1_024        # processes / threads: more than any machine has cores
MAX_TRAIN_STEPS = 100_000_000  # training steps (a classifier's, a study's --until): far beyond any run
MIN_PORT = 1_024           # the page's port: ports below are privileged (only root may listen on them)


@dataclass(frozen=True)
class Range:
    """A numeric range; each bound says what it protects (``why``, shown in the error)."""

    lo: float | None = None    # None: unbounded below
    hi: float | None = None    # None: unbounded above
    lo_open: bool = False      # lo itself excluded
    hi_open: bool = False      # hi itself excluded
    why: str = ""              # what the bound protects, shown in the error

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is outside the range, e.g. ``must be in [1, 10000] (why)``, or None (None and bools pass:
        their type is the caller's to check)."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        low_bad = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        high_bad = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        if low_bad or high_bad:
            why = f" ({self.why})" if self.why else ""
            what = "a positive integer" if isinstance(value, int) and (self.lo, self.hi) == (1, None) else \
                self.describe()
            return f"must be {what}{why}"
        return None

    def check(self, key: str, value: Any, error: type[Exception] = ValueError) -> None:
        """Raise ``error("KEY=VALUE: must be ...")`` when ``value`` is outside the range."""
        problem = self.problem(value)
        if problem:
            from vit5_sit.common.checks import shown

            raise error(f"{key}={shown(value)}: {problem}")

    def describe(self) -> str:
        lo, hi = _number(self.lo), _number(self.hi)
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {lo}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {hi}"
        return "a finite number"


def _number(x: float | None) -> str:
    """A bound as written: integers whole (4294967295, not 4.29497e+09), other numbers short."""
    return str(x) if isinstance(x, int) else f"{x:g}" if x is not None else ""


def at_least(lo: float, why: str = "", hi: float | None = None) -> Range:
    return Range(lo=lo, hi=hi, why=why)


def above(lo: float, why: str = "", hi: float | None = None) -> Range:
    return Range(lo=lo, lo_open=True, hi=hi, why=why)


STEPS = Range(1, MAX_STEPS, why=f"at most {MAX_STEPS:,}: SiT's best sampler takes 250, and the time grid is "
                                "allocated before sampling")
TOL = Range(MIN_TOL, 1.0, why="tighter than 1e-10 is below float precision: the adaptive step underflows")
GUIDANCE = Range(0.0, MAX_GUIDANCE, why="1 = no guidance, 0 = unconditional; SiT uses 1.5-4")
SEED = Range(0, MAX_SEED, why="seeds are non-negative 32-bit integers")
BATCH = Range(1, MAX_BATCH, why="images per forward")
WORKERS = Range(0, MAX_WORKERS, why="0 = in this process")
UNIT = Range(0.0, 1.0, why="t: 0 = noise, 1 = data")

# The values a score can take, checked wherever scores are read back from files (a study's study.json, the
# evaluation caches): a negative FID or a precision of 1.5 is a damaged or edited file, never a result.
_SHARE = Range(0.0, 1.0, why="a share of the images")
METRIC_RANGES: dict[str, Range] = {
    "fid": Range(0.0, why="a Frechet distance"),
    "sfid": Range(0.0, why="a Frechet distance"),
    "is": Range(1.0, why="exp of a mean KL divergence"),
    "is_std": Range(0.0, why="a standard deviation"),
    "precision": _SHARE,
    "recall": _SHARE,
    "kid": Range(why="an unbiased MMD estimate: slightly negative when the sets agree"),
    "kid_std": Range(0.0, why="a standard deviation"),
    "digit_accuracy": _SHARE,
}


def metric_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be a score of metric ``name`` (`METRIC_RANGES`), or None (None: not measured; a
    name without an entry is not a score)."""
    entry = METRIC_RANGES.get(name)
    if entry is None or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number, got {type(value).__name__}"
    return entry.problem(float(value))

# ----------------------------------------------------------------------------------------------------------
# The flags.

KINDS = ("int", "float", "path", "text", "choice", "switch", "device", "list", "object")


@dataclass(frozen=True)
class Arg:
    """What a flag takes. ``kind``: int | float (with ``range``), path (``role`` input / output, ``suffixes`` it must
    end in), text (free text the command parses, e.g. --classes; never empty), choice (argparse ``choices``),
    switch (``store_true``), device (cpu, cuda, cuda:N; checked by `checks.parse_device`), list (comma-separated,
    each item in ``range``); object (Python arguments only: checked by the function's own rule, ``note`` says
    which)."""

    kind: str
    range: Range | None = None
    role: str | None = None                 # paths: 'input' (read) | 'output' (written); None: neither
    suffixes: tuple[str, ...] = ()          # output paths: the file name must end in one of these
    choices: tuple = ()                     # choice: the values it takes (Python arguments; argparse has its own)
    note: str = ""                          # object: the rule that checks it
    into_assets: bool = False               # outputs: may write inside the package's assets (only demo export,
                                            # which regenerates the bundled models); every other output is refused

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Arg.kind={self.kind!r}: choose one of {', '.join(KINDS)}")


def _int(r: Range) -> Arg:
    return Arg("int", r)


def _float(r: Range) -> Arg:
    return Arg("float", r)


IN, OUT = "input", "output"
SWITCH, TEXT, CHOICE, DEVICE = Arg("switch"), Arg("text"), Arg("choice"), Arg("device")
POSITIVE = _int(at_least(1))

FLAGS: dict[str, Arg] = {
    # Shared by several commands: one meaning, one range.
    "--help": SWITCH,
    "--ckpt": Arg("path", role=IN),
    "--one-step": SWITCH,
    "--preset": TEXT,
    "--classes": TEXT,
    "--per-class": _int(at_least(1, "grid columns", hi=MAX_IMAGES)),
    "--num-samples": _int(at_least(1, f"at most {MAX_IMAGES:,}: 20x FID-50K", hi=MAX_IMAGES)),
    "--seed": _int(SEED),
    "--cfg-scale": _float(GUIDANCE),
    "--guidance-interval": _float(UNIT),
    "--guide-channels": _int(at_least(1, "channels", hi=4096)),
    "--guide": Arg("path", role=IN),
    "--sampler": CHOICE,
    "--method": TEXT,
    "--steps": _int(STEPS),
    "--tol": _float(TOL),
    "--grid": CHOICE,
    "--scheduler": CHOICE,
    "--image-size": _int(at_least(1, f"pixels a side, at most {MAX_IMAGE_SIZE:,} (what PIL opens)",
                                  hi=MAX_IMAGE_SIZE)),
    "--vae": Arg("path", role=IN),
    "--save-images": Arg("path", role=OUT),
    "--batch-size": _int(BATCH),
    "--part-size": _int(at_least(1, "images per part file", hi=MAX_IMAGES)),
    "--device": DEVICE,
    "--no-progress": SWITCH,
    "--out": Arg("path", role=OUT),
    "--json": Arg("path", role=OUT),
    "--data": Arg("path", role=IN),
    "--resolution": _int(at_least(1, "pixels a side", hi=MAX_IMAGE_SIZE)),
    "--num-workers": _int(WORKERS),
    "--metrics": TEXT,
    "--inception-weights": Arg("path", role=IN),
    # train.py
    "train --config": Arg("path", role=IN),
    "train --resume": TEXT,            # 'auto' or a checkpoint folder: train's preflight checks it
    "train --print-config": SWITCH,
    "train overrides": Arg("list"),    # KEY=VALUE: each checked by vit5_sit.config (RANGES)
    # eval_fid.py
    "eval_fid ref --out": Arg("path", role=OUT, suffixes=(".npz",)),
    "eval_fid ref --keep-images": SWITCH,
    "eval_fid calc --samples": Arg("path", role=IN),
    "eval_fid calc --ref": Arg("path", role=IN),
    "eval_fid calc --kid-subset-size": _int(at_least(1, "images per KID subset", hi=MAX_IMAGES)),
    "eval_fid calc --pr-exact": SWITCH,
    "eval_fid compare runs": Arg("path", role=IN),
    "eval_fid compare --ref": Arg("path", role=IN),
    "eval_fid compare --sample-batch-size": _int(BATCH),
    "eval_fid compare --every": _int(at_least(1, "steps", hi=MAX_TRAIN_STEPS)),
    "eval_fid compare --guide": TEXT,  # auto, step:N or a folder: checked by vit5_sit.eval.compare
    "eval_fid compare --pr-exact": SWITCH,
    # python -m vit5_sit.study
    "study command": CHOICE,
    "study spec": Arg("path", role=IN),
    "study --jobs": _int(at_least(1, "training runs at a time", hi=MAX_WORKERS)),
    "study --threads": _int(at_least(1, "CPU threads per run", hi=MAX_WORKERS)),
    "study --until": _int(at_least(1, "a training step", hi=MAX_TRAIN_STEPS)),
    "study --arms": Arg("list"),
    "study --seeds": Arg("list", SEED),
    "study --steps": Arg("list", at_least(1, "checkpoint steps", hi=MAX_TRAIN_STEPS)),
    "study --no-noise": SWITCH,
    "study --retrain-scored": SWITCH,
    # python -m vit5_sit.data
    "data mnist out_dir": Arg("path", role=OUT),
    "data digits out_dir": Arg("path", role=OUT),
    "data --limit-per-class": _int(at_least(1, "images per digit", hi=MAX_IMAGES)),
    "data encode --shard-size": _int(at_least(1, "images per shard", hi=MAX_IMAGES)),
    "data encode --dtype": CHOICE,
    "data encode --save-dtype": CHOICE,
    "data encode --verify": SWITCH,
    "data encode --part": _int(at_least(0, "this process's part, below --num-parts", hi=MAX_WORKERS)),
    "data encode --num-parts": _int(at_least(1, "processes sharing the work", hi=MAX_WORKERS)),
    "data encode --vae": Arg("path", role=IN),
    # python -m vit5_sit.demo (export)
    "demo export run": Arg("path", role=IN),
    "demo export --out": Arg("path", role=OUT, into_assets=True),  # `--out vit5_sit/assets/demo` remakes the demo
    "demo export --no-samples": SWITCH,
    "demo export --push": TEXT,        # OWNER/NAME: checked by vit5_sit.hub.api before the export
    "demo export --private": SWITCH,
    "demo export --measured": Arg("path", role=IN),  # bench_guidance.py --json records of the checkpoint
    # python -m vit5_sit.demo.digit_classifier
    "digit_classifier --classifier": Arg("path", role=IN),
    "digit_classifier train --out": Arg("path", role=OUT, into_assets=True),  # default: the bundled classifier
    # python -m vit5_sit.app, vit5-sit-demo
    "app --model": Arg("path", role=IN),
    "app --host": TEXT,
    "app --port": _int(Range(MIN_PORT, 65535, why=f"a TCP port; below {MIN_PORT} only root may listen")),
    "app --allow": Arg("list"),
    "app --max-evals": _int(at_least(1, "network evaluations of one grid", hi=10**9)),
    "app --max-queue": _int(at_least(1, "waiting calls", hi=10**6)),
    # python -m vit5_sit.models
    "models --input-size": _int(at_least(1, "input height = width", hi=MAX_IMAGE_SIZE)),
    # python -m vit5_sit.repa.classifier
    "repa_classifier --kind": CHOICE,
    "repa_classifier --channels": CHOICE,
    "repa_classifier --out": Arg("path", role=OUT, suffixes=(".safetensors",)),
    "repa_classifier --steps": _int(at_least(1, "training steps", hi=MAX_TRAIN_STEPS)),
    "repa_classifier --lr": _float(above(0, "a learning rate", hi=10.0)),
    "repa_classifier --depth": _int(at_least(1, "blocks", hi=1024)),
    "repa_classifier --hidden-size": _int(at_least(1, "channels", hi=65_536)),
    "repa_classifier --num-heads": _int(at_least(1, "attention heads", hi=1024)),
    # python -m vit5_sit.eval.attention
    "attention models": Arg("path", role=IN),
    "attention --t": Arg("list", UNIT),
    "attention --num": _int(at_least(1, "real items in the batch", hi=MAX_BATCH)),
    "attention --no-ema": SWITCH,
    "attention --data": Arg("path", role=IN),
}


def value_problem(value: Any, entry: Arg) -> str | None:
    """Why a Python argument ``value`` is outside ``entry`` (a pipeline's keyword, a config field), or None."""
    import numbers

    if entry.kind == "int":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return f"expected a whole number, got a {type(value).__name__}"
        value = int(value)
    elif entry.kind == "float":
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return f"expected a number, got a {type(value).__name__}"
        value = float(value)
        if not math.isfinite(value):
            return "must be a finite number"
    elif entry.kind == "switch":
        return None if isinstance(value, bool) else f"expected True or False, got a {type(value).__name__}"
    elif entry.kind == "choice":
        return None if isinstance(value, str) and value in entry.choices else \
            f"choose one of {', '.join(map(str, entry.choices))}"
    elif entry.kind == "list":
        if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
            return f"expected a sequence of numbers, got a {type(value).__name__}"
        for item in value:
            if isinstance(item, bool) or not isinstance(item, numbers.Real) or not math.isfinite(float(item)):
                return f"expected finite numbers, got {item!r}"
            if entry.range is not None and (problem := entry.range.problem(float(item))):
                return f"{problem}, got {item!r}"
        return None
    if entry.range is not None and entry.kind in ("int", "float"):
        return entry.range.problem(value)
    return None


def check_arguments(table: dict[str, Arg], values: dict[str, Any], error: type[Exception] = ValueError,
                    prefix: str = "") -> None:
    """Every argument of ``values`` that ``table`` names (``prefix`` + name: "eval." for a section), by its entry;
    None is 'not given' (the default decides). Raises ``error("NAME=VALUE: must be ...")`` for the first one outside
    its entry."""
    from vit5_sit.common.checks import shown

    for name, value in values.items():
        entry = table.get(prefix + name)
        if entry is not None and value is not None and (problem := value_problem(value, entry)):
            raise error(f"{prefix}{name}={shown(value, quote=isinstance(value, str))}: {problem}")


def contract_for(command: str, name: str) -> Arg | None:
    """The entry of flag (or positional) ``name`` of ``command`` ("eval_fid ref"): the command's own, then its
    parents' ("eval_fid"), then the shared one."""
    words = command.split()
    for n in range(len(words), 0, -1):
        entry = FLAGS.get(f"{' '.join(words[:n])} {name}")
        if entry is not None:
            return entry
    return FLAGS.get(name)


def _name(action: argparse.Action) -> str:
    """The table's name of an argparse action: its first long option (``--steps``), else its dest."""
    longs = [s for s in action.option_strings if s.startswith("--")]
    return longs[0] if longs else action.option_strings[0] if action.option_strings else action.dest


def suffix_problem(path: str, suffixes: tuple[str, ...]) -> str | None:
    if suffixes and not path.lower().endswith(tuple(s.lower() for s in suffixes)):
        want = " or ".join(suffixes)
        return f"must be a file name ending in {want}, got {path!r}; e.g. {Path(path).with_suffix(suffixes[0]).name}"
    return None


def _checked(entry: Arg, parse):
    """``parse`` (the flag's own argparse type) followed by the entry's checks."""
    from vit5_sit.common import checks

    if parse is None:
        parse = {"int": checks.integer, "float": checks.finite_float, "path": checks.path_text}.get(entry.kind)

    @functools.wraps(parse if parse is not None else _text)
    def check(text: str):
        if parse is None and isinstance(text, str) and not text.strip():
            raise argparse.ArgumentTypeError("is empty (an unset variable?); give a value")
        if isinstance(text, str) and (problem := ascii_number_problem(text, entry)):
            raise argparse.ArgumentTypeError(problem)  # before the flag's own type: int('٣') is 3
        value = parse(text) if parse is not None else text
        items = value if isinstance(value, list | tuple) else [value]
        if entry.range is not None:
            for item in items:
                if isinstance(item, int | float) and not isinstance(item, bool):
                    problem = entry.range.problem(item)
                    if problem:
                        raise argparse.ArgumentTypeError(f"{problem}, got {checks.shown(item)}")
        if entry.kind == "path" and entry.suffixes and isinstance(value, str):
            if os.path.isdir(value):
                raise argparse.ArgumentTypeError(f"{value} is a folder; give a file name ending in "
                                                 f"{' or '.join(entry.suffixes)}")
            problem = suffix_problem(value, entry.suffixes)
            if problem:
                raise argparse.ArgumentTypeError(problem)
        return value

    return check


def _text(text: str) -> str:
    return text


def ascii_number_problem(text: str, entry: Arg) -> str | None:
    """Why ``text`` cannot be the value of a numeric flag (kind int or float, or a list of numbers), or None:
    digits of other scripts ('٣', '１２') are refused for every one, whatever its own type (Python's int() and
    float() read them as 3 and 12, so ``--port=٣`` meant port 3)."""
    numeric = entry.kind in ("int", "float") or (entry.kind == "list" and entry.range is not None)
    if not numeric or text.isascii():
        return None
    from vit5_sit.common.checks import shown

    what = "an integer" if entry.kind == "int" else "a number"
    return f"expected {what} in ASCII digits (0-9), got {shown(text, quote=True)}"


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths are, or resolve to, the same file or folder (links, ``..``, relative paths)."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


_recording: list[list[Parser]] = []
_strict: list[Parser] = []  # the parsers whose parse_args runs: no flag may be unknown


@contextlib.contextmanager
def recording() -> Iterator[list[Parser]]:
    """The `Parser` objects made within the block (the tests walk each command's parsers this way)."""
    made: list[Parser] = []
    _recording.append(made)
    try:
        yield made
    finally:
        _recording.remove(made)


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser that reads `FLAGS` (``command``: the table's name of the command, e.g. "sample"),
    answers every mistake with one line and exit code 2, and never takes a prefix of a flag for the flag."""

    def __init__(self, *args, command: str, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)  # a typo such as --class is an error, not a prefix match
        self.command = command
        super().__init__(*args, **kwargs)
        self._in_use: Parser | None = None  # the subcommand's parser of the last parse, for suggestions
        for made in _recording:
            made.append(self)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        entry = self.contract(action)
        if entry is not None and entry.kind in ("int", "float", "path", "text", "device", "list") \
                and not isinstance(action, argparse._StoreConstAction | argparse._HelpAction):
            action.type = _checked(entry, action.type)
        return action

    def _get_values(self, action: argparse.Action, arg_strings: list[str]):
        # argparse drops a '--' value (--batch-size=--) and stores [], unchecked: refused instead.
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            raise argparse.ArgumentError(action, "expected a value, got '--'")
        return super()._get_values(action, arg_strings)

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        add_parser, parent = action.add_parser, self

        def add(name: str, **kw) -> Parser:
            kw.setdefault("command", f"{parent.command} {name}")
            return add_parser(name, **kw)

        action.add_parser = add
        return action

    def contract(self, action: argparse.Action) -> Arg | None:
        """The `FLAGS` entry of one of this parser's actions, or None (a test fails for a flag without one)."""
        return contract_for(self.command, _name(action))

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        self._check_outputs(namespace)
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        _strict.append(self)  # every flag must be known: a typo is named even when another mistake comes first
        try:
            namespace, extras = self.parse_known_args(args, namespace)
        finally:
            _strict.remove(self)
        if extras:
            self._in_use = self._subcommand(namespace)
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def _subcommand(self, namespace) -> Parser:
        parser = self
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(namespace, action.dest, None) or "")
                if isinstance(chosen, Parser):
                    parser = chosen._subcommand(namespace)
        return parser

    def _parsers(self) -> Iterator[argparse.ArgumentParser]:
        """This parser and its subcommands' parsers, recursively."""
        yield self
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    yield from (sub._parsers() if isinstance(sub, Parser) else [sub])

    def _check_outputs(self, namespace) -> None:
        """An output path inside the package's assets (the bundled models) is refused, and so is an output path
        that is an input path of the same command: the input would be lost. Defaults are checked as given
        values are (``samples.png`` run from inside a bundled folder)."""
        from vit5_sit.common.checks import protected_output_problem

        roles: dict[str, list[tuple[str, str]]] = {IN: [], OUT: []}
        for action in self._actions:
            entry = self.contract(action)
            if entry is None or entry.role is None:
                continue
            value = getattr(namespace, action.dest, None)
            for v in value if isinstance(value, list | tuple) else [value]:
                if isinstance(v, str | os.PathLike) and str(v).strip():
                    roles[entry.role].append((_name(action), str(v)))
                    if entry.role == OUT and not entry.into_assets and (problem := protected_output_problem(v)):
                        self.error(f"{_flag_text(_name(action))} {v}: {problem}")
        for out_flag, out in roles[OUT]:
            for in_flag, source in roles[IN]:
                if same_file(out, source):
                    shown_in = "" if in_flag == out_flag else f"{_flag_text(in_flag)} "
                    self.error(f"{_flag_text(out_flag)} {out}: is the same {'folder' if os.path.isdir(out) else 'file'}"
                               f" as the input {shown_in}{source}; writing it would replace what is read: choose "
                               f"another {_flag_text(out_flag)}")

    def error(self, message: str):
        """One line, ``error: MESSAGE``, exit code 2 (argparse prints the whole usage first)."""
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            message = self._unknown(message[len(prefix):].split())
        elif _strict and (typos := self._typos()):  # "--sampels x": named, not "--samples is required"
            message = self._unknown(typos)
        elif (choice := re.match(r"argument (.+?): invalid choice: '(.*?)' \(choose from (.*)\)$", message)):
            choices = re.findall(r"'([^']*)'", choice.group(3))
            close = difflib.get_close_matches(choice.group(2), choices, n=1, cutoff=0.5)
            fix = f"did you mean {close[0]}?" if close else f"choose from {', '.join(choices)}"
            message = f"argument {choice.group(1)}: invalid choice {choice.group(2)!r}; {fix}"
        print(f"error: {message}", file=sys.stderr, flush=True)
        self.exit(2)

    def _typos(self) -> list[str]:
        """The flags of this parse (up to a ``--``) that no parser of this command knows."""
        known = {o for p in self._parsers() for a in p._actions for o in a.option_strings}
        typos = []
        for token in getattr(self, "_argv", []):
            if token == "--":
                break
            if token.startswith("--") and token.split("=", 1)[0] not in known:
                typos.append(token)
        return typos

    def _unknown(self, extras: list[str]) -> str:
        parser = self._in_use or self
        scope = [self, parser] if self._in_use is not None else list(self._parsers())
        options = sorted({s for p in scope for a in p._actions for s in a.option_strings if s.startswith("--")}
                         - {"--help"})
        flags = [e for e in extras if e.startswith("-")]
        if not flags:
            more = f" (and {len(extras) - 1} more)" if len(extras) > 1 else ""
            return f"unrecognized argument {extras[0]!r}{more}: {parser.prog} takes no further value here; --help " \
                "lists its flags"
        bad = flags[0].split("=", 1)[0]
        close = difflib.get_close_matches(bad, options, n=1, cutoff=0.5) or \
            difflib.get_close_matches("--" + bad.lstrip("-"), options, n=1, cutoff=0.5)
        more = f" (and {len(flags) - 1} more)" if len(flags) > 1 else ""
        fix = f"did you mean {close[0]}?" if close else "--help lists the flags"
        return f"unrecognized argument {bad}{more}; {fix}"


def _flag_text(name: str) -> str:
    """A positional's dest as users see it (OUT_DIR), a flag as written."""
    return name if name.startswith("-") else name.upper()
