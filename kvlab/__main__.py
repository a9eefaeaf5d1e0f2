"""``python -m kvlab``: the command line (see kvlab/cli.py)."""
from kvlab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
