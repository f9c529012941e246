"""Issue #53: no command writes inside the package's assets (the bundled model folders that every entry point
loads by name, their samples.png, the digit classifier): one rule, `checks.protected_output_problem`, applied to
every output flag as the arguments are parsed (defaults included) and wherever an output folder is prepared
(`checks.writable_folder`: run folders, study folders, sample.py's default file). Only `demo export --out` and
`digit_classifier train --out` may write there: they regenerate those files on purpose.

The end-to-end cases point the rule at a stand-in assets folder in a temporary directory, so a regression cannot
overwrite a tracked file."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_contract import ALL
from test_property_cli import assert_one_line_usage_error, run_main, tree

from vit5_sit.common import checks, contract
from vit5_sit.hub.files import ASSETS, BUNDLED_MODELS

FAST = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Every output flag (or positional) of every command, with the rest of a command line that reaches its check.
# {p}: the stand-in assets folder, however spelled.
CASES = {
    "sample --out": ("sample", ["--out", "{p}/demo/samples.png"]),
    "sample --save-images": ("sample", ["--save-images", "{p}/demo/images"]),
    "eval_fid ref --out": ("eval_fid", ["ref", "--data", "x.npz", "--out", "{p}/demo/r.npz"]),
    "eval_fid calc --json": ("eval_fid", ["calc", "--samples", "x.npz", "--ref", "x.npz", "--json", "{p}/demo/m.json"]),
    "eval_fid compare --out": ("eval_fid", ["compare", "x.npz", "--ref", "x.npz", "--out", "{p}/demo"]),
    "study --out": ("study", ["report", "study.yaml", "--out", "{p}/demo"]),
    "data mnist out_dir": ("data", ["mnist", "{p}/demo/mnist"]),
    "data digits out_dir": ("data", ["digits", "{p}"]),
    "data encode --out": ("data", ["encode", "--data", "x.npz", "--out", "{p}/demo/latents"]),
    "repa_classifier --out": ("repa_classifier", ["--out", "{p}/demo/c.safetensors"]),
    "attention --json": ("attention", ["x.npz", "--json", "{p}/demo/a.json"]),
}
MAY_WRITE_ASSETS = {"demo export --out", "digit_classifier train --out"}
SPELLINGS = ("absolute", "relative", "dotdot", "link")


@pytest.fixture
def assets(tmp_path, monkeypatch):
    """A stand-in for the package's assets: a bundled folder with its samples.png (the rule is pointed at it)."""
    fake = tmp_path / "pkg" / "assets"
    (fake / "demo").mkdir(parents=True)
    (fake / "demo" / "samples.png").write_bytes(b"tracked")
    monkeypatch.setattr(checks, "PACKAGE_ASSETS", fake)
    return fake


def _spelled(fake: Path, how: str, cwd: Path) -> str:
    if how == "relative":
        return os.path.relpath(fake, cwd)
    if how == "dotdot":
        return f"{os.path.relpath(fake.parent, cwd)}/assets/demo/../../assets"
    if how == "link":
        link = cwd / "innocent"
        if not link.exists():
            link.symlink_to(fake)
        return "innocent"
    return str(fake)


def test_the_bundled_models_lie_in_the_protected_folder():
    assert ASSETS == checks.PACKAGE_ASSETS
    for name, folder in BUNDLED_MODELS.items():
        assert checks.protected_output_problem(folder / "samples.png"), name
        assert checks.protected_output_problem(folder), name
    assert checks.protected_output_problem(checks.PACKAGE_ASSETS)
    assert checks.protected_output_problem(checks.PACKAGE_ASSETS / "demo" / ".." / "x.png")
    assert checks.protected_output_problem(checks.PACKAGE_ASSETS.parent / "x.png") is None
    assert checks.protected_output_problem("samples.png") is None  # the working folder (tests run outside)


