"""What the tests share: the device, one torch thread, tiny seeded models per architecture, teacher-forced logits.

Every model here is built with seed 0 on the CPU and then moved, so a test sees the same weights on
every machine. The device is the CPU unless $KVLAB_TEST_DEVICE (or else $KVLAB_DEVICE) names another:
``KVLAB_TEST_DEVICE=cuda pytest tests/test_generate.py`` runs the same tests on the GPU, which is
what the GPU checks do (tests/gpu/README.md). Tests of a GPU-only path have their own, marked to skip without CUDA.
"""
from __future__ import annotations

import os

import pytest
import torch

import kvlab
from kvlab.clocks import RequestRecord
from kvlab.serving import SamplingParams, Sequence
from kvlab.threads import torch_threads

ARCHITECTURES = {"llama": kvlab.tiny_llama, "gpt2": kvlab.tiny_gpt2}  # Llama (GQA, RoPE) and GPT-2 (MHA, learned)

try:  # no time limit on a hypothesis example: a slow example on a busy machine is no failure
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("kvlab", deadline=None)
    _hypothesis_settings.load_profile("kvlab")
except ImportError:
    pass


# Every test runs as on a learner's machine where vLLM is not set up (an empty home), so a notebook a test executes
# (in a kernel, a browser or from the wheel) prints 09's one line on how to set vLLM up instead of starting it, even
# where `python -m kvlab peer vllm` has set it up. tests/test_vllm_full.py asks for the real home (`real_vllm_home`).
_VLLM_HOME = os.environ.get("KVLAB_VLLM_HOME")
os.environ["KVLAB_VLLM_HOME"] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                             "test-artifacts", "no-vllm-home")


@pytest.fixture(scope="module")
def real_vllm_home():
    """vLLM's home as the user set it ($KVLAB_VLLM_HOME before the tests, else the default), for this module."""
    empty = os.environ["KVLAB_VLLM_HOME"]
    if _VLLM_HOME is None:
        os.environ.pop("KVLAB_VLLM_HOME")
    else:
        os.environ["KVLAB_VLLM_HOME"] = _VLLM_HOME
    try:
        from kvlab.http.vllm import vllm_home

        yield vllm_home()
    finally:
        os.environ["KVLAB_VLLM_HOME"] = empty


# -- the notebooks' one execution, ahead of the tests that read it ----------------------------------------------------
# Tests marked `notebook_runs` read a notebook's one run of the session (tests/notebook_run.py): they run last, and
# the notebooks they read are executed from the session's start in a background thread while the other tests run, so
# the default run takes about the longer of the two rather than their sum (the notebooks mostly wait on real-time
# clocks: about 350 s of the 730 s the default run took one after the other here, using half a core on average).
NOTEBOOKS_AHEAD = pytest.StashKey[list[str]]()


def notebooks_read(item: pytest.Item) -> list[str]:
    """The notebooks a `notebook_runs` test reads: its marker's names, else the notebook it is parametrised on
    (tests/test_notebooks.py's ``run``), else every notebook of the course."""
    marker = item.get_closest_marker("notebook_runs")
    if marker is None:
        return []
    if marker.args:
        return list(marker.args)
    callspec = getattr(item, "callspec", None)
    if callspec is not None and isinstance(callspec.params.get("run"), str):
        return [callspec.params["run"]]
    from kvlab.course import NOTEBOOKS

    return [n.file for n in NOTEBOOKS]


class NotebookReadersLast:
    """A plugin of its own (pytest_configure registers it): a module holds one hook of a name, and this one must run
    after -m and -k have deselected (and after the lesson markers below are added), so only tests that will run count."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        readers = [item for item in items if item.get_closest_marker("notebook_runs")]
        items[:] = [item for item in items if not item.get_closest_marker("notebook_runs")] + readers
        names = [name for item in readers for name in notebooks_read(item)]
        config.stash[NOTEBOOKS_AHEAD] = list(dict.fromkeys(sorted(names)))  # course order (NN_ prefixes), once each


@pytest.fixture(autouse=True, scope="session")
def notebooks_ahead(request: pytest.FixtureRequest):
    """Starts executing the notebooks this session's tests read (none: nothing starts), and at the end starts no
    other and waits for the one running."""
    names = request.config.stash.get(NOTEBOOKS_AHEAD, [])
    if not names:
        yield
        return
    from notebook_run import Ahead

    ahead = Ahead(names)
    yield
    ahead.stop()


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Every test runs on one torch thread: tiny models are fastest so, and a shared 2-core machine does not thrash."""
    with torch_threads(1):
        yield


