"""The package's layers: every module imports only from its own layer or below, nothing inside imports the
root package, and no two modules import each other in a circle; the README draws the same table.

Every module under kvlab/ is parsed with `ast` (imports at module level and inside functions, relative
and absolute), so a lazy import inside a function counts as much as one at the top of the file. Each
offending edge is printed as `a -> b`, a circle as `a -> b -> ... -> a`.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvlab"

# The layer table, bottom to top: a module may import from its own layer or any layer below.
# A name is a module or a package (a package covers everything under it). The README's table in
# "How the package is laid out" lists the same layers in the same order (test_readme_draws_the_layer_table).
LAYERS: dict[str, list[str]] = {
    "base": ["kvlab.version", "kvlab.command_args", "kvlab.device", "kvlab.threads", "kvlab.allocator", "kvlab.env", "kvlab.clocks", "kvlab.results_io",
             "kvlab.rounds", "kvlab.progress", "kvlab.provenance", "kvlab.data", "kvlab.workload", "kvlab.traces"],
    "model": ["kvlab.cache", "kvlab.model", "kvlab.sampling", "kvlab.compiled", "kvlab.generate"],
    "serving": ["kvlab.serving", "kvlab.http", "kvlab.room"],
    "experiments": ["kvlab.experiments"],
    "lessons": ["kvlab.lessons"],
    "course": ["kvlab.benchmarks", "kvlab.course", "kvlab.reading", "kvlab.teachers_key", "kvlab.authoring", "kvlab.cli",
               "kvlab.__main__"],
    "api": ["kvlab"],
}
ROOT_PACKAGE = "kvlab"
# Layers that must not import a layer below them, though the table alone would let them.
SKIPPED: dict[str, list[str]] = {}
# Inside a layer, the order that still holds: a module of an earlier package here never imports a later one (the
# cache knows no model, the engine no HTTP, an experiment no lesson's presentation...).
WITHIN: dict[str, list[str]] = {
    "model": ["kvlab.cache", "kvlab.model", "kvlab.sampling", "kvlab.compiled", "kvlab.generate"],
    "serving": ["kvlab.serving", "kvlab.http", "kvlab.room"],
    "lessons": ["kvlab.lessons.common", "kvlab.lessons"],
}
# A lesson folder (kvlab.lessons.lNN_*) holds what its notebook shows, checks and asks: these modules at most.
LESSON_MODULES = ("panel", "figures", "claims", "exercises")
NAME_LESSONS = ("kvlab.course", "kvlab.authoring")  # the course table and the notebook builder: nothing else outside


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module under kvlab/, by dotted name (a package by its own name, for its __init__.py)."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The kvlab modules `name` imports, anywhere in its file. `from p import x` names p.x when x is a
    module, else p; relative imports are resolved against the module's package; an
    `importlib.import_module("kvlab....")` with a written-out name counts as an import too."""
    package = name if is_package(path) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return {target for target in found if target == ROOT_PACKAGE or target.startswith(ROOT_PACKAGE + ".")}


def resolve(target: str, known: set[str]) -> str:
    """The module a dotted import names: itself, or its longest known prefix (`kvlab.cache.base.X`)."""
    while target not in known and "." in target:
        target = target.rpartition(".")[0]
    return target


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: {resolve(t, known) for t in imports(name, path, known)} - {name}
            for name, path in found.items()}


def layer_of(name: str) -> int:
    """The layer index of a module: the layer of the longest table entry that is it or a package above it."""
    best, index = "", None
    for i, entries in enumerate(LAYERS.values()):
        for entry in entries:
            if (name == entry or name.startswith(entry + ".")) and len(entry) > len(best):
                best, index = entry, i
    assert index is not None, f"{name} is in no layer of the table; add it to LAYERS and the README"
    return index


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), each as a closed path a -> ... -> a."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [closed_path(group, edges) for group in groups]


