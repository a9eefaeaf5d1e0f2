"""Claims checked on the learner's own run: the framework (``framework``) and one module per notebook (``cNN_*``).

Notebooks show them with ``from kvlab.claims import verdicts; verdicts(result, "claim_name", ...)``.
"""
from __future__ import annotations

import importlib
import pkgutil

from .framework import CLAIMS, Claim, Verdict, Verdicts, claim, claims_for, verdicts

# Register every notebook's claims (modules cNN_<notebook>.py), whichever exist.
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name[:1] == "c" and _info.name[1:3].isdigit():
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["CLAIMS", "Claim", "Verdict", "Verdicts", "claim", "claims_for", "verdicts"]
