"""Notebook sources: each notebook is written as a jupytext percent file beside its executed ``.ipynb``.

``notebooks/NN_name.py`` is what a maintainer edits: markdown cells read as markdown, code cells as
code, so an editor, a linter and ``grep`` see them. ``build`` turns a source into its notebook:

- a few *directives* are expanded from :mod:`kvlab.course` and :mod:`kvlab.lessons.common.exercises`, so the pieces
  every notebook shares live in one place:
  ``<!-- kvlab:header -->`` (first line of a markdown cell: title, badges, minutes),
  ``# kvlab:setup`` (a code cell: the setup cell), ``<!-- kvlab:navigation -->`` (sharing the run with the
  room, ``share_cells``, then previous/next links),
  ``<!-- kvlab:exercise check_name -->`` (question, answer cell and folded solution of one exercise);
- when every code cell is unchanged, the outputs of the committed notebook are kept and no kernel
  starts (a text-only edit changes only its own cells in the ``.ipynb``);
- when a code cell changed, the notebook is executed top to bottom (as nbval will) and saved with
  its new outputs, and the README's course map gets its new run time; nothing is ever written
  with its outputs silently wiped;
- an executed notebook records in its metadata (``metadata.kvlab.sources``) a hash of each source
  file behind it: the modules its ``Lesson.modules`` names (:mod:`kvlab.course`) and its claims
  lesson folder ``kvlab/lessons/lNN_*/``. When its cells are unchanged but one of those files is not,
  its outputs may be stale: it is re-executed, or with ``--check`` named in a warning line (a
  refactor that moves code changes no output, so that is not a failure unless ``--strict``).

The same sources also give the *workshop edition*, ``notebooks/workshop/NN_name.ipynb``, the copy a
learner opens (the badges and the README point at it): every output and execution count cleared
(nothing measured on the authors' machine, nothing that answers a prediction or an exercise),
exercise solutions folded as in the teacher's copy, a first line and ``metadata.kvlab.edition``
saying which edition it is, links relative to ``notebooks/`` rewritten to resolve from
``notebooks/workshop/`` (a link to another notebook of the course stays a sibling: the next
notebook's workshop edition), and the ``# NBVAL_CHECK_OUTPUT`` / ``# NBVAL_IGNORE_OUTPUT`` markers left out (there is no saved
output to compare; the teacher's copy checks them). It needs no kernel and is byte-for-byte
deterministic, so ``--check`` compares it with a fresh build.

    python -m kvlab notebooks                 # rebuild every notebook whose source or modules changed (+ workshop)
    python -m kvlab notebooks --workshop      # only the workshop edition (no kernel, a second)
    python -m kvlab notebooks 03 06           # only these (name prefixes)
    python -m kvlab notebooks --execute 01    # re-run 01 even if only text changed
    python -m kvlab notebooks --check         # exit 1 when a notebook (either edition) differs from its source
    python -m kvlab notebooks --check --strict  # ... or when its outputs are older than its modules
"""
from __future__ import annotations

import difflib
import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from kvlab.course import NOTEBOOKS, WORKSHOP_DIR, header, lesson, navigation, notebook_path, setup_cell
from kvlab.reading import mark_collapsed

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

_HEADER = re.compile(r"^<!-- kvlab:header -->[ \t]*\n?")
_NAVIGATION = re.compile(r"^<!-- kvlab:navigation -->\s*$")
_EXERCISE = re.compile(r"^<!-- kvlab:exercise (\w+) -->\s*$")
_SETUP = "# kvlab:setup"


def notebook_dir() -> Path:
    """The checkout's notebooks/ folder (sources and notebooks live side by side)."""
    return Path(__file__).resolve().parent.parent / "notebooks"


def source_path(notebook: Path) -> Path:
    """``NN_name.ipynb`` -> its source ``NN_name.py`` in the same folder."""
    return notebook.with_suffix(".py")


def module_files(modules: tuple[str, ...] | list[str], root: Path | None = None) -> list[Path]:
    """The source files of kvlab modules named by dotted name: a module's ``.py``, or every ``.py`` of a package.

    ``root`` is the folder holding ``kvlab/`` (default: this checkout's).
    """
    root = root or Path(__file__).resolve().parent.parent
    files: set[Path] = set()
    for name in modules:
        base = root.joinpath(*name.split("."))
        if base.with_suffix(".py").is_file():
            files.add(base.with_suffix(".py"))
        elif (base / "__init__.py").is_file():
            files.update(base.rglob("*.py"))
        else:
            raise ValueError(f"module {name!r} (in kvlab.course.NOTEBOOKS, Lesson.modules) has no source file "
                             f"{base.relative_to(root)}.py; fix its name there")
    return sorted(files)