def closed_path(group: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest circle through the group's first module, found by breadth-first search inside the group."""
    start, members = group[0], set(group)
    came_from = {start: ""}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return path[::-1] + [start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle found in {group}")


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


def test_no_module_imports_a_higher_layer():
    names = list(LAYERS)
    upward = [f"{a} -> {b}   ({names[layer_of(a)]} imports {names[layer_of(b)]})"
              for a, targets in sorted(graph().items()) for b in sorted(targets)
              if b != ROOT_PACKAGE and layer_of(b) > layer_of(a)]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_no_module_imports_a_layer_it_skips():
    names = list(LAYERS)
    skipped = [f"{a} -> {b}   ({names[layer_of(a)]} does not import {names[layer_of(b)]})"
               for a, targets in sorted(graph().items()) for b in sorted(targets)
               if names[layer_of(b)] in SKIPPED.get(names[layer_of(a)], ())]
    assert not skipped, "imports of a skipped layer:\n" + "\n".join(skipped)


def lesson_of(name: str) -> tuple[str, str] | None:
    """(lesson folder, module file) of a module inside a lesson folder, e.g. ("l06_under_load", "panel")."""
    parts = name.split(".")
    if len(parts) == 4 and parts[:2] == ["kvlab", "lessons"] and parts[2][:1] == "l" and parts[2][1:3].isdigit():
        return parts[2], parts[3]
    return None


def test_within_a_layer_the_order_holds():
    def rank(order: list[str], name: str) -> int | None:
        best = max((e for e in order if name == e or name.startswith(e + ".")), key=len, default=None)
        return None if best is None else order.index(best)

    names = list(LAYERS)
    wrong = []
    for a, targets in sorted(graph().items()):
        order = WITHIN.get(names[layer_of(a)])
        for b in sorted(targets):
            if order and layer_of(b) == layer_of(a) and (rank(order, b) or 0) > (rank(order, a) or 0):
                wrong.append(f"{a} -> {b}")
    assert not wrong, "imports against the order inside a layer:\n" + "\n".join(wrong)


def test_no_lesson_imports_another_and_nothing_below_the_course_imports_a_lesson():
    """A lesson folder imports the shared frameworks (kvlab.lessons.common) and the library, never another lesson;
    outside kvlab/lessons only the course table and the notebook builder may name one."""
    wrong = []
    for a, targets in sorted(graph().items()):
        here = lesson_of(a)
        for b in sorted(targets):
            there = lesson_of(b) or (b.split(".")[2], "") if b.startswith("kvlab.lessons.l") else None
            if there is None:
                continue
            if here is None and not a.startswith("kvlab.lessons") and a not in NAME_LESSONS:
                wrong.append(f"{a} -> {b}   (only {', '.join(NAME_LESSONS)} may name a lesson folder)")
            elif here is None and a.startswith("kvlab.lessons.common"):
                wrong.append(f"{a} -> {b}   (a shared framework imports a lesson)")
            elif here is not None and there[0] != here[0]:
                wrong.append(f"{a} -> {b}   (a lesson imports another lesson)")
    assert not wrong, "imports across lessons:\n" + "\n".join(wrong)


def test_a_lesson_is_its_panel_figures_claims_and_exercises():
    folders = sorted(p for p in (PACKAGE / "lessons").iterdir() if p.is_dir() and p.name[:1] == "l" and p.name[1:3].isdigit())
    extra = [f"{f.relative_to(ROOT)}" for folder in folders for f in sorted(folder.glob("*.py"))
             if f.stem not in (*LESSON_MODULES, "__init__")]
    assert not extra, ("modules in a lesson folder beyond " + ", ".join(LESSON_MODULES) + " (an experiment goes to "
                       "kvlab/experiments/, a shared framework to kvlab/lessons/common/):\n" + "\n".join(extra))


def test_claims_read_no_panel():
    wrong = [f"{a} -> {b}" for a, targets in sorted(graph().items()) for b in sorted(targets)
             if (lesson_of(a) or ("", ""))[1] == "claims" and (lesson_of(b) or ("", ""))[1] == "panel"]
    assert not wrong, "a claim judges an experiment's frames, never a panel:\n" + "\n".join(wrong)


def test_nothing_inside_imports_the_root_package():
    inside = [f"{a} -> {ROOT_PACKAGE}" for a, targets in sorted(graph().items())
              if a != ROOT_PACKAGE and ROOT_PACKAGE in targets]
    assert not inside, ("imports of the root package from inside (import the lower module that holds the "
                        "name, e.g. kvlab.version):\n" + "\n".join(inside))


def test_no_import_circle():
    found = cycles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    source = tmp_path / "kvlab" / "serving" / "engine.py"
    source.parent.mkdir(parents=True)
    source.write_text("from .scheduler import X\n\ndef f():\n    from kvlab.lessons.common import figure_style\n"
                      "    import kvlab\n    importlib.import_module('kvlab.http')\n", encoding="utf-8")
    known = {"kvlab", "kvlab.serving", "kvlab.serving.scheduler", "kvlab.lessons.common", "kvlab.lessons.common.figure_style",
             "kvlab.http"}
    assert imports("kvlab.serving.engine", source, known) == {"kvlab.serving.scheduler", "kvlab.lessons.common.figure_style",
                                                              "kvlab", "kvlab.http"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


# --- the README's table ---------------------------------------------------------------------------------

def readme_layers() -> list[tuple[str, list[str]]]:
    """The README's layer table (section "How the package is laid out"): (layer name, modules) per numbered row."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## How the package is laid out", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            paths = re.findall(r"`(kvlab[^`]*)`", cells[2])
            rows.append((cells[1], [dotted(p) for p in paths]))
    return rows


def dotted(path: str) -> str:
    """`kvlab/cache/` -> kvlab.cache, `kvlab/clocks.py` -> kvlab.clocks, `kvlab/__init__.py` -> kvlab."""
    path = path.rstrip("/").removesuffix(".py").removesuffix("/__init__")
    return path.replace("/", ".")


def test_one_import_style_absolute():
    """Every import inside the package names its module in full (``from kvlab.serving.engine import Engine``),
    so a reader sees where a name comes from without counting dots, and a module moves without rewriting them."""
    relative = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.level > 0]
    assert not relative, f"relative imports (write them absolute, from kvlab...): {relative[:10]}"


def test_readme_draws_the_layer_table():
    """Same layers, same order, same modules: every entry of LAYERS that is in the tree (the table may name a
    module before it lands, e.g. kvlab.sampling; the README names it once it does)."""
    drawn, present = readme_layers(), set(modules())
    assert [name for name, _ in drawn] == list(LAYERS), (
        f"the README's layers {[name for name, _ in drawn]} differ from LAYERS {list(LAYERS)} in name or order")
    for (name, listed), entries in zip(drawn, LAYERS.values()):
        wanted = [e for e in entries if e in present]
        assert sorted(set(listed) & present) == sorted(wanted) and set(listed) <= set(entries), (
            f"README layer {name!r} lists {listed}; the table has {wanted} in the tree")


def _in_type_checking_block(tree: ast.Module) -> set[int]:
    """Line numbers of the imports inside ``if TYPE_CHECKING:`` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            lines |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def test_names_from_a_libraries_typing_module_are_imported_for_the_type_checker_only():
    """A library's typing module (``matplotlib.typing``, ``numpy.typing``, ``pandas._typing``) gains names from
    version to version, and mypy checks against requirements.txt's pins, not against the lowest version a learner
    has (Colab's matplotlib 3.10 has no ``LegendLocType``). Such names serve annotations only, so they are imported
    under ``if TYPE_CHECKING:`` and a learner's older library never fails at import."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        guarded = _in_type_checking_block(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith(("kvlab", "typing")):
                if node.module.split(".")[-1] in ("typing", "_typing") and node.lineno not in guarded:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[-1] in ("typing", "_typing") and alias.name != "typing" \
                            and node.lineno not in guarded:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} import {alias.name}")
    assert not found, f"import these under `if TYPE_CHECKING:` (names for annotations only): {found}"


def test_the_typing_rule_sees_an_unguarded_import():
    tree = ast.parse("from typing import TYPE_CHECKING\nfrom matplotlib.typing import A\nif TYPE_CHECKING:\n"
                     "    from numpy.typing import B\n")
    assert _in_type_checking_block(tree) == {4}


# A lesson or notebook by number, or a lesson folder: "(lesson 07)", "notebook 09's", "l03_cache_strategies".
NAMES_A_LESSON = re.compile(r"(?i)\b(lessons?|notebooks?) \d|\bl\d\d_")


def test_no_experiment_names_a_lesson():
    """Experiments are recipes any lesson, benchmark or command may use: which lesson uses which is the lessons'
    business and kvlab.course's, so no module under kvlab/experiments/ names a lesson or a notebook."""
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
             for path in sorted((PACKAGE / "experiments").glob("*.py"))
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if NAMES_A_LESSON.search(line)]
    assert not found, "say what it is or does, not which lesson uses it:\n" + "\n".join(found)


def test_the_lesson_rule_sees_a_lesson_number():
    assert NAMES_A_LESSON.search("(lesson 07)") and NAMES_A_LESSON.search("kvlab.lessons.l03_cache_strategies")
    assert not NAMES_A_LESSON.search("LESSON_REQUESTS") and not NAMES_A_LESSON.search("the lessons' queue")
