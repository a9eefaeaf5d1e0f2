"""The course's minutes and TEACHING.md's plans fit the notebooks they name.

A notebook's minutes (kvlab/course.py) cover at least reading its main path's markdown (kvlab.reading) at READING_WPM, its Run All (as
recorded in the teacher's copy) and each exercise at its price (EXERCISE_MINUTES by what it asks for: a choice, a
number, a function, a build-it). A slot of the 90-minute plan covers the sections it names (their markdown read, each
exercise it names at its price); the half-day plan's slots are the minutes. Every exercise is on the main path: its
question is never folded away from its checker cell."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from kvlab import authoring
from kvlab.course import NOTEBOOKS, READING_WPM
from kvlab.lessons import EXERCISES
from kvlab.lessons.common.exercises import exercises_for
from kvlab.reading import COMMENT, DETAILS, main_path_cells, markdown_words

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
TEACHING = NOTEBOOK_DIR / "TEACHING.md"
SLOT = re.compile(r"^\| (\d):(\d\d)–(\d):(\d\d) \| (`(\d\d)_\w+\.ipynb`)? *\|(.*)$")


def section_words(file: str) -> dict[str, int]:
    """Main-path words of markdown under each ``## `` heading of a notebook's source ("" for the part before the
    first): folds and Going deeper sections left out, as kvlab.reading counts them."""
    nb = authoring.from_source(authoring.source_path(NOTEBOOK_DIR / file))
    words, heading = {"": 0}, ""
    for _, cell in main_path_cells(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for line in DETAILS.sub(" ", COMMENT.sub(" ", cell.source)).splitlines():
            if line.startswith("## "):
                heading = line[3:].strip()
                words.setdefault(heading, 0)
            words[heading] += markdown_words(line)
    return words


def run_minutes(file: str) -> float:
    meta = json.loads((NOTEBOOK_DIR / file).read_text())["metadata"].get("kvlab", {})
    return meta.get("run_s", 60) / 60


def plan(heading: str) -> list[tuple[int, str | None, str]]:
    """(minutes, notebook number or None, the rest of the row) of each slot of the plan under ``heading``."""
    text = TEACHING.read_text(encoding="utf-8")
    body = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in body.splitlines():
        m = SLOT.match(line)
        if m:
            h0, m0, h1, m1 = (int(x) for x in m.group(1, 2, 3, 4))
            rows.append(((h1 * 60 + m1) - (h0 * 60 + m0), m.group(6), m.group(7)))
    assert rows, f"no slots found under {heading!r}"
    return rows


def lesson(number: str):
    return next(n for n in NOTEBOOKS if n.file.startswith(number))


@pytest.mark.parametrize("entry", NOTEBOOKS, ids=lambda n: n.file[:2])
def test_a_notebooks_minutes_cover_reading_it_running_it_and_its_exercises(entry):
    words = sum(section_words(entry.file).values())
    exercises = exercises_for(entry.file)
    least = words / READING_WPM + run_minutes(entry.file) + sum(e.minutes for e in exercises)
    assert entry.minutes >= math.ceil(least), (
        f"{entry.file}: {entry.minutes} min planned, but {words} words at {READING_WPM}/min, its Run All and "
        f"{len(exercises)} exercises ({', '.join(f'{e.kind} {e.minutes}' for e in exercises)} min) take "
        f"{least:.1f}; raise its minutes in kvlab/course.py")


@pytest.mark.parametrize("entry", NOTEBOOKS, ids=lambda n: n.file[:2])
def test_every_exercise_sits_on_the_main_path_with_its_checker(entry):
    """An exercise's question folded into a Going deeper section while its checker cell prints "Not yet" on the main
    path (08, once) is half an exercise: every question is a main-path cell, as its checker is."""
    nb = authoring.from_source(authoring.source_path(NOTEBOOK_DIR / entry.file))
    on_path = {i for i, _ in main_path_cells(nb.cells)}
    folded = [c.source.split("\n", 1)[0] for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
              and re.search(r"^### Exercise \d+:", c.source, re.M) and i not in on_path]
    assert not folded, f"{entry.file}: exercise questions folded away from their checkers: {folded}"


def test_the_90_minute_plan_adds_up_and_each_slot_fits_the_sections_it_names():
    rows = plan("## A 90-minute workshop")
    assert sum(m for m, _, _ in rows) == 90
    for minutes, number, rest in rows:
        if number is None:
            continue
        entry = lesson(number)
        sections_cell, what = rest.split("|", 1)
        named = [s.strip() for s in sections_cell.split(";") if s.strip()]
        words = section_words(entry.file)
        assert named, f"the 90-minute plan's slot for {entry.file} names no section"
        missing = [s for s in named if s not in words]
        assert not missing, f"{entry.file} has no section {missing}; its sections: {[w for w in words if w]}"
        ordered = exercises_for(entry.file)
        exercises = sum(ordered[int(n) - 1].minutes for n in re.findall(r"\bExercise (\d+)\b", what))
        share = sum(words[s] for s in named) / sum(words.values())
        least = sum(words[s] for s in named) / READING_WPM + share * run_minutes(entry.file) + exercises
        assert minutes >= least, f"{entry.file}: {minutes} min for {named}, which take {least:.1f}"


def test_the_half_day_plan_gives_each_notebook_its_minutes_in_order():
    rows = plan("## A half-day workshop")
    slots = [(number, minutes) for minutes, number, _ in rows if number is not None]
    assert [n for n, _ in slots] == [n.file[:2] for n in NOTEBOOKS]
    for number, minutes in slots:
        assert minutes == lesson(number).minutes, f"{number}: {minutes} min in the half-day plan, {lesson(number).minutes} in kvlab/course.py"
    total = sum(m for m, _, _ in rows)
    heading = TEACHING.read_text(encoding="utf-8").split("## A half-day workshop", 1)[1].splitlines()[0]
    h, m = re.search(r"about (\d) h (\d+) min", heading).groups()
    assert total == int(h) * 60 + int(m), f"the half-day plan's slots add up to {total} min; its heading says {heading}"
