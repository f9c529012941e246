"""No page of the documentation stops mid-sentence (issue #53: docs/hub.md ended "... and pass the folder", the
second cut-off page found in a row). Every paragraph and every list item of the README, docs/**/*.md and the
bundled model cards ends as a sentence ends; headings, tables, images, code and front matter are not prose."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
         *sorted((ROOT / "vit5_sit" / "assets").glob("*/README.md"))]  # the bundled models' cards

FENCE = re.compile(r"^\s*(```|~~~)")
ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+")  # a list item's first line
NOT_PROSE = re.compile(r"^\s*(#|<|\|)")  # headings, HTML, table rows
RULE = re.compile(r"^\s*([-*_=])(\s*\1){2,}\s*$")  # a thematic break (---, ***), or a setext heading's underline
IMAGE = re.compile(r"^\s*(!\[[^\]]*\]\([^)]*\)\s*)+$")  # a line of images and nothing else
CLOSERS = re.compile(r"[)\]*_`\"'’”]+$")  # what may follow a sentence's last mark: ")", "**", "`", quotes
SENTENCE_END = re.compile(r"[.!?:;]$")  # ":" and ";" end lead-ins to a code block, a table or a list


def _blocks(text: str) -> tuple[list[list[str]], str | None]:
    """The text's blocks (lines between blank lines or code fences, outside fences and front matter), and a
    problem of the page as a whole (an unclosed code fence or front matter) or None."""
    lines = text.splitlines()
    start = 0
    if lines and lines[0].strip() == "---":  # a model card's YAML front matter
        if "---" not in lines[1:]:
            return [], "its front matter (---) is never closed"
        start = lines.index("---", 1) + 1
    blocks, block, fence = [], [], None
    for line in lines[start:]:
        opened = FENCE.match(line)
        if fence is not None:
            fence = None if opened and opened.group(1) == fence else fence
            continue
        if opened or not line.strip():
            blocks, block = (blocks + [block] if block else blocks), []
            fence = opened.group(1) if opened else None
            continue
        block.append(line)
    if block:
        blocks.append(block)
    return blocks, (f"a code fence ({fence}) is never closed: the page stops inside it" if fence else None)


def _units(block: list[str]) -> list[list[str]]:
    """A block cut into its paragraph and list items (each item with its continuation lines)."""
    units: list[list[str]] = []
    for line in block:
        if ITEM.match(line) or not units:
            units.append([])
        units[-1].append(line)
    return units


def ends_a_sentence(line: str) -> bool:
    return bool(SENTENCE_END.search(CLOSERS.sub("", line.rstrip())))


def cut_paragraphs(text: str) -> list[str]:
    """Every paragraph or list item of a markdown text that stops mid-sentence (its last line), and a table row cut
    short or a code fence left open. Not prose: headings, tables, images, HTML, fenced and indented code, front
    matter, and a one-line bold caption right before a table ("**`transport`**")."""
    blocks, problem = _blocks(text)
    cut = [problem] if problem else []
    for i, block in enumerate(blocks):
        if all(IMAGE.match(line) for line in block):
            continue
        if all(line.startswith("    ") for line in block) and not ITEM.match(block[0]):
            continue  # an indented code block (a formula)
        if block[0].lstrip().startswith("|"):
            cut += [f"a table row stops short: {row!r}" for row in block if not row.rstrip().endswith("|")
                    and not row.lstrip().startswith("<!--")]  # an include's end marker after a table is not a row
            continue
        if NOT_PROSE.match(block[0]) or RULE.match(block[-1]):
            continue  # a heading (also underlined), HTML, a horizontal rule
        caption = len(block) == 1 and block[0].startswith("**") and i + 1 < len(blocks) \
            and blocks[i + 1][0].lstrip().startswith("|")
        if caption:
            continue
        cut += [f"stops at {unit[-1].strip()[-100:]!r}" for unit in _units(block) if not ends_a_sentence(unit[-1])]
    return cut


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_paragraph_stops_mid_sentence(page):
    cut = cut_paragraphs(page.read_text())
    assert not cut, f"{page.relative_to(ROOT)}: {'; '.join(cut)} (finish the sentence)"


WHOLE = """---
license: mit
---
# Title

A paragraph that ends. Another line of it (with a bracket).
**Bold at the end.**

Lead-in to code:

```bash
python x.py --cut-here
```

    U = 1/d * integral of v    (an indented formula)

- a list item that ends;
- a list item over
  two lines, complete.
  - a nested item, ending with `code`.
1. Numbered, done!

> A quote that ends.

An underlined heading
---------------------

***

**`transport`**

| key | meaning |
|---|---|
| `a` | no full stop needed in a cell |

![an image](x.png) ![another](y.png)
"""


@pytest.mark.parametrize("cut, where", [
    ("**Bold at the end.**\n", "**Bold at the\n"),
    ("Lead-in to code:\n", "Lead-in to code\n"),
    ("- a list item over\n  two lines, complete.\n", "- a list item over\n  two lines, complete\n"),
    ("  - a nested item, ending with `code`.\n", "  - a nested item, ending with\n"),
    ("> A quote that ends.\n", "> A quote that\n"),
    ("| `a` | no full stop needed in a cell |\n", "| `a` | no full stop\n"),
    ("![an image](x.png) ![another](y.png)\n", "![an image](x.png) ![another](y.png)\n\nAnd pass the folder\n"),
    ("python x.py --cut-here\n```\n", "python x.py --cut-here\n"),
    ("---\n# Title", "# Title"),
])
def test_the_check_finds_each_kind_of_cut_and_passes_whole_markdown(cut, where):
    assert cut_paragraphs(WHOLE) == []
    assert WHOLE.count(cut) == 1
    found = cut_paragraphs(WHOLE.replace(cut, where))
    assert len(found) == 1, found
