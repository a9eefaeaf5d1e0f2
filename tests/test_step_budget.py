"""The step-budget ablation: each part is really left out while it is timed, and put back afterwards."""
from __future__ import annotations

import json

import pytest

from kvlab.benchmarks.step_budget import PARTS, LeftOut
from kvlab.cache.base import KVCache
from kvlab.cache.dynamic import DynamicCache
from kvlab.cli import main
from kvlab.generate import generate
from kvlab.model import decoder as decoder_module
from kvlab.model.matvec import matvec
from kvlab.model.decoder import apply_rope


def test_each_part_is_replaced_only_for_decode_steps_and_restored(model):
    whole = generate(model, [5, 6, 7, 8], cache="dynamic", max_new_tokens=5)
    for part in PARTS:
        with LeftOut(part).applied() as left_out:
            out = generate(model, [5, 6, 7, 8], cache="dynamic", max_new_tokens=5)
        assert left_out.calls > 0, part  # the replacement ran during the decode steps
        assert out.tokens[0] == whole.tokens[0], part  # the prompt's pass is untouched: same first token
        if part == "cache and attention":
            assert out.cache.seq_len == 4  # nothing stored after the prompt
    assert decoder_module.matvec is matvec and decoder_module.apply_rope is apply_rope
    assert DynamicCache.attend is KVCache.attend
    with pytest.raises(ValueError, match="unknown part 'norms'; choose from weight products"):
        LeftOut("norms")


def test_bench_step_pairs_each_part_with_the_whole_round_by_round(tmp_path):
    path = tmp_path / "step.json"
    assert main(["bench", "step", "--config", "tiny", "--prompt", "8", "--new", "4", "--rounds", "2",
                 "--threads", "1", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    whole = report["budget"]["whole_ms"]["values"]
    assert len(whole) == 2 and all(w > 0 for w in whole)
    for part in PARTS:
        p = report["budget"]["parts"][part]
        without = p["step_without_ms"]["values"]
        assert p["cost_ms"]["values"] == pytest.approx([w - s for w, s in zip(whole, without)])
        assert p["share_of_step"]["values"] == pytest.approx([(w - s) / w for w, s in zip(whole, without)])
        assert p["calls_replaced"] > 0
    assert report["settings"]["threads"] == 1 and report["settings"]["cache"] == "dynamic"
    assert {"versions", "cpu_count"} <= set(report["env"])


def test_bench_step_refuses_bad_settings_before_running():
    with pytest.raises(SystemExit, match="need --prompt >= 1, --new >= 2"):
        main(["bench", "step", "--new", "1"])
    with pytest.raises(SystemExit, match="exceeds the tiny-llama context"):
        main(["bench", "step", "--config", "tiny", "--prompt", "1000", "--new", "100"])