def test_a_link_or_a_working_folder_inside_the_assets_is_seen_through(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(BUNDLED_MODELS["demo"])
    assert checks.protected_output_problem(link / "samples.png")
    with contextlib.chdir(BUNDLED_MODELS["demo-1step"]):
        assert checks.protected_output_problem("samples_1step.png")  # the default name, from inside the folder


def test_every_output_flag_has_a_case_here_and_only_the_regenerators_may_write_the_assets():
    outputs = {f"{p.command} {contract._name(a)}" for _, p, a in ALL if (e := p.contract(a)) and e.role == "output"}
    allowed = {f"{p.command} {contract._name(a)}" for _, p, a in ALL
               if (e := p.contract(a)) and e.role == "output" and e.into_assets}
    assert allowed == MAY_WRITE_ASSETS
    assert outputs - MAY_WRITE_ASSETS == set(CASES), "an output flag without a case in CASES (or a stale case)"


@pytest.mark.parametrize("case", sorted(CASES))
@FAST
@given(how=st.sampled_from(SPELLINGS))
def test_an_output_inside_the_assets_is_one_line_and_nothing_is_written(assets, tmp_path, case, how):
    name, argv = CASES[case]
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    np.savez(work / "x.npz", arr_0=np.zeros((1, 2, 2, 3), np.uint8))
    (work / "study.yaml").write_text("name: s\n")
    before, before_work = tree(assets), tree(work)
    with contextlib.chdir(work):
        spelled = _spelled(assets, how, work)
        code, err = run_main(name, [a.format(p=spelled) for a in argv])
    assert tree(assets) == before
    assert {k: v for k, v in tree(work).items() if not k.startswith("innocent")} == \
        {k: v for k, v in before_work.items() if not k.startswith("innocent")}
    assert_one_line_usage_error(code, err, "package's own files")


def test_sample_from_inside_a_bundled_folder_keeps_its_samples_png(assets):
    with contextlib.chdir(assets / "demo"):
        code, err = run_main("sample", [])  # the default --out: samples.png, here
    assert (assets / "demo" / "samples.png").read_bytes() == b"tracked"
    assert_one_line_usage_error(code, err, "package's own files")


def test_a_run_folder_inside_the_assets_is_refused_before_training(assets):
    from vit5_sit.config import load_config
    from vit5_sit.train.preflight import PreflightError, check_run_folder

    cfg = load_config(None, [f"output_dir={assets}", "name=demo"])
    with pytest.raises(PreflightError, match="package's own files"):
        check_run_folder(cfg, log=lambda *_: None)
    assert tree(assets) == {"demo": b"<dir>", "demo/samples.png": b"tracked"}


def test_demo_export_may_regenerate_a_bundled_folder(assets, tmp_path):
    """Its --out passes the rule (it fails later, here for the missing run, not for the location)."""
    code, err = run_main("demo", ["export", str(tmp_path / "no-such-run"), "--out", str(assets / "demo")])
    assert code == 2 and "package's own files" not in err and "no-such-run" in err, err
    checks.output_folder(assets / "demo", "--out", into_assets=True)  # no error
    with pytest.raises(checks.UsageError, match="package's own files"):
        checks.output_folder(assets / "demo", "--out")


def test_class_ids_and_the_pages_numbers_take_ascii_digits_only():
    from vit5_sit.common.classes import ClassSpecError, check_class_id, parse_classes
    from vit5_sit.demo.app import DemoError, _real, _whole

    for text in ("٣", "１２", "3٣"):
        with pytest.raises(ClassSpecError, match="ASCII digits"):
            check_class_id(text, 10)
        with pytest.raises(ClassSpecError):
            parse_classes(text, 10)
        with pytest.raises(DemoError):
            _whole("steps", text, 1, 99)
        with pytest.raises(DemoError):
            _real("guidance", text)
    assert check_class_id("3", 10) == 3 and _whole("steps", "12", 1, 99) == 12 and _real("guidance", "1.5") == 1.5
