"""Write the README's "## Course map" section from kvlab.course.NOTEBOOKS (the one list of notebooks).

    python scripts/course_map.py           # rewrite the section in README.md
    python scripts/course_map.py --check   # exit 1 if the README's section differs (what tests/test_course.py checks)

Run it after adding or changing a Lesson in kvlab/course.py. Only that section of the README is touched.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvlab.course import course_map_section, readme_course_map, with_course_map

README = Path(__file__).resolve().parent.parent / "README.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the README is out of date")
    args = parser.parse_args()
    text = README.read_text(encoding="utf-8")
    if args.check:
        current = readme_course_map(text)
        if current == course_map_section():
            print("README.md course map matches kvlab.course.NOTEBOOKS")
            return 0
        print("README.md course map is out of date: run python scripts/course_map.py", file=sys.stderr)
        return 1
    updated = with_course_map(text)
    if updated != text:
        README.write_text(updated, encoding="utf-8")
        print("README.md: course map rewritten from kvlab.course.NOTEBOOKS")
    else:
        print("README.md: course map already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
