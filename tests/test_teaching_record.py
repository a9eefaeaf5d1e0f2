"""The hold rates notebooks/TEACHING.md states are the ones measured: written from the committed record
(notebooks/claims_hold_rates.json, made by scripts/claims_robustness.py), and one row per asserting wall claim."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from claims_robustness import RECORD, ROW, TEACHING, held_columns, measured_paragraph, rewrite_teaching  # noqa: E402
from kvlab.lessons import CLAIMS  # noqa: E402


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def rows() -> dict[str, tuple[str, str, str]]:
    out = {}
    for line in TEACHING.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3).strip(), m.group(4).strip())
    return out


def test_the_teaching_notes_state_the_recorded_rates_and_how_they_were_measured(record):
    text = TEACHING.read_text(encoding="utf-8")
    assert rewrite_teaching(text, record) == text, (
        "TEACHING.md's hold rates differ from notebooks/claims_hold_rates.json: run "
        "`python scripts/claims_robustness.py --teaching` (or measure anew with --json notebooks/claims_hold_rates.json)")
    assert measured_paragraph(record) in text


def test_every_asserting_wall_claim_has_a_row_with_its_notebook_and_a_recorded_rate(record):
    have, measured = rows(), held_columns(record)
    asserting = {c.name for c in CLAIMS.values() if c.clock == "wall" and c.asserts}
    assert asserting <= set(have), f"claims without a row in TEACHING.md's table: {sorted(asserting - set(have))}"
    assert asserting <= set(measured), f"claims the record did not measure: {sorted(asserting - set(measured))}"
    for name, (nb, quiet, loaded) in have.items():
        assert name in CLAIMS, f"TEACHING.md names {name}, which no lesson registers"
        assert CLAIMS[name].notebook.startswith(nb), (name, nb, CLAIMS[name].notebook)
        if name in asserting:
            assert (quiet, loaded) == measured[name]


def test_the_rewrite_replaces_only_the_rates_and_the_paragraph(record):
    name = next(iter(held_columns(record)))
    text = (f"before\n<!-- kvlab:hold-rates -->\nold words\n<!-- /kvlab:hold-rates -->\n"
            f"| `{name}` | 00 | 9/9 | 0/9 | why | *say* |\nafter\n")
    out = rewrite_teaching(text, record)
    quiet, loaded = held_columns(record)[name]
    assert f"| `{name}` | 00 | {quiet} | {loaded} | why | *say* |" in out and "old words" not in out
    assert out.startswith("before\n") and out.endswith("after\n")
    with pytest.raises(ValueError, match="hold-rates"):
        rewrite_teaching("no markers", record)
