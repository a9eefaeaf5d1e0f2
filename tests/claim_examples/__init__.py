"""The results the claims are checked on in the tests: each claim's example and, for a wall-clock claim, its
counter-example. Test fixtures, so they live here and not in the learner's package.

A claim (``kvlab/lessons/common/claims.py``) is a sentence with the measure that decides it on a run. For the
claims of lesson ``lNN_<name>``, ``tests/claim_examples/lNN_<name>.py`` holds:

- each claim's **example**: a function of no arguments that makes a small result of the lesson's experiment.
  Every claim must read its example, and a deterministic claim must hold on it. Claims that read the same run
  share one example, cached with ``functools.lru_cache``; an example that takes ``seed`` (with a default) is run
  anew with seeds 0, 1, ... by ``scripts/claims_robustness.py``, which counts how often a wall-clock claim holds;
- each asserting wall-clock claim's **counter-example**: a function of (a deep copy of) the example's result
  that returns a result on which the sentence is false, built by hand or by editing that copy's numbers (a
  curve that rises then falls, a gain inside the run's own noise). The claim must mark it ✗, so a check looser
  than its sentence is caught (``tests/test_claims.py``).

Each is registered by the names of the claims it serves::

    @example("uncached_tokens_slow_down", "cached_steps_stay_flat")
    @functools.lru_cache(maxsize=1)
    def _example() -> pd.DataFrame:
        return run_slowdown(slowdown_model(), **example_sizes(), repeats=2)

    @counterexample("uncached_tokens_slow_down")
    def _flat_uncached(_example: Any) -> pd.DataFrame:  # uncached steps that do not grow
        return steps_by_hand({"none": lambda token, n: 1.0 + 0.01 * (token % 2), "dynamic": lambda token, n: 1.0})

Importing this package imports every lesson's module, so ``EXAMPLES`` and ``COUNTEREXAMPLES`` are complete.
Maintainer scripts run from the repository root put ``tests/`` on ``sys.path`` to use them.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

from kvlab.lessons import CLAIMS, LESSONS, Claim

__all__ = ["COUNTEREXAMPLES", "EXAMPLES", "counterexample", "counterexample_of", "example", "example_of",
           "module_for"]

EXAMPLES: dict[str, Callable[[], Any]] = {}  # claim name -> makes the small result it is checked on
COUNTEREXAMPLES: dict[str, Callable[[Any], Any]] = {}  # claim name -> (a copy of) that result -> one it must mark ✗


def module_for(claim: Claim | str) -> str:
    """The file that holds a claim's example and counter-example: ``tests/claim_examples/lNN_<notebook>.py``."""
    c = CLAIMS[claim] if isinstance(claim, str) else claim
    return f"tests/claim_examples/l{c.notebook.removesuffix('.ipynb')}.py"


def _register(table: dict[str, Callable], kind: str, names: tuple[str, ...]) -> Callable[[Callable], Callable]:
    if not names:
        raise TypeError(f"@{kind}(...) takes the names of the claims it is the {kind} of")

    def register(fn: Callable) -> Callable:
        where = f"{fn.__module__}.{getattr(fn, '__name__', fn)}"
        for name in names:
            if name not in CLAIMS:
                raise ValueError(f"{where} is registered as the {kind} of {name!r}, but no claim has that name")
            if name in table:
                raise ValueError(f"claim {name!r} has two {kind}s: {where} and "
                                 f"{table[name].__module__}.{table[name].__name__}")
            table[name] = fn
        return fn  # unchanged: an lru_cache'd example stays cached, and inspect.unwrap still reaches the function

    return register


def example(*names: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Register the decorated function as the example of the claims ``names``."""
    return _register(EXAMPLES, "example", names)


def counterexample(*names: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Register the decorated function as the counter-example of the claims ``names``."""
    return _register(COUNTEREXAMPLES, "counterexample", names)


def _lookup(table: dict[str, Callable], kind: str, claim: Claim | str) -> Callable:
    name = claim if isinstance(claim, str) else claim.name
    if name not in table:
        raise LookupError(f"claim {name!r} has no {kind}: write one in {module_for(name)} "
                          f"with @{kind}({name!r})")
    return table[name]


def example_of(claim: Claim | str) -> Callable[[], Any]:
    """The function that makes the claim's example result (raises LookupError when it has none)."""
    return _lookup(EXAMPLES, "example", claim)


def counterexample_of(claim: Claim | str) -> Callable[[Any], Any]:
    """The claim's counter-example: (a copy of) its example's result -> a result it must mark ✗."""
    return _lookup(COUNTEREXAMPLES, "counterexample", claim)


# Every lesson's examples, in course order (one module per lesson folder of kvlab.lessons).
_MODULES = sorted(m.name for m in pkgutil.iter_modules(__path__))
for _lesson in _MODULES:
    importlib.import_module(f"{__name__}.{_lesson}")
_STRAY = sorted(set(_MODULES) - set(LESSONS))
if _STRAY:
    raise ImportError(f"tests/claim_examples/ holds {_STRAY}, which name no lesson of kvlab.lessons ({LESSONS})")
