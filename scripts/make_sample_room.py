"""Write notebooks/room/sample_room.json: the room file of 30 simulated learners, through the collector's own rules.

    python scripts/make_sample_room.py [--learners 30] [--seed 0] [--out notebooks/room/sample_room.json]

Deterministic (kvlab.room.simulate is seeded, its clock fixed): the same command writes the same file,
except `exported_at` and the `received_at` stamps, which are pinned here too so the file only changes
when the simulation does.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from kvlab.room.simulate import T0, simulated_room
from kvlab.room.store import Store, room_file, write_room_file

OUT = Path(__file__).resolve().parent.parent / "notebooks" / "room" / "sample_room.json"


def sample_room(learners: int = 30, seed: int = 0) -> dict:
    """The room file: the simulated runs added to a fresh store one by one, as a collector would."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "room.sqlite")
        for run in simulated_room(learners, seed):
            store.add(run, source="simulated")
        rows = store.rows()
        store.close()
    for i, row in enumerate(rows):
        row["received_at"] = T0 + 60 * 20 + i  # pinned: the file changes only when the simulation does
    data = room_file(rows)
    data["exported_at"] = "2026-01-29T12:00:00Z"
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--learners", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    path = write_room_file(args.out, sample_room(args.learners, args.seed))
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
