"""The rollout benchmark's two schedules, checked on a scripted engine (the figures themselves
come from `bench/rollout.py` with the real model)."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest

from agentrl.inference.base import SamplingParams
from agentrl.rollout import RolloutEngine

from .fakes import CharTokenizer, ScriptedEngine

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rollout.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_rollout", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_workload_is_seeded_and_long_tailed() -> None:
    bench = load_bench()
    a = bench.make_workload(200, 0, 8, 0.5, 1.0)
    assert a == bench.make_workload(200, 0, 8, 0.5, 1.0)
    turns = [t["turns"] for t in a]
    lat = sorted(x for t in a for x in t["latency"])
    assert min(turns) == 1 and max(turns) == 8 and sum(turns) / len(turns) < 3
    assert lat[len(lat) // 2] < 0.8 and lat[-1] > 3 * lat[len(lat) // 2]  # a heavy tail
    assert all(len(t["latency"]) == t["turns"] for t in a)


async def test_sync_schedule_waits_for_the_slowest_each_turn() -> None:
    bench = load_bench()
    tasks = [{"id": f"w{k}", "turns": turns, "latency": lat, "prompt": "p"}
             for k, (turns, lat) in enumerate([(3, [0.01, 0.01, 0.01]), (1, [0.2]), (2, [0.01, 0.01]),
                                               (1, [0.01])])]
    tok = CharTokenizer()
    starts: list[tuple[float, int]] = []

    class Recording(ScriptedEngine):
        async def generate(self, prompt_ids, sampling):
            starts.append((time.perf_counter(), tok.decode(prompt_ids).count("<|im_start|>assistant")))
            return await super().generate(prompt_ids, sampling)

    def rollout() -> RolloutEngine:
        return RolloutEngine(Recording(tok), tok, SamplingParams(max_tokens=8), concurrency=4)

    t_sync, s = await bench.run_sync(rollout(), tasks, 4)
    assert sorted(t.num_turns for t in s) == [1, 1, 2, 3]
    # Every turn-2 generation starts after the slow 0.2 s tool of turn 1 finished.
    first = min(t for t, k in starts if k == 1)
    assert all(t - first >= 0.2 for t, k in starts if k == 2)
    starts.clear()
    t_async, a = await bench.run_async(rollout(), tasks)
    first = min(t for t, k in starts if k == 1)
    assert any(t - first < 0.1 for t, k in starts if k == 2)  # nobody waits for the slow tool
    assert all(t.status.value == "finished" for t in a) and t_async < t_sync
    assert 0 <= bench.overhead_frac(a) < 1


def test_engine_list_defaults_to_the_prefix_reuse_comparison() -> None:
    bench = load_bench()
    assert bench.parse(["--quick"]).engines == ["hf", "hf-nocache"]
    assert bench.parse(["--engines", "vllm,hf"]).engines == ["vllm", "hf"]
    with pytest.raises(SystemExit):
        bench.parse(["--engines", "vllm"])  # the async/sync figures need the hf engine


def test_the_transformers_baseline_engine_runs_transformers_attention_and_cache() -> None:
    """hf-transformers is the engine as issue 17 measured it; hf is the default one."""
    from transformers.cache_utils import DynamicLayer

    from agentrl.inference.cpu.kv_cache import GrowingLayer
    from agentrl.inference.cpu.packed_linear import onednn_packing_available

    bench = load_bench()
    # bf16 named, not `auto`: auto is fp32 on a CPU without AVX512-BF16/AMX (an AVX2 laptop, ARM)
    args = bench.parse(["--quick", "--dtype", "bfloat16", "--engines", "hf,hf-nofuse,hf-nopack,hf-nospec,hf-transformers"])
    baseline, default = bench.make_engine("hf-transformers", args), bench.make_engine("hf", args)
    nospec, nofuse = bench.make_engine("hf-nospec", args), bench.make_engine("hf-nofuse", args)
    nopack = bench.make_engine("hf-nopack", args)
    try:
        assert default.speculative_tokens == nofuse.speculative_tokens == 4
        assert nospec.speculative_tokens == baseline.speculative_tokens == 0
        assert default.fuse_passes and nospec.fuse_passes and not nofuse.fuse_passes and not baseline.fuse_passes
        assert nospec._prefix.budget == default._prefix.budget > 0
        # under bf16 the default packs every linear weight where this torch can (oneDNN), hf-nopack none;
        # where it cannot, the fallback keeps the tied head's cast alone (both paths: test_engine_precision.py)
        assert default.autocast == nopack.autocast == "bfloat16"
        packs = onednn_packing_available()
        assert len(default._linears) == (7 * 30 + 1 if packs else 1)
        assert all(m.pack == packs for m in default._linears)
        assert not any(m.pack for m in nopack._linears) and baseline._linears == []
        assert baseline.model.config._attn_implementation == "sdpa" and baseline._prefix.budget == 0
        assert type(baseline._new_cache(baseline.model.config).layers[0]) is DynamicLayer
        assert default.model.config._attn_implementation == "sdpa_gqa" and default._prefix.budget > 0
        assert isinstance(default._new_cache(default.model.config).layers[0], GrowingLayer)
    finally:
        for engine in (baseline, default, nospec, nofuse, nopack):
            asyncio.run(engine.close())
