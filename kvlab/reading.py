"""What a learner reads: a notebook's main path, counted in words against its minutes.

The main path is every markdown cell less what sits inside ``<details>`` folds, plus the claim lines its run
shows unfolded (``verdicts(...)`` outside ``fold=True``). A *Going deeper* section is a heading that starts with
"Going deeper" and every cell under it up to the next heading of the same or a higher level; the notebook builder
folds its prose into ``<details>`` and saves its heading collapsed (JupyterLab's ``jp-MarkdownHeadingCollapsed``),
so a learner opens it by choice, and its checks are shown with ``fold=True``. ``Lesson.word_budget`` (:mod:`kvlab.course`) is what the main path may hold.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any, Iterator

WORD = re.compile(r"[A-Za-z0-9']+")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$", re.M)
DEEPER = re.compile(r"^going deeper\b", re.I)
DETAILS = re.compile(r"<details\b.*?</details>", re.S | re.I)
COMMENT = re.compile(r"<!--.*?-->", re.S)
TAG = re.compile(r"<[^>]+>")
CLAIM_LINE = re.compile(r'<div class="kvlab-claim"[^>]*>(.*?)</div>', re.S)
PLAIN_CLAIM = re.compile(r"^[✓✗•·] .*$", re.M)
COLLAPSED = "jp-MarkdownHeadingCollapsed"  # JupyterLab and Notebook 7 open such a heading folded


def _source(cell: Any) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def deeper_heading(cell: Any) -> int | None:
    """The level of the *Going deeper* heading that opens ``cell`` (a markdown cell), or None."""
    if cell["cell_type"] != "markdown":
        return None
    first = HEADING.search(_source(cell))
    return len(first.group(1)) if first and DEEPER.match(first.group(2).strip("*_ ")) else None


def main_path_cells(cells: list) -> Iterator[tuple[int, Any]]:
    """(index, cell) of the cells on the main path: outside every *Going deeper* section."""
    inside: int | None = None  # the level of the Going deeper heading we are under
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            levels = [len(m.group(1)) for m in HEADING.finditer(_source(cell))]
            level = deeper_heading(cell)
            if level is not None:
                inside = level if inside is None else min(inside, level)
                continue
            if inside is not None and levels and min(levels) <= inside:
                inside = None
        if inside is None:
            yield i, cell


def markdown_words(text: str) -> int:
    """Words a reader sees in a markdown cell: folds, comments and tags left out."""
    return len(WORD.findall(html.unescape(TAG.sub(" ", DETAILS.sub(" ", COMMENT.sub(" ", text))))))


def claim_lines(cell: Any) -> list[str]:
    """The claim lines a code cell's outputs show unfolded (folds of "every check on your run" left out)."""
    lines: list[str] = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        page = data.get("text/html")
        if page is not None:
            page = "".join(page) if isinstance(page, list) else page
            lines += [html.unescape(TAG.sub("", m)) for m in CLAIM_LINE.findall(DETAILS.sub(" ", page))]
        elif out.get("output_type") in ("execute_result", "display_data"):
            plain = data.get("text/plain", "")
            lines += PLAIN_CLAIM.findall("".join(plain) if isinstance(plain, list) else plain)
    return lines


@dataclass(frozen=True)
class MainPath:
    """What a notebook's main path holds: markdown words, claim lines and their words."""

    markdown: int
    claim_lines: int
    claim_words: int

    @property
    def words(self) -> int:
        return self.markdown + self.claim_words


def main_path(nb: Any) -> MainPath:
    """Count ``nb``'s main path (an executed notebook for its claim lines; a source counts markdown alone)."""
    md = n_claims = claim_words = 0
    for cell in nb["cells"]:  # a Going deeper section's prose and checks are folded (mark_collapsed, fold=True)
        if cell["cell_type"] == "markdown":
            md += markdown_words(_source(cell))
        else:
            lines = claim_lines(cell)
            n_claims += len(lines)
            claim_words += sum(len(WORD.findall(line)) for line in lines)
    return MainPath(md, n_claims, claim_words)


def mark_collapsed(cells: list) -> None:
    """Fold every *Going deeper* section: its heading saved collapsed (JupyterLab, Notebook 7), and the prose of its
    markdown cells inside a ``<details>`` (every renderer: Colab, the classic Notebook, nbviewer, GitHub), so only
    its heading is on the main path. Its code cells stay cells; their claim lines fold with ``fold=True``."""
    on_path = {i for i, _ in main_path_cells(cells)}
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown" or i in on_path:
            continue
        text = _source(cell)
        if deeper_heading(cell) is not None:
            cell.setdefault("metadata", {})[COLLAPSED] = True
            heading, _, rest = text.partition("\n")
            if rest.strip() and "<details" not in rest:
                cell["source"] = f"{heading}\n\n<details><summary>Read on</summary>\n\n{rest.strip()}\n\n</details>"
        elif "<details" not in text:
            cell["source"] = f"<details><summary>Going deeper (read on)</summary>\n\n{text.strip()}\n\n</details>"


__all__ = ["MainPath", "claim_lines", "deeper_heading", "main_path", "main_path_cells", "mark_collapsed"]
