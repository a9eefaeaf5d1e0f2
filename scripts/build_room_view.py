"""Build notebooks/room/room_view.ipynb from its source room_view.py and run it once, keeping the outputs.

    python scripts/build_room_view.py

jupytext turns the percent-format source into a notebook; nbclient executes it in a fresh kernel of
this interpreter, in notebooks/room/ (so it reads sample_room.json), and the executed notebook is
written back: the teacher's copy, with the sample room's tables and figures, that nbval can check.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
ROOM_DIR = ROOT / "notebooks" / "room"


def main() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from notebook_run import _kernel_manager  # a kernel of this very interpreter

    nb = jupytext.read(ROOM_DIR / "room_view.py")
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb.metadata.pop("jupytext", None)
    start = time.perf_counter()
    NotebookClient(nb, km=_kernel_manager(), timeout=120, resources={"metadata": {"path": str(ROOM_DIR)}}).execute()
    nbformat.write(nb, ROOM_DIR / "room_view.ipynb")
    print(f"built {ROOM_DIR / 'room_view.ipynb'} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