def source_hashes(notebook: str, root: Path | None = None) -> dict[str, str]:
    """``{path: sha256[:16]}`` of every file behind ``notebook``'s outputs: its Lesson.modules and its claims module.

    Paths are relative to ``root``, the folder holding ``kvlab/`` (``kvlab/experiments/service_curves.py``);
    line endings are normalised, so a checkout with CRLF endings hashes the same.
    """
    root = root or Path(__file__).resolve().parent.parent
    files = module_files(lesson(notebook).modules, root)
    return {f.relative_to(root).as_posix():
            hashlib.sha256(f.read_bytes().replace(b"\r\n", b"\n")).hexdigest()[:16] for f in sorted(files)}


def stale_sources(recorded: dict[str, str] | None, current: dict[str, str]) -> list[str]:
    """The files whose hash differs from when the outputs were made (changed, added or removed), sorted.

    ``recorded`` None (a notebook executed before hashes were recorded) says nothing: never stale.
    """
    if recorded is None:
        return []
    return sorted(path for path in set(recorded) | set(current) if recorded.get(path) != current.get(path))


def _read_source(path: Path) -> nbformat.NotebookNode:
    try:
        import jupytext
    except ImportError as err:  # an authoring tool: learners never need it
        raise SystemExit("building notebooks needs jupytext: pip install -r requirements.txt") from err
    return jupytext.read(path, fmt="py:percent")


# The notebook whose client records go to the room's one service curve, and the variable that holds them.
ROOM_REQUESTS = {"09_measure_a_real_server.ipynb": "result"}


def share_cells(notebook: str) -> list:
    """The end of every notebook, before its navigation: sharing the run with a workshop's room (kvlab.room)."""
    requests = ROOM_REQUESTS.get(notebook)
    what = "this notebook's predictions and the verdicts of its claims" + (
        ", and the timings of the requests your client sent in *Measure at the client* (with when its clock "
        "started, so they are placed when they ran)" if requests else "")
    text = ("### Share your run with the room (optional)\n\n"
            "In a workshop your teacher may gather everyone's runs and show the room side by side: each "
            "prediction against what each machine measured, and how often each claim held across the room. "
            "Type your name below to take part; add `url=` and "
            "`key=` if your teacher gave them, or leave them out to save a file you hand in. What goes in: the "
            f"name you type, your machine's device, threads and versions, {what}. No paths, host names or "
            "prompts, and nothing at all while the name is empty.")
    args = f'name="", notebook="{notebook}"' + (f", requests={requests}" if requests else "")
    code = ("# NBVAL_CHECK_OUTPUT\n"
            "from kvlab.lessons.common.session import share_run\n\n"
            f"print(share_run({args}))   # name=\"Ada\", url=\"http://...\", key=\"...\" to send it to your teacher")
    return [new_markdown_cell(text), new_code_cell(code)]


def expand(cells: list, notebook: str) -> list:
    """Replace the directives in ``cells`` by the shared pieces they name (see the module docstring)."""
    from kvlab.lessons.common import exercises

    entry = lesson(notebook)
    number = notebook[:2]
    out, n_exercise = [], 0
    for cell in cells:
        text = cell.source
        if cell.cell_type == "markdown" and _HEADER.match(text):
            rest = _HEADER.sub("", text, count=1)
            out.append(new_markdown_cell(header(entry, number) + ("\n\n" + rest if rest.strip() else ""),
                                         metadata=cell.metadata))
        elif cell.cell_type == "markdown" and _NAVIGATION.match(text):
            out.extend(share_cells(notebook))
            out.append(new_markdown_cell(navigation(entry), metadata=cell.metadata))
        elif cell.cell_type == "markdown" and (match := _EXERCISE.match(text)):
            name = match.group(1)
            n_exercise += 1
            out.extend(exercises.cells(name, notebook, n_exercise))
        elif cell.cell_type == "code" and text.strip() == _SETUP:
            out.append(new_code_cell(setup_cell(), metadata=cell.metadata))
        else:
            out.append(cell)
    return out


