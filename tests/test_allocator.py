"""kvlab.allocator: `serve --allocator kept` really keeps freed memory for the next step (glibc), and says what holds."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvlab.allocator import ALLOCATORS, set_allocator
from kvlab.http.peer import kvlab_server

GLIBC = "CS_GNU_LIBC_VERSION" in os.confstr_names and bool(os.confstr("CS_GNU_LIBC_VERSION"))

# In a fresh process (the test's own allocator stays as it is): page faults of a tensor written, freed and written
# again, first with glibc's defaults, then kept (a size not met before). glibc's defaults give the first back to the
# kernel (mmap, then munmap on free) and only then raise the threshold: the second comes from a heap grown by fresh
# pages, each of which faults in again. Kept, the second reuses the heap that already holds the first's pages.
REUSE = """
import resource, torch
from kvlab.allocator import set_allocator
def faults_of_one_tensor(mib):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(mib * 2**18, dtype=torch.float32)
    t.fill_(1.0)
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_one_tensor(16)
system = faults_of_one_tensor(16)
set_allocator("kept")
faults_of_one_tensor(20)
print(system, faults_of_one_tensor(20))
"""
PAGE = os.sysconf("SC_PAGE_SIZE")


def test_a_name_not_offered_is_refused() -> None:
    with pytest.raises(ValueError, match="kept.*system"):
        set_allocator("tcmalloc")
    assert ALLOCATORS == ("kept", "system")


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's (macOS keeps its own allocator)")
def test_kept_memory_is_reused_without_faulting_in_again() -> None:
    done = subprocess.run([sys.executable, "-c", REUSE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LD_PRELOAD": ""})
    assert done.returncode == 0, done.stderr
    system, kept = map(int, done.stdout.split()[-2:])
    pages16, pages20 = 16 * 2**20 // PAGE, 20 * 2**20 // PAGE
    print(f"page faults of a tensor written again: system {system} of its {pages16} pages, kept {kept} of {pages20}")
    assert system > pages16 // 2, f"system: {system} faults, expected about its {pages16} pages"
    assert kept < pages20 // 10, f"kept: {kept} faults, expected next to none of the {pages20} pages"


def test_the_setting_says_what_holds() -> None:
    said = set_allocator("system")
    assert said.startswith("system: ")


def test_the_bench_starts_kvlab_serve_with_the_allocator_it_names(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}')
    for allocator in ALLOCATORS:
        server = kvlab_server(tmp_path, allocator=allocator)
        assert server.args[server.args.index("--allocator") + 1] == allocator
        assert server.settings["allocator"] == allocator  # recorded in bench serve's JSON
    with pytest.raises(ValueError, match="allocator must be one of.*got 'tcmalloc'"):
        kvlab_server(tmp_path, allocator="tcmalloc")
