"""Issue #52's guidance records, read the way benchmarks/guidance_frontier.py reads them (its `read_cells`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CELL = "auto:s800@3@0-0.5"  # the default guidance: autoguidance 3 on [0, 0.5], the step-800 guide


def _frontier():
    if "guidance_frontier" not in sys.modules:
        spec = importlib.util.spec_from_file_location("guidance_frontier", ROOT / "benchmarks" / "guidance_frontier.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["guidance_frontier"] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
    return sys.modules["guidance_frontier"]


def default_guidance_fids() -> dict[str, dict[int, float]]:
    """arm -> {training seed: FID-1K} of the default guidance's cell in docs/study/guidance."""
    cells = _frontier().read_cells(ROOT / "docs" / "study" / "guidance")
    return {c.arm: c.fid for c in cells if c.cell == DEFAULT_CELL}
