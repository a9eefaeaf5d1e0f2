"""kvlab on Colab's own packages: installed from its wheel with its dependencies, it changes none of them, and
each lower bound pyproject.toml declares is a version installed here (the twin: tests/colab_twin.py, Colab's list:
tests/environments/colab.txt). Every notebook runs in the twin, outside the checkout, in the classic-browser test
(tests/test_browser_classic.py)."""
from __future__ import annotations

import pytest
from packaging.version import Version

from colab_twin import REPO, changed, colab_packages, declared_requirements, lower_bound, run


def test_colabs_list_names_its_source_date_and_python():
    text = (REPO / "tests" / "environments" / "colab.txt").read_text()
    python, packages = colab_packages()
    assert "googlecolab/backend-info" in text and "2026-" in text
    assert python and {"torch", "ipywidgets", "transformers", "numpy", "pandas"} <= set(packages)


def test_every_declared_dependency_admits_colabs_version():
    from packaging.requirements import Requirement

    _, colab = colab_packages()
    refused = {n: (r, colab[n]) for n, r in declared_requirements().items()
               if n in colab and not Requirement(r).specifier.contains(colab[n], prereleases=True)}
    assert not refused, f"pyproject.toml would replace Colab's version (requirement, Colab's): {refused}"


@pytest.mark.full
@pytest.mark.colab_twin
def test_the_twin_holds_colabs_python_and_packages(colab_twin):
    print(f"twin Python: {colab_twin.python_source}")
    if "no Python" in colab_twin.python_source:
        pytest.skip(colab_twin.python_source)
    version = run([colab_twin.python, "-c", "import sys; print(sys.version.split()[0])"], cwd=colab_twin.root,
                  env=colab_twin.env).strip()
    assert version.startswith(colab_twin.colab_python + ".")
    differ = changed(colab_twin.colab, colab_twin.freeze["colab"], colab_twin.colab)
    assert not differ, f"the twin did not get Colab's versions (Colab's, the twin's): {differ}"


@pytest.mark.full
@pytest.mark.colab_twin
def test_installing_kvlab_into_colab_changes_none_of_colabs_packages(colab_twin):
    would = {p["metadata"]["name"]: p["metadata"]["version"] for p in colab_twin.would_install}
    print("pip install --dry-run kvlab[serve] would install:", ", ".join(f"{n}-{v}" for n, v in would.items()))
    touched = sorted(n for n in would if n.lower().replace("_", "-") in colab_twin.colab)
    assert not touched, f"installing kvlab would replace Colab's {touched}: {would}"
    for step in ("kvlab", "test tools"):
        differ = changed(colab_twin.freeze["colab"], colab_twin.freeze[step], colab_twin.colab)
        assert not differ, f"after installing {step}, Colab's packages changed (before, after): {differ}"
    assert "kvlab" in colab_twin.freeze["kvlab"]


@pytest.mark.full
@pytest.mark.colab_twin
def test_each_declared_lower_bound_is_the_version_the_twin_installed(colab_twin):
    installed = colab_twin.freeze["kvlab"]
    rows = {n: (lower_bound(r), installed.get(n)) for n, r in declared_requirements().items()}
    print("\n".join(f"{n:14} declared >= {lo:10} installed {got}" for n, (lo, got) in rows.items()))
    untested = {n: v for n, v in rows.items() if v[0] is None or v[1] is None or Version(v[0]) != Version(v[1])}
    assert not untested, f"a lower bound no test installs (declared, installed in the twin): {untested}"


@pytest.mark.full
@pytest.mark.colab_twin
def test_notebook_09s_second_engine_starts_on_colabs_transformers(colab_twin):
    """kvlab[serve] on Colab's set can run `transformers serve --continuous-batching` (not only its 'unavailable' line):
    both engines answer the same greedy text from one checkpoint folder, on Colab's transformers."""
    script = ("from kvlab.http.peer import transformers_serve_available\n"
              "from kvlab.experiments.two_engines import lesson_checkpoint, make_server, same_greedy_answer\n"
              "ok, why = transformers_serve_available(); print(why)\n"
              "assert ok, why\n"
              "folder = lesson_checkpoint()\n"
              "servers = [make_server(e, folder).start() for e in ('kvlab serve', 'transformers serve')]\n"
              "try:\n"
              "    answers = same_greedy_answer(servers); print(answers)\n"
              "    assert answers['same'], answers\n"
              "finally:\n"
              "    [s.stop() for s in servers]\n")
    out = run([colab_twin.python, "-c", script], cwd=colab_twin.root, env=colab_twin.env, timeout=300)
    print(out)
    assert "is available" in out


# Every notebook runs in the twin, outside the checkout, once: tests/test_browser_classic.py drives each one there in
# the classic Notebook (ipywidgets 7), with no error output and its deterministic outputs equal to the saved ones.
