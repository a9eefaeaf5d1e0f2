"""Each notebook's main path reads within its minutes: at READING_WPM, in READING_SHARE of the minutes it plans.

The main path (kvlab.reading) is the markdown outside folds and Going deeper sections plus the claim lines the
authors' run shows unfolded; a notebook shows at most MAIN_PATH_CLAIMS of those. Counted on the teacher's copy
(its saved outputs are the run the claim lines come from), so the test needs no kernel."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from kvlab.course import MAIN_PATH_CLAIMS, NOTEBOOKS, READING_SHARE, READING_WPM
from kvlab.reading import COLLAPSED, claim_lines, main_path, main_path_cells, mark_collapsed, markdown_words
from kvlab.lessons import verdicts
from kvlab.lessons.common.claims import CHECKS_CLASS

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("entry", NOTEBOOKS, ids=lambda n: n.file[:2])
def test_a_notebooks_main_path_reads_within_its_budget(entry):
    nb = nbformat.read(NOTEBOOK_DIR / entry.file, as_version=4)
    path = main_path(nb)
    print(f"{entry.file}: {path.words} words on the main path ({path.markdown} markdown + {path.claim_words} in "
          f"{path.claim_lines} claim lines) against {entry.word_budget} ({entry.minutes} min × {READING_SHARE:.0%} "
          f"× {READING_WPM} words/min)")
    assert path.words <= entry.word_budget, (
        f"{entry.file}: its main path holds {path.words} words, its {entry.minutes} minutes allow "
        f"{entry.word_budget}: move depth into a folded Going deeper section (### Going deeper: ...) or TEACHING.md, "
        f"never raise the minutes")
    assert path.claim_lines <= MAIN_PATH_CLAIMS, (
        f"{entry.file}: {path.claim_lines} claim lines on the main path (at most {MAIN_PATH_CLAIMS}); show the "
        f"others with verdicts(..., fold=True)")


@pytest.mark.parametrize("entry", NOTEBOOKS, ids=lambda n: n.file[:2])
def test_every_going_deeper_section_is_saved_folded(entry):
    for edition in (NOTEBOOK_DIR / entry.file, NOTEBOOK_DIR / "workshop" / entry.file):
        nb = json.loads(edition.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "markdown" and src.lstrip("#").strip().lower().startswith("going deeper"):
                assert cell["metadata"].get(COLLAPSED) is True, f"{edition.name}: {src[:60]!r} is not saved folded"


def _md(text):
    return nbformat.v4.new_markdown_cell(text)


def _code(html=None, plain=""):
    cell = nbformat.v4.new_code_cell("x")
    data = {"text/plain": plain}
    if html is not None:
        data["text/html"] = html
    cell.outputs = [nbformat.v4.new_output("execute_result", data=data, execution_count=1)]
    return cell


def test_going_deeper_sections_folds_and_folded_checks_are_off_the_main_path():
    cells = [_md("## One\n\nfour words on path"),
             _md("### Going deeper: the statistics\n\nmany words here that do not count"),
             _code('<div class="kvlab-claim">✓ on your run: inside the fold</div>'),
             _md("#### a sub-heading still inside\n\nnot counted"),
             _md("### Back on the path\n\nthree more words <details><summary>hidden</summary>not this</details>"),
             _code('<div class="kvlab-claim">✓ on your run: two lines</div>'
                   f'<details class="{CHECKS_CLASS}"><summary>every check</summary>'
                   '<div class="kvlab-claim">✓ on your run: folded away</div></details>')]
    kept = [i for i, _ in main_path_cells(cells)]
    assert kept == [0, 4, 5]
    cells[2].outputs[0]["data"]["text/html"] = (f'<details class="{CHECKS_CLASS}"><summary>every check</summary>'
                                                 + cells[2].outputs[0]["data"]["text/html"] + "</details>")  # fold=True
    mark_collapsed(cells)  # the builder folds the section's prose
    assert cells[1].metadata[COLLAPSED] and "<details>" in cells[1].source and "<details>" in cells[3].source
    path = main_path(nbformat.v4.new_notebook(cells=cells))
    assert path.markdown == markdown_words("## One\n\nfour words on path") + markdown_words(
        "### Going deeper: the statistics") + markdown_words("### Back on the path\n\nthree more words")
    assert path.claim_lines == 1 and path.claim_words == 5  # "✓ on your run: two lines"


def test_a_folded_verdicts_call_keeps_its_lines_in_plain_text_and_off_the_main_path():
    import pandas as pd

    shown = verdicts(pd.DataFrame(), "equal_lengths_same_schedule", fold=True)
    page = shown._repr_html_()
    assert CHECKS_CLASS in page and "every check on your run (1:" in page
    assert str(shown).count("on your run") == 1  # nbval and a terminal still see the line
    assert claim_lines(_code(page, str(shown))) == []
    assert len(claim_lines(_code(verdicts(pd.DataFrame(), "equal_lengths_same_schedule")._repr_html_()))) == 1