def from_source(path: Path) -> nbformat.NotebookNode:
    """The notebook a source describes, without outputs."""
    cells = [(new_code_cell if cell.cell_type == "code" else new_markdown_cell)(
                 cell.source, metadata={k: v for k, v in cell.get("metadata", {}).items() if k != "lines_to_next_cell"})
             for cell in expand(_read_source(path).cells, path.with_suffix(".ipynb").name)]
    mark_collapsed(cells)  # Going deeper sections open folded
    return new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC, "language_info": {"name": "python"}})


def _key(cell) -> tuple[str, str]:
    return cell.cell_type, cell.source


def code_sources(nb: nbformat.NotebookNode) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def differences(committed: nbformat.NotebookNode, built: nbformat.NotebookNode) -> list[str]:
    """Human-readable lines saying where the committed notebook's cells differ from its source's."""
    a, b = ([f"{t}: {s}" for t, s in map(_key, nb.cells)] for nb in (committed, built))
    if a == b:
        return []
    opcodes = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
    return [f"notebook cells {i1}-{i2 - 1} vs source cells {j1}-{j2 - 1}: {tag} "
            f"({(a[i1] if i1 < i2 else b[j1])[:70]!r}…)" for tag, i1, i2, j1, j2 in opcodes if tag != "equal"]


def _carry_over(old: nbformat.NotebookNode, new: nbformat.NotebookNode, keep_outputs: bool) -> None:
    """Give ``new``'s cells the ids (and, when ``keep_outputs``, the outputs) of ``old``'s matching cells."""
    a, b = list(map(_key, old.cells)), list(map(_key, new.cells))
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag in ("equal", "replace") and (i2 - i1) == (j2 - j1):
            for i, j in zip(range(i1, i2), range(j1, j2)):
                if old.cells[i].cell_type == new.cells[j].cell_type:
                    new.cells[j]["id"] = old.cells[i]["id"]
    if keep_outputs:
        old_code = [c for c in old.cells if c.cell_type == "code"]
        for c_old, c_new in zip(old_code, (c for c in new.cells if c.cell_type == "code")):
            c_new.outputs = c_old.get("outputs", [])
            c_new.execution_count = c_old.get("execution_count")
    seen = set()
    for i, cell in enumerate(new.cells):  # new cells: a stable id from position and text, never a duplicate
        cid = cell.get("id")
        while not cid or cid in seen or not re.fullmatch(r"[a-zA-Z0-9-_]{1,64}", cid):
            cid = hashlib.sha1(f"{i}:{cid}:{cell.source}".encode()).hexdigest()[:8]
        cell["id"] = cid
        seen.add(cid)