def requested_device() -> str:
    """The device the shared fixtures run on: $KVLAB_TEST_DEVICE, else $KVLAB_DEVICE, else cpu."""
    return os.environ.get("KVLAB_TEST_DEVICE") or os.environ.get("KVLAB_DEVICE") or "cpu"


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device models and caches of the tests live on (see the module docstring); cuda without CUDA skips."""
    dev = torch.device(requested_device())
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"tests asked for device {str(dev)!r} (KVLAB_TEST_DEVICE / KVLAB_DEVICE) but CUDA is not "
                    "available here; unset the variable or set it to cpu")
    return dev


@pytest.fixture(scope="module")
def model(device) -> kvlab.Decoder:
    """The tiny Llama (2 layers, grouped-query attention), seeded, on ``device``; one per test module."""
    return kvlab.build_model(kvlab.tiny_llama(), seed=0, device=device)


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def each_model(request, device) -> kvlab.Decoder:
    """The tiny model of each architecture in turn (the test runs once per entry of ARCHITECTURES), on ``device``."""
    return kvlab.build_model(ARCHITECTURES[request.param](), seed=0, device=device)


def _teacher_forced_logits(model, cache, prompt_len: int = 48, steps: int = 24, seed: int = 0) -> torch.Tensor:
    """Logits of a prefill and then ``steps`` decode steps on fixed random tokens: (prompt_len + steps, V)."""
    gen = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    ids = torch.randint(0, V, (1, prompt_len), generator=gen).to(model.device)  # (1, prompt_len)
    nxt = torch.randint(0, V, (1, steps), generator=gen).to(model.device)  # (1, steps): fed one at a time
    with torch.inference_mode():
        out = [model(ids, cache)[0]]  # (prompt_len, V)
        out += [model(nxt[:, t:t + 1], cache)[0] for t in range(steps)]  # steps x (1, V)
    return torch.cat(out).float().cpu()


@pytest.fixture(scope="session")
def teacher_forced_logits():
    """``teacher_forced_logits(model, cache, prompt_len=48, steps=24, seed=0)``: every logit a cache run gives."""
    return _teacher_forced_logits


def _sequence(rid: int, prompt, max_new_tokens: int = 8, arrival_s: float = 0.0, stop=()) -> Sequence:
    """A waiting Sequence as the engine makes one; ``prompt`` is token ids, or a length (ids below 50 from rid)."""
    tokens = [(rid * 7 + i) % 50 for i in range(prompt)] if isinstance(prompt, int) else list(prompt)
    record = RequestRecord(rid, len(tokens), max_new_tokens, scheduled_s=arrival_s)
    return Sequence(rid, tokens, max_new_tokens, SamplingParams(stop_token_ids=tuple(stop)), record, arrival_s)


@pytest.fixture(scope="session")
def make_sequence():
    """``make_sequence(rid, prompt, max_new_tokens=8, arrival_s=0.0, stop=())`` -> a waiting Sequence."""
    return _sequence


@pytest.fixture(scope="session")
def colab_twin(tmp_path_factory):
    """Colab's package set in a fresh venv, kvlab's wheel installed into it (tests/colab_twin.py); built once."""
    import json
    import os
    from pathlib import Path

    from colab_twin import build_twin

    twin = build_twin(tmp_path_factory.mktemp("colab-twin"))
    artifacts = Path(__file__).resolve().parents[1] / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "colab-twin.json").write_text(json.dumps(twin.report(), indent=1))
    return twin


# --- one lesson's tests in one command: pytest -m l06 ---------------------------------------------------------
# A test belongs to lesson NN when it is parametrized with one of NN's things (its notebook file, a claim or an
# exercise of its notebook), or, failing that, when its file lists NN in its module-level LESSONS (test_claims_06.py:
# ("06",); the tests of an experiment: the lessons that run it). So `pytest -m l06` runs 06's unit tests, its
# experiments' tests, its claims and their examples, and its notebook's one execution (not the full tier); a file
# about several lessons is split by its parameters.
import re as _re

_NOTEBOOK = _re.compile(r"^(\d\d)_\w+\.ipynb$")


def _lesson_of(value) -> str | None:
    """The lesson a test parameter belongs to: a notebook file name, or anything with ``.notebook`` / ``.file``."""
    for name in (value, getattr(value, "notebook", None), getattr(value, "file", None)):
        if isinstance(name, str) and _NOTEBOOK.match(name):
            return name[:2]
    return None


def pytest_configure(config):
    from kvlab.course import NOTEBOOKS

    config.pluginmanager.register(NotebookReadersLast(), "kvlab-notebook-readers-last")

    for entry in NOTEBOOKS:
        number = entry.file[:2]
        config.addinivalue_line("markers", f"l{number}: the tests of lesson {number} ({entry.title}); pytest -m l{number}")


def pytest_collection_modifyitems(config, items):
    from kvlab.course import NOTEBOOKS

    known = {entry.file[:2] for entry in NOTEBOOKS}
    for item in items:
        if item.get_closest_marker("full"):  # `pytest -m l09` is the quick check; the full tier stays `-m full`
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        lessons = {lesson for lesson in map(_lesson_of, params.values()) if lesson}
        if not lessons:
            lessons = set(getattr(getattr(item, "module", None), "LESSONS", ()))
            if lessons - known:
                raise pytest.UsageError(f"{item.path.name}: LESSONS names {sorted(lessons - known)}, not lessons of "
                                        f"kvlab.course.NOTEBOOKS ({', '.join(sorted(known))})")
        for lesson in sorted(lessons):
            item.add_marker(getattr(pytest.mark, f"l{lesson}"))
