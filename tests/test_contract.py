"""One contract per entry point (issue #44): every CLI flag, pipeline keyword, study-spec key, reference-file field
and scheduler field has its type and range in one table, and a new one cannot arrive without an entry.

The CLIs' parsers are walked as each command builds them (`contract.recording`), so a flag added anywhere, by any
command, without an entry in `vit5_sit.common.contract.FLAGS` fails here; and every flag's typo is one line naming
the closest right flag, exit code 2 (issue #45).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import io
import re
from pathlib import Path

import pytest

from vit5_sit.common import contract
from vit5_sit.common.contract import FLAGS, Parser, recording

ROOT = Path(__file__).resolve().parent.parent

# Every command: the table's name -> the module whose main(argv) runs it (the console scripts and `python -m`).
ENTRY_POINTS = {
    "sample": "vit5_sit.cli.sample",
    "train": "vit5_sit.cli.train",
    "eval_fid": "vit5_sit.cli.eval_fid",
    "study": "vit5_sit.study.__main__",
    "data": "vit5_sit.data.__main__",
    "demo": "vit5_sit.demo.export",
    "digit_classifier": "vit5_sit.demo.digit_classifier",
    "app": "vit5_sit.demo.app",
    "models": "vit5_sit.models.__main__",
    "repa_classifier": "vit5_sit.repa.classifier",
    "attention": "vit5_sit.eval.attention",
}


def parsers_of(name: str) -> list[Parser]:
    """Every parser (subcommands included) that command ``name`` builds, as it builds them (through --help)."""
    main = importlib.import_module(ENTRY_POINTS[name]).main
    with recording() as made, contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit):
        main(["--help"])
    return [p for top in made for p in top._parsers()]


def actions(parser: Parser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]


ALL = [(name, p, a) for name in ENTRY_POINTS for p in parsers_of(name) for a in actions(p)]


def test_every_cli_builds_its_parser_from_the_contract():
    """No command builds a plain argparse parser (its flags would pass unchecked): every module that parses
    arguments uses contract.Parser, and every one of them is an entry point above."""
    plain, commands = [], set()
    for path in (ROOT / "vit5_sit").rglob("*.py"):
        text = path.read_text()
        if "argparse.ArgumentParser(" in text and path.name != "contract.py":
            plain.append(str(path.relative_to(ROOT)))
        if "Parser(" in text:
            commands |= set(re.findall(r'\bcommand="(\w+)"', text))
    assert not plain, f"plain argparse parsers (use vit5_sit.common.contract.Parser): {plain}"
    assert commands == set(ENTRY_POINTS), "a command missing from ENTRY_POINTS (or a stale one)"
    for name in ENTRY_POINTS:
        assert parsers_of(name), name


@pytest.mark.parametrize("name, parser, action", ALL, ids=[f"{p.command}:{contract._name(a)}" for _, p, a in ALL])
def test_every_flag_has_a_contract_entry_that_fits_it(name, parser, action):
    entry = parser.contract(action)
    assert entry is not None, (f"{parser.command} {contract._name(action)} has no entry in "
                               "vit5_sit.common.contract.FLAGS: add its kind and range there")
    if isinstance(action, argparse._HelpAction | argparse._StoreTrueAction | argparse._StoreFalseAction):
        assert entry.kind == "switch"
    elif action.choices is not None and entry.kind != "list":
        assert entry.kind == "choice"
    else:
        assert entry.kind in ("int", "float", "path", "text", "device", "list"), entry
        assert action.type is not None and action.type.__wrapped__ is not None, "its checks are not installed"
    if entry.kind in ("int", "float"):
        assert entry.range is not None and entry.range.hi is not None, \
            f"{parser.command} {contract._name(action)}: every count and size has an upper bound with a reason"
        assert entry.range.why, "each bound says why"


def test_no_stale_entries():
    """Every entry of FLAGS is some command's flag (a renamed flag leaves none behind)."""
    used = set()
    for _, parser, action in ALL:
        name = contract._name(action)
        words = parser.command.split()
        used |= {f"{' '.join(words[:n])} {name}" for n in range(1, len(words) + 1)} | {name}
    assert not set(FLAGS) - used, f"entries of no flag: {sorted(set(FLAGS) - used)}"