def lighten(nb: nbformat.NotebookNode) -> None:
    """Drop saved widget state and cell timings: panels render again when the notebook runs."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # per-cell timestamps: noise in every diff
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data and WIDGET_VIEW in data:
                del data[WIDGET_VIEW]


def machine_paths() -> list[str]:
    """Absolute paths of this machine that must never end up in a committed notebook."""
    root = str(Path(__file__).resolve().parent.parent)
    paths = {root, str(Path.home()), sys.prefix, sys.base_prefix, os.getcwd()}
    return sorted((p for p in paths if p and p != "/"), key=len, reverse=True)


def execute(nb: nbformat.NotebookNode, cwd: Path) -> float:
    """Run ``nb`` top to bottom in a fresh python3 kernel (as nbval does); seconds taken."""
    from nbclient import NotebookClient

    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=False, record_timing=False,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    seconds = time.perf_counter() - start
    leaked = [p for p in machine_paths() if p in nbformat.writes(nb)]
    if leaked:
        raise SystemExit(f"an output holds this machine's path(s) {leaked}; fix the cell that prints it")
    return seconds


@dataclass
class BuildResult:
    notebook: str
    action: str  # "unchanged", "text", "executed", "written" (workshop), "out of date", "stale" (only with check)
    detail: str = ""


def _stale_note(files: list[str]) -> str:
    return f"outputs older than {', '.join(files)}"


def build(notebook: Path, *, force_execute: bool = False, check: bool = False) -> BuildResult:
    """Bring ``notebook`` in line with its source (see the module docstring); ``check`` only compares."""
    new = from_source(source_path(notebook))
    old = nbformat.read(notebook, as_version=4) if notebook.exists() else None
    sources = source_hashes(notebook.name)
    stale = stale_sources(old.metadata.get("kvlab", {}).get("sources"), sources) if old is not None else []
    in_line = old is not None and not differences(old, new)
    if in_line and not stale and not force_execute:
        return BuildResult(notebook.name, "unchanged")
    if check and in_line:
        return BuildResult(notebook.name, "stale", _stale_note(stale))
    if check:
        return BuildResult(notebook.name, "out of date",
                           "\n".join(differences(old, new)) if old is not None else "no .ipynb yet")
    text_only = old is not None and code_sources(old) == code_sources(new) and not stale and not force_execute
    if old is not None:
        _carry_over(old, new, keep_outputs=text_only)
    detail = ""
    if text_only:  # the saved run's metadata (language_info, run time) stays with its outputs
        assert old is not None  # text_only: there is a saved run
        new.metadata.update({k: v for k, v in old.metadata.items() if k != "widgets"})
    else:
        seconds = execute(new, notebook.parent)
        detail = f"executed in {seconds:.1f} s" + (f"; {_stale_note(stale)}" if stale else "")
        # run_s is what the course map quotes as the run time (see kvlab.course.run_seconds);
        # sources, what these outputs were made from (see stale_sources)
        new.metadata["kvlab"] = {"run_s": round(seconds), "cpu_count": os.cpu_count(), "sources": sources}
    lighten(new)
    nbformat.validate(new)
    nbformat.write(new, notebook)
    return BuildResult(notebook.name, "text" if text_only else "executed", detail)


# --- the workshop edition ------------------------------------------------------------------------

_LINK = re.compile(r"(\]\(<?|(?:href|src)=[\"'])([^)\"'\s>]+)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_CHECK_OUTPUT = re.compile(r"^# NBVAL_(?:CHECK|IGNORE)_OUTPUT[ \t]*(\n|$)", re.M)  # nbval's markers


def workshop_path(notebook: Path) -> Path:
    """``notebooks/NN_name.ipynb`` -> ``notebooks/workshop/NN_name.ipynb``, its workshop edition."""
    return notebook.parent / WORKSHOP_DIR / notebook.name


def workshop_links(markdown: str) -> str:
    """``markdown`` with its links relative to notebooks/ rewritten to resolve from notebooks/workshop/.

    A link to a notebook of the course stays as it is (its workshop edition is the sibling);
    any other relative link (``../README.md``, ``TEACHING.md``) gets ``../``; URLs and anchors are kept.
    """
    course = {n.file for n in NOTEBOOKS}

    def rewrite(m: re.Match) -> str:
        target = m.group(2)
        if _SCHEME.match(target) or target.startswith(("#", "/")) or target.split("#")[0] in course:
            return m.group(0)
        return f"{m.group(1)}../{target}"

    return _LINK.sub(rewrite, markdown)


def workshop_note(notebook: str) -> str:
    """The first line of a workshop notebook: which edition it is. It does not link the teacher's copy, whose saved
    outputs are the answer sheet (the teacher finds it beside this folder, and in the README)."""
    return ("> **Workshop edition.** Nothing here has been run yet, so every prediction, check and exercise "
            "waits for you. Run the cells one at a time from the top (Shift+Enter): when a box asks for your "
            "prediction, type it before you run the next cell. *Going deeper* sections are folded: open them "
            "when you have time.")


def workshop_edition(source: Path) -> nbformat.NotebookNode:
    """The workshop edition of a source ``notebooks/NN_name.py`` (see the module docstring); no kernel runs."""
    name = source.with_suffix(".ipynb").name
    nb = from_source(source)
    seen: set[str] = set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            cell.source = workshop_links(cell.source)
        else:
            cell.source = _CHECK_OUTPUT.sub("", cell.source)
            cell.outputs, cell.execution_count = [], None
        cid = hashlib.sha1(f"{i}:{cell.cell_type}:{cell.source}".encode()).hexdigest()[:8]
        while cid in seen:  # a stable id from position and text, never a duplicate
            cid = hashlib.sha1(cid.encode()).hexdigest()[:8]
        cell["id"] = cid
        seen.add(cid)
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    first.source = f"{workshop_note(name)}\n\n{first.source}"
    nb.metadata["kvlab"] = {"edition": "workshop", "teacher_copy": notebook_path(name, "teacher"),
                            "source": notebook_path(name, "teacher").removesuffix(".ipynb") + ".py"}
    nbformat.validate(nb)
    return nb


def workshop_text(source: Path) -> str:
    """The workshop edition of ``source`` as the exact text of its file (what is committed and compared)."""
    text = nbformat.writes(workshop_edition(source))
    return text if text.endswith("\n") else text + "\n"


def build_workshop(notebook: Path, *, check: bool = False) -> BuildResult:
    """Write ``notebook``'s workshop edition from its source (``check``: only compare with the file on disk)."""
    path = workshop_path(notebook)
    label = f"{WORKSHOP_DIR}/{notebook.name}"
    text = workshop_text(source_path(notebook))
    old = path.read_text(encoding="utf-8") if path.exists() else None
    if old == text:
        return BuildResult(label, "unchanged")
    if check:
        detail = ("no workshop edition yet" if old is None else
                  "\n".join(differences(nbformat.reads(old, as_version=4), nbformat.reads(text, as_version=4)))
                  or "metadata, outputs or cell ids differ")
        return BuildResult(label, "out of date", detail)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:  # the same bytes on every OS
        f.write(text)
    return BuildResult(label, "written")


