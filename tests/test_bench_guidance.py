"""The guidance frontier's cells and table (benchmarks/bench_guidance.py): parsing, network calls, the table."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("bench_guidance", Path(__file__).parents[1] / "benchmarks" /
                                              "bench_guidance.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


@pytest.mark.parametrize("cell, want", [
    ("cfg@1", (None, 1.0, (0.0, 1.0))), ("cfg@3", (None, 3.0, (0.0, 1.0))),
    ("auto:s400@2", ("s400", 2.0, (0.0, 1.0))), ("cfg@4@0.3-1", (None, 4.0, (0.3, 1.0)))])
def test_cells_parse(cell, want):
    assert bench.parse_cell(cell) == want


@pytest.mark.parametrize("cell", ["cfg", "cfg@x", "auto:@2", "other@2", "cfg@2@0.3", "cfg@2@1@2"])
def test_bad_cells_are_one_message(cell):
    with pytest.raises(SystemExit, match="KIND@SCALE"):
        bench.parse_cell(cell)


def test_network_calls_count_the_guided_steps_only():
    assert bench.nfe_per_image(6, 1.0, (0.0, 1.0)) == 6
    assert bench.nfe_per_image(6, 3.0, (0.0, 1.0)) == 12
    assert bench.nfe_per_image(6, 3.0, (0.3, 1.0)) == 10  # t = 0 and 1/6 are not guided


def test_table_compares_each_cell_with_the_same_seeds_unguided():
    rows = [{"cell": c, "guidance": g, "guide": n, "scale": s, "interval": [0.0, 1.0], "seed": 0, "nfe": 12,
             "fid": f, "sfid": 1.0, "precision": 0.5, "recall": 0.5, "digit_accuracy": 0.99, "speckle": 0.001,
             "num_samples": 1000}
            for c, g, n, s, f in [("cfg@1", "cfg", None, 1.0, 60.0), ("cfg@3", "cfg", None, 3.0, 45.0),
                                  ("auto:a@2", "auto", "a", 2.0, 48.0)]]
    table = bench.table(rows).splitlines()
    assert table[2].startswith("| none | 1 |") and "| 60.0 |  |" in table[2]
    assert any(line.startswith("| CFG | 3 |") and "| 45.0 | -25.0% |" in line for line in table)
    assert any(line.startswith("| auto (a) | 2 |") and "| -20.0% |" in line for line in table)


# The figures the docs quote from the guidance frontier (docs/study/guidance/demo.json), written as
# "`CELL`: FID-1K F (C%), D% of digits": each checked against the record, so none can drift.
QUOTED = __import__("re").compile(r"`((?:cfg|auto:\w+)@[\d.]+(?:@[\d.]+-[\d.]+)?)`: FID-1K ([\d.]+) "
                                  r"\(([-+][\d.]+)%\), ([\d.]+)% of digits")
ROOT = Path(__file__).parents[1]
RECORD = ROOT / "docs" / "study" / "guidance" / "demo.json"


def _quotes():
    for page in ("README.md", "docs/sampling.md", "docs/demo.md", "benchmarks/README.md"):
        text = __import__("re").sub(r"\s+", " ", (ROOT / page).read_text())  # a quote over two lines is one
        looks = __import__("re").findall(r"`(?:cfg|auto:\w+)@[^`]*`: FID-1K [\d.]+ \(", text)
        quotes = list(QUOTED.finditer(text))
        assert len(looks) == len(quotes), f"{page}: a quoted figure not in the checked form: {looks}"
        yield from ((page, m) for m in quotes)


@pytest.mark.skipif(not RECORD.is_file(), reason="no guidance record committed yet (docs/study/guidance/demo.json)")
def test_quoted_guidance_figures_match_the_record():
    import json

    rows = {r["cell"]: r for r in json.loads(RECORD.read_text())["rows"] if r["seed"] == 0}
    quotes = list(_quotes())
    assert len(quotes) >= 4, "the docs quote the frontier's default and its alternatives"
    for page, m in quotes:
        cell, fid, change, digits = m.group(1), float(m.group(2)), float(m.group(3)), float(m.group(4))
        row = rows[cell]
        base = rows["cfg@1"]["fid"]
        assert (fid, change, digits) == (round(row["fid"], 1), round(100 * (row["fid"] / base - 1), 1),
                                         round(100 * row["digit_accuracy"], 1)), f"{page}: {m.group(0)}"


@pytest.mark.skipif(not RECORD.is_file(), reason="no guidance record committed yet (docs/study/guidance/demo.json)")
def test_the_committed_table_is_the_records():
    import json

    rows = json.loads(RECORD.read_text())["rows"]
    table = (ROOT / "docs" / "study" / "guidance" / "demo.md").read_text()
    assert bench.table(rows) in table
