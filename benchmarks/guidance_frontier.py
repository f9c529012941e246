"""The guidance frontier over training seeds (issue #52): every guidance cell of `bench_guidance.py`, for each arm,
as the mean over the training seeds scored, with the FID change against the same seeds unguided per seed, paired,
with the study reports' percentile bootstrap interval over seeds (`vit5_sit.study.intervals`), digits and speckle; a
plot of FID against digits; and which cells meet the target (FID-1K >= 30% below unguided, paired over seeds,
with >= 99% of digits right).

Input: the durable records `bench_guidance.py --json` writes, one per (arm, training seed), named ARM-sSEED.json
(e.g. docs/study/guidance/sit-rope-s0.json for runs/study/sit-rope-s0 at 3,600 steps); rows of sample seed 0
(images 0-999) only, so every cell of one record shares its noise with its unguided row.

    python benchmarks/bench_guidance.py --model runs/study/sit-rope-s0 --out runs/guidance-sit-rope-s0 \\
        --guides s400=runs/study/sit-rope-s0/checkpoints/step_0000400 \\
        --cells cfg@1 cfg@2.5 auto:s400@1.5 --json docs/study/guidance/sit-rope-s0.json
    python benchmarks/guidance_frontier.py docs/study/guidance --md docs/study/guidance/frontier.md \\
        --plot docs/study/guidance/frontier.png

``--models LABEL=RECORD`` adds single models (one record each, e.g. the bundled flow demo and the one-step models at
1 and 2 steps) as a second table, each cell's change against the same record's unguided row: one training seed,
so no interval. NFE counts network passes per image (an improved-MeanFlow model takes its guidance as an input:
one pass a step, guided or not).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_guidance, beside this file
from bench_guidance import guidance_label  # noqa: E402

from vit5_sit.study.intervals import bootstrap_interval  # noqa: E402

RECORD_NAME = re.compile(r"^(?P<arm>[\w.-]+)-s(?P<seed>\d+)\.json$")
TARGET_DROP = 0.30      # the target: FID-1K at least 30% below unguided ...
TARGET_DIGITS = 0.99    # ... with at least 99% of digits right
ROOT = Path(__file__).resolve().parents[1]
# The single models of the committed frontier (--models' default): the bundled flow demo and the bundled one-step
# model (the demo converted with iMF and x-prediction, 2,055 steps, the last 411 with the shortcut) at 1 and 2
# steps, the velocity-predicting conversion at 2,466 steps, and the study's sit-rope seed 0 converted with iMF
# (configs/mnist/convert-sit-rope-imf.yaml), each record relative to the repository.
MODELS = {"demo (flow)": "docs/study/guidance/demo.json",
          "demo-1step (iMF, x-pred., shortcut), 1 step": "docs/study/meanflow-convert/demo-imf-xs-2055-1nfe.json",
          "demo-1step (iMF, x-pred., shortcut), 2 steps": "docs/study/meanflow-convert/demo-imf-xs-2055-2nfe.json",
          "demo -> iMF (velocity), 1 step": "docs/study/meanflow-convert/demo-imf-2466-1nfe.json",
          "demo -> iMF (velocity), 2 steps": "docs/study/meanflow-convert/demo-imf-2466-2nfe.json",
          "sit-rope s0 -> iMF, 1 step": "docs/study/meanflow-convert/sit-rope-imf-822-1nfe.json",
          "sit-rope s0 -> iMF, 2 steps": "docs/study/meanflow-convert/sit-rope-imf-822-2nfe.json"}


@dataclass(frozen=True)
class Cell:
    arm: str
    cell: str
    label: str
    nfe: int
    fid: dict[int, float]        # by training seed
    unguided: dict[int, float]   # the same seeds' unguided FID
    digits: dict[int, float]
    speckle: dict[int, float]

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(sorted(self.fid))

    def mean(self, values: dict[int, float]) -> float:
        return sum(values.values()) / len(values)

    def change(self) -> tuple[float, tuple[float, float] | None]:
        """The mean over training seeds of each seed's relative FID change against its own unguided FID (paired:
        what a seed makes better or worse in both cancels), with the percentile bootstrap 95% interval of that
        mean (None for one seed)."""
        changes = [self.fid[s] / self.unguided[s] - 1 for s in self.seeds]
        return sum(changes) / len(changes), bootstrap_interval(changes)

    def meets_target(self) -> bool:
        """At least 30% below unguided (the paired interval's upper end when there is one, else the mean) with
        at least 99% of digits right on average."""
        change, interval = self.change()
        worst = interval[1] if interval is not None else change
        return worst <= -TARGET_DROP and self.mean(self.digits) >= TARGET_DIGITS


def label(row: dict) -> str:
    if row["scale"] == 1.0:
        return "none"
    what = guidance_label(row)
    interval = "" if list(row["interval"]) == [0.0, 1.0] else f" [{row['interval'][0]:g}, {row['interval'][1]:g}]"
    return f"{what} {row['scale']:g}{interval}"


def read_cells(folder: Path) -> list[Cell]:
    """The cells of every ARM-sSEED.json record in ``folder`` (sample seed 0 rows), grouped by (arm, cell)."""
    by: dict[tuple[str, str], dict[int, dict]] = {}
    for path in sorted(folder.glob("*.json")):
        m = RECORD_NAME.match(path.name)
        if not m:
            continue
        arm, seed = m.group("arm"), int(m.group("seed"))
        for row in json.loads(path.read_text())["rows"]:
            if row["seed"] == 0:
                by.setdefault((arm, row["cell"]), {})[seed] = row
    cells = []
    for (arm, name), rows in sorted(by.items()):
        unguided = by.get((arm, "cfg@1"), {})
        seeds = [s for s in rows if s in unguided]
        if not seeds:
            continue
        first = rows[seeds[0]]
        cells.append(Cell(arm, name, label(first), first["nfe"], {s: rows[s]["fid"] for s in seeds},
                          {s: unguided[s]["fid"] for s in seeds}, {s: rows[s]["digit_accuracy"] for s in seeds},
                          {s: rows[s]["speckle"] for s in seeds}))
    return cells


def read_models(models: list[str]) -> list[Cell]:
    """The cells of single-model records (``LABEL=RECORD``), the label as the arm and training seed 0."""
    cells = []
    for item in models:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_file():
            raise SystemExit(f"--models {item!r}: give LABEL=RECORD, RECORD a bench_guidance.py --json file")
        rows = {row["cell"]: row for row in json.loads(Path(path).read_text())["rows"] if row["seed"] == 0}
        if "cfg@1" not in rows:
            raise SystemExit(f"--models {item!r}: {path} has no unguided row (cfg@1) of sample seed 0")
        unguided = rows["cfg@1"]["fid"]
        for cell, row in sorted(rows.items()):
            cells.append(Cell(name, cell, label(row), row["nfe"], {0: row["fid"]}, {0: unguided},
                              {0: row["digit_accuracy"]}, {0: row["speckle"]}))
    return cells


def table(cells: list[Cell]) -> str:
    lines = ["| arm | guidance | NFE | training seeds | FID-1K | change vs unguided [95% paired bootstrap] | digits "
             "| speckle | target |", "|---|---|---:|---|---:|---:|---:|---:|---|"]
    for c in sorted(cells, key=lambda c: (c.arm, c.cell != "cfg@1", c.label)):
        change, interval = c.change()
        shown = "" if c.cell == "cfg@1" else f"{100 * change:+.1f}%" + (
            f" [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]" if interval is not None else "")
        target = "" if c.cell == "cfg@1" else ("yes" if c.meets_target() else "no")
        lines.append(f"| {c.arm} | {c.label} | {c.nfe} | {', '.join(map(str, c.seeds))} | {c.mean(c.fid):.1f} | "
                     f"{shown} | {c.mean(c.digits):.3f} | {100 * c.mean(c.speckle):.2f}% | {target} |")
    return "\n".join(lines)


def best_at_digits(cells: list[Cell], guidance: str) -> Cell | None:
    """The lowest mean FID among an arm's cells of one kind of guidance (``cfg`` or ``auto``) with >= 99% of
    digits right, among those measured on every training seed of the arm's unguided row when any is (so the pick
    is not a mean over fewer, luckier seeds)."""
    mine = [c for c in cells if c.cell != "cfg@1" and c.cell.startswith(guidance) and
            c.mean(c.digits) >= TARGET_DIGITS]
    seeds = {s for c in cells if c.cell == "cfg@1" for s in c.seeds}  # the arm's: every seed scored unguided
    everywhere = [c for c in mine if set(c.seeds) == seeds]
    return min(everywhere or mine, key=lambda c: c.mean(c.fid), default=None)


def versus_table(cells: list[Cell]) -> str:
    """Per arm: the best autoguidance against the best classifier-free guidance at equal digit accuracy (>= 99%),
    each seed's FID ratio paired over the seeds both measured, with the percentile bootstrap 95% interval of its
    mean; autoguidance wins where the whole interval is below 0."""
    lines = ["| arm | autoguidance | best CFG | training seeds | FID-1K auto / CFG | auto vs CFG [95% paired "
             "bootstrap] | digits auto / CFG | auto wins |", "|---|---|---|---|---:|---:|---:|---|"]
    for arm in sorted({c.arm for c in cells}):
        mine = [c for c in cells if c.arm == arm]
        auto, cfg = best_at_digits(mine, "auto"), best_at_digits(mine, "cfg")
        if auto is None or cfg is None:
            continue
        seeds = sorted(set(auto.seeds) & set(cfg.seeds))
        if not seeds:
            continue
        ratios = [auto.fid[s] / cfg.fid[s] - 1 for s in seeds]
        mean, interval = sum(ratios) / len(ratios), bootstrap_interval(ratios)
        shown = f"{100 * mean:+.1f}%" + (f" [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]" if interval else "")
        wins = (interval[1] if interval else mean) < 0
        fid = f"{sum(auto.fid[s] for s in seeds) / len(seeds):.1f} / {sum(cfg.fid[s] for s in seeds) / len(seeds):.1f}"
        digits = (f"{sum(auto.digits[s] for s in seeds) / len(seeds):.3f} / "
                  f"{sum(cfg.digits[s] for s in seeds) / len(seeds):.3f}")
        lines.append(f"| {arm} | {auto.label} | {cfg.label} | {', '.join(map(str, seeds))} | {fid} | {shown} | "
                     f"{digits} | {'yes' if wins else 'no'} |")
    return "\n".join(lines)


def models_table(cells: list[Cell]) -> str:
    """Single models: one record each, so the change is that record's, without an interval."""
    lines = ["| model | guidance | NFE | FID-1K | change vs its unguided | digits | speckle | target |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    order = {c.arm: i for i, c in reversed(list(enumerate(cells)))}
    for c in sorted(cells, key=lambda c: (order[c.arm], c.cell != "cfg@1", c.nfe, c.label)):
        change, _ = c.change()
        shown = "" if c.cell == "cfg@1" else f"{100 * change:+.1f}%"
        target = "" if c.cell == "cfg@1" else ("yes" if c.meets_target() else "no")
        lines.append(f"| {c.arm} | {c.label} | {c.nfe} | {c.mean(c.fid):.1f} | {shown} | {c.mean(c.digits):.3f} | "
                     f"{100 * c.mean(c.speckle):.2f}% | {target} |")
    return "\n".join(lines)


def plot(cells: list[Cell], out: Path, models: list[Cell] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    for arm in sorted({c.arm for c in cells}):
        mine = [c for c in cells if c.arm == arm]
        xs, ys = [c.mean(c.digits) for c in mine], [c.mean(c.fid) for c in mine]
        ax.scatter(xs, ys, label=arm)
        for c, x, y in zip(mine, xs, ys, strict=True):
            ax.annotate(c.label, (x, y), fontsize=7, xytext=(3, 2), textcoords="offset points")
    for name in dict.fromkeys(c.arm for c in models):  # single models: crosses, labelled with their NFE
        mine = [c for c in models if c.arm == name]
        xs, ys = [c.mean(c.digits) for c in mine], [c.mean(c.fid) for c in mine]
        ax.scatter(xs, ys, marker="x", label=name)
        for c, x, y in zip(mine, xs, ys, strict=True):
            ax.annotate(f"{c.label}, {c.nfe} NFE", (x, y), fontsize=6, xytext=(3, -7), textcoords="offset points")
    ax.axvline(TARGET_DIGITS, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("digits right (classifier)")
    ax.set_ylabel("FID-1K (mean over training seeds)")
    ax.set_title("Guidance frontier, 3,600 steps (arms: Euler 6, mean over training seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="folder of ARM-sSEED.json records (bench_guidance.py --json)")
    p.add_argument("--md", default=None, help="also write the table here (generated: not edited by hand)")
    p.add_argument("--plot", default=None, help="also plot FID against digits here (PNG)")
    p.add_argument("--models", nargs="*", default=None, metavar="LABEL=RECORD",
                   help="single models (a bench_guidance.py --json record each) in a second table (default: "
                        "the bundled demos, MODELS; --models alone: none)")
    args = p.parse_args(argv)
    cells = read_cells(Path(args.folder))
    if not cells:
        raise SystemExit(f"{args.folder}: no ARM-sSEED.json record with an unguided row (cfg@1)")
    text = table(cells) + ("\n\nAutoguidance against classifier-free guidance at equal digit accuracy (the "
                           "lowest-FID cell of each with >= 99% of digits, among those on every seed of the arm; "
                           "paired by training seed):\n\n" + versus_table(cells))
    models = read_models(args.models if args.models is not None else
                         [f"{k}={ROOT / v}" for k, v in MODELS.items()])
    if models:
        text += ("\n\nSingle models (one training seed each; the change is against the same record's unguided row; "
                 "for the iMF model CFG s is its guidance input, one network pass a step):"
                 "\n\n" + models_table(models))
    print(text)
    if args.md:
        Path(args.md).write_text(f"<!-- generated by benchmarks/guidance_frontier.py: do not edit -->\n{text}\n")
    if args.plot:
        plot(cells, Path(args.plot), models)


if __name__ == "__main__":
    main()
