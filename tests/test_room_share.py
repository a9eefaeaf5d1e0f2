"""The one call at the end of every notebook: share_run gathers what this kernel predicted and checked, and shares
nothing until a name is typed."""
from __future__ import annotations

import json

from kvlab import authoring
from kvlab.course import NOTEBOOKS
from kvlab.lessons import verdicts
from kvlab.lessons.common import session
from kvlab.lessons.common.predict import predict
from kvlab.room import validate


def test_without_a_name_nothing_is_shared_and_the_line_says_how(tmp_path):
    line = session.share_run("", "01_the_slowdown.ipynb", folder=str(tmp_path))
    assert line.startswith("room: nothing shared") and "share_run(name=...)" in line
    assert not list(tmp_path.iterdir())


def test_the_file_holds_the_notebooks_predictions_and_only_its_own_claims(tmp_path):
    guess = predict("How many times as many tokens?", unit="×")
    guess.box.value = 2.0  # as the learner types it
    guess.against(3.5)
    guess.against(3.25)  # the cell run again: the latest counts, once
    verdicts({"prefill_s": 1.0}, "byte_tokens_are_utf8_bytes")  # another notebook's claim: not this one's file
    line = session.share_run("Ada", "00_start_here.ipynb", folder=str(tmp_path))
    assert line.startswith("room: saved"), line
    [path] = tmp_path.glob("*.json")
    run = validate(json.loads(path.read_text()))
    mine = [p for p in run.predictions if p["text"] == "How many times as many tokens?"]
    assert len(mine) == 1 and mine[0]["guess"] == 2.0 and mine[0]["measured"] == 3.25
    assert all(v["claim"] != "byte_tokens_are_utf8_bytes" for v in run.verdicts)
    assert "Ada" in path.read_text() and str(tmp_path) not in path.read_text()


def test_every_notebook_ends_with_the_share_cell_and_09_sends_its_client_records():
    for entry in NOTEBOOKS:
        cells = authoring.from_source(authoring.source_path(authoring.notebook_dir() / entry.file)).cells
        share = [c for c in cells if c.cell_type == "code" and "share_run(" in c.source]
        assert len(share) == 1, entry.file
        assert f'notebook="{entry.file}"' in share[0].source
        assert ("requests=result" in share[0].source) == (entry.file in authoring.ROOM_REQUESTS)


def test_09s_share_cell_names_the_section_whose_requests_it_sends():
    import re

    text = authoring.share_cells("09_measure_a_real_server.ipynb")[0].source
    [section] = re.findall(r"requests your client sent in \*([^*]+)\*", text)
    source = authoring.source_path(authoring.notebook_dir() / "09_measure_a_real_server.ipynb").read_text()
    heading = next(line for line in source.splitlines() if line.startswith("# ## ") and line.endswith(section))
    body = source.split(heading, 1)[1].split("\n# ## ", 1)[0]
    assert re.search(r"^result = ", body, re.M), f"{section!r} is not where 09 makes `result`"