def selected(prefixes: list[str], folder: Path | None = None) -> list[Path]:
    """The course's notebooks whose names start with one of ``prefixes`` (all when empty)."""
    names = [n.file for n in NOTEBOOKS]
    chosen = [n for n in names if not prefixes or any(n.startswith(p) for p in prefixes)]
    if prefixes and not chosen:
        raise SystemExit(f"no notebook starts with {prefixes}; the course has {', '.join(n[:2] for n in names)}")
    return [(folder or notebook_dir()) / n for n in chosen]


def update_course_map() -> None:
    """Rewrite the README's course map, whose run-time column comes from the notebooks just executed."""
    from kvlab.course import with_course_map

    readme = notebook_dir().parent / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.exists() else None
    if text is not None and (updated := with_course_map(text)) != text:
        readme.write_text(updated, encoding="utf-8")
        print("README.md: course map updated with the new run times")


def add_arguments(parser) -> None:
    """The options of ``python -m kvlab notebooks``."""
    parser.add_argument("only", nargs="*", help="notebook name prefixes, e.g. 03 06 (default: all)")
    parser.add_argument("--execute", action="store_true", help="re-run even when only text changed")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a notebook is out of date")
    parser.add_argument("--strict", action="store_true",
                        help="with --check: also exit 1 when a notebook's outputs are older than its modules")
    parser.add_argument("--workshop", action="store_true",
                        help=f"only the workshop edition, notebooks/{WORKSHOP_DIR}/ (no outputs; no kernel starts)")


def main(args) -> int:
    """Rebuild (or ``--check``) the selected notebooks; 1 when ``--check`` finds drift (or, ``--strict``, staleness)."""
    drift = stale = executed = 0
    workshop_only = getattr(args, "workshop", False)
    for path in selected(args.only):
        results = [] if workshop_only else [build(path, force_execute=args.execute, check=args.check)]
        results.append(build_workshop(path, check=args.check))
        for result in results:
            drift += result.action == "out of date"
            stale += result.action == "stale"
            executed += result.action == "executed"
            print(f"{result.notebook}: {result.action}" + (f" ({result.detail})" if result.detail else ""),
                  flush=True)
    if executed:
        update_course_map()
    if not args.check and not workshop_only:
        from kvlab import teachers_key

        if teachers_key.write(notebook_dir()):
            print(f"notebooks/{teachers_key.KEY_FILE}: the teacher's key rewritten from the saved runs")
    if drift:
        print(f"{drift} notebook(s) differ from their source: run python -m kvlab notebooks", file=sys.stderr)
    if stale:
        print(f"warning: {stale} notebook(s) have outputs older than the modules behind them (a refactor that "
              f"changes no output is fine): run python -m kvlab notebooks to re-execute them", file=sys.stderr)
    return 1 if drift or (stale and getattr(args, "strict", False)) else 0


if __name__ == "__main__":
    import argparse

    _parser = argparse.ArgumentParser(prog="python -m kvlab notebooks", description=__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