@pytest.mark.parametrize("name, parser, action", [c for c in ALL if c[2].option_strings and
                                                  c[2].option_strings[-1] != "--help"],
                         ids=[f"{p.command}:{contract._name(a)}" for _, p, a in ALL if a.option_strings
                              and a.option_strings[-1] != "--help"])
def test_a_typo_of_every_flag_is_one_line_naming_the_right_flag(name, parser, action):
    """#45: a mistyped flag is one line naming it and the closest right flag, exit 2 (not 12 lines of usage)."""
    flag = contract._name(action)
    typo = flag[:3] + flag[4:] if len(flag) > 4 else flag + "x"  # one letter dropped
    prefix = parser.command.split()[1:]  # the subcommand
    err = io.StringIO()
    main = importlib.import_module(ENTRY_POINTS[name]).main
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([*prefix, typo, "1"])
        except SystemExit as e:
            code = e.code
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1, err.getvalue()
    assert lines[0].startswith(f"error: unrecognized argument {typo}"), lines[0]
    close = re.search(r"did you mean (\S+)\?", lines[0])
    assert close, lines[0]
    options = {o for p in parsers_of(name) if p.command.split()[1:2] == prefix[:1] or p.command == name
               for a in p._actions for o in a.option_strings}
    assert close.group(1) in options


def test_pipeline_keywords_each_have_an_entry():
    from vit5_sit.pipeline import PIPELINE_ARGS, Vit5SitPipeline

    keywords = set(inspect.signature(Vit5SitPipeline.__call__).parameters) - {"self"}
    assert keywords == set(PIPELINE_ARGS)


def test_study_keys_each_have_an_entry():
    from vit5_sit.study import spec

    source = inspect.getsource(spec.load_study) + inspect.getsource(spec._decision_spec)
    allowed = set()
    for group in re.findall(r"_known\([^,]+, \w+, \{([^}]*)\}", source):
        allowed |= set(re.findall(r'"(\w+)"', group))
    top = {"name", "output_dir", "results_dir", "steps", "seeds", "eval", "arms", "decision"}
    arm = {"name", "config", "overrides", "seeds", "label", "guide"}
    decision = {"reference", "candidates", "baseline", "min_seeds"}
    assert allowed == top | arm | decision  # the loader's sets, as read here
    evals = {f.name for f in dataclasses.fields(spec.EvalSpec)} | {"cfg_scale"}
    keys = top | {f"arms[].{k}" for k in arm} | {f"eval.{k}" for k in evals} | {f"decision.{k}" for k in decision}
    assert keys == set(spec.STUDY_FIELDS)


def test_reference_fields_cover_what_ref_writes():
    from vit5_sit.eval import evaluation
    from vit5_sit.eval.sources import REFERENCE_FIELDS

    source = inspect.getsource(evaluation)
    written = set(re.findall(r"np\.savez\(f, \*\*kept, \*\*stored, (.*?)\)", source, re.S)[0].replace("\n", " ")
                  .split("=")[:-1])
    written = {w.split(",")[-1].strip() for w in written} | {"mu", "sigma", "mu_s", "sigma_s", "features", "arr_0"}
    assert written <= set(REFERENCE_FIELDS)


def test_config_ranges_share_the_cli_bounds():
    from vit5_sit.config import RANGES

    assert RANGES["sampler.steps"] is contract.STEPS and RANGES["sampler.atol"] is contract.TOL
    assert RANGES["train.seed"] is contract.SEED and RANGES["log.sample_cfg_scale"] is contract.GUIDANCE
    assert FLAGS["--steps"].range is contract.STEPS and FLAGS["--tol"].range is contract.TOL
