"""The fold: what would answer a prediction or an exercise, hidden in a ``<details>`` until the learner clicks.

Plain HTML, so it opens with no kernel and no widget (JupyterLab, classic Notebook, Colab, nbviewer,
GitHub). The one home of the markup that predictions, verdicts and exercise solutions share.
"""
from __future__ import annotations

import html

REVEAL_CLASS = "kvlab-reveal"  # the class of every fold of an answer; the tests find answers by it


def folded(summary: str, body_html: str, *, indent: bool = True) -> str:
    """``body_html`` folded under a one-line ``summary`` (plain text), shown only when the learner clicks it."""
    body = f'<div style="margin-left:1.2em">{body_html}</div>' if indent else body_html
    return f'<details class="{REVEAL_CLASS}"><summary>{html.escape(summary)}</summary>{body}</details>'


def folded_solution(markdown: str) -> str:
    """An exercise's solution as markdown, folded under "Solution"."""
    return f"<details><summary>Solution</summary>\n\n{markdown}\n\n</details>"
