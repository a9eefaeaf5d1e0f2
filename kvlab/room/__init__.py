"""The room: a workshop measured together. Every learner's run of a notebook, gathered by the teacher and viewed side by side.

- ``record``: a learner's run as one versioned JSON file (``LearnerRun``, ``validate``) and ``share(...)``, the
  one call at the end of a notebook that saves it or sends it.
- ``store``: the teacher's SQLite database of submissions (duplicates merged, newer runs superseding, history
  kept) and the import of a folder of dropped files.
- ``collector``: ``python -m kvlab room``, the FastAPI server learners submit to (a room key, kvlab's guards).
- ``view``: the room's tables (measured answers by device and threads, guesses against measurements, each
  claim's hold rate, machines that disagree) and one service curve pooled from everyone's 09 requests;
  ``figures``: the same as matplotlib figures. ``simulate``: a seeded room of simulated learners, to rehearse.

Opt-in and explicit: nothing leaves a learner's machine unless they call ``share``, and the file holds only
the name they type, allow-listed machine facts, and the lesson's numbers.
"""
from __future__ import annotations

from kvlab.room.record import ROOM_KEY_ENV, LearnerRun, RoomFileError, validate

__all__ = ["ROOM_KEY_ENV", "LearnerRun", "RoomFileError", "share", "validate"]


def share(name: str, notebook: str, predictions=(), verdicts=(), figures=None, requests=None, url: str | None = None,
          key: str | None = None, folder: str = ".", runtime: str | None = None) -> str:
    """Save this notebook's run for the room (``url`` None) or send it to the teacher's collector; never raises.

    ``predictions``: comparisons (``guess.against(measured)``) or ``(guess, measured)`` pairs, ``verdicts``: the
    lines ``verdicts(...)`` showed, ``figures``: ``{name: number}``, ``requests``: notebook 09's LoadTestResult.
    The key comes from ``key`` or ``$KVLAB_ROOM_KEY``. Returns one line saying what happened; when sending
    fails, the file is saved and the line says to download it and give it to the teacher.
    """
    from pathlib import Path

    from kvlab.room.record import machine_facts

    try:
        run = LearnerRun(name, notebook, machine=machine_facts(runtime=runtime))
        for p in predictions:
            if isinstance(p, tuple):
                run.add_prediction(p[0], p[1], question=p[2] if len(p) > 2 else None)
            else:
                run.add_prediction(p)
        run.add_verdicts(verdicts)
        for figure, value in (figures or {}).items():
            run.add_figure(figure, value)
        if requests is not None:
            run.add_requests(requests)
    except Exception as e:  # a bad name, an odd prediction: say so, never break the notebook
        return f"room: not shared — {e}"
    if url is None:
        try:
            path = run.save(Path(folder))
        except OSError as e:
            return f"room: could not save the file ({e}); nothing was shared"
        return f"room: saved {path} — give this file to your teacher (or share again with url=...)"
    try:
        return f"room: sent to {url} — {run.submit(url, key)}"
    except Exception as e:
        try:
            path = run.save(Path(folder))
            where = f"saved it as {path}: download that file and give it to your teacher"
        except OSError:
            where = "and could not save it either; ask your teacher"
        return f"room: not sent ({e}); {where}"
