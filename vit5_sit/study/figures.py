"""The figures that pages quote from a study, read from its durable record (``study.json``, written by
``vit5_sit.study.report``): one cell's mean ± sd over training seeds, of any metric, over all the seeds scored or a
named subset (a page written when a cell had 3 seeds quotes those 3), so a quoted figure can be checked against the
record (tests/test_docs_figures.py) or written from it.

    record = load_record("docs/study/generation/study.json")
    cell(record, "sit-rope", 3600).text()                  # '55.1 ± 1.9' (5 seeds, unguided FID-1000)
    cell(record, "sit-rope", 3600, seeds=3, cfg_scale=6).n  # 3: seeds 0, 1 and 2 only
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

from vit5_sit.study.report import mean_sd


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (arm, step, guidance, metric) cell of a study: the values of its training seeds, in seed order."""

    seeds: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return mean_sd(list(self.values))[0]

    @property
    def sd(self) -> float | None:  # None for one seed
        return mean_sd(list(self.values))[1]

    def text(self, digits: int = 1) -> str:
        """'mean ± sd' as the reports print it ('mean' alone for one seed)."""
        sd = self.sd
        return f"{self.mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}")


def load_record(path: str | Path) -> dict:
    """A study's ``study.json``."""
    return json.loads(Path(path).read_text())


def cell(record: dict, arm: str, step: int, *, cfg_scale: float = 1.0, metric: str = "fid",
         seeds: int | Iterable[int] | None = None,  # None: every seed scored; n: the first n; or the seed ids
         ) -> Cell:
    """The cell's scores at the study's main sample seed (its ``eval.sample_seed``; other sample seeds measure the
    sampling noise). Raises KeyError naming the cell when a seed asked for has no score."""
    main = record["eval"].get("sample_seed", 0)
    scored = {r["seed"]: r[metric] for r in record["rows"]
              if (r["arm"], r["step"], float(r.get("cfg_scale", 1.0)), r.get("sample_seed", main))
              == (arm, step, float(cfg_scale), main) and r.get(metric) is not None}
    if seeds is None:
        wanted = sorted(scored)
    elif isinstance(seeds, int):
        wanted = sorted(scored)[:seeds] if len(scored) >= seeds else list(range(seeds))
    else:
        wanted = list(seeds)
    missing = [s for s in wanted if s not in scored]
    if missing or not wanted:
        raise KeyError(f"{record.get('study')}: no {metric} of {arm} at step {step}, cfg {cfg_scale:g}, seeds "
                       f"{missing or wanted} (scored: {sorted(scored)})")
    return Cell(tuple(wanted), tuple(float(scored[s]) for s in wanted))
