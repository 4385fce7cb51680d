"""docs/benchmarks.md's sandbox and inference benchmarks through their own command lines: each
prints one JSON line with its figures and the machine's load (the targets are not asserted here:
timings belong to the benchmark, not to a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docker import require_docker

ROOT = Path(__file__).resolve().parent.parent


def bench_line(*args: str) -> dict:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(line["machine"]["load_avg"]) == 3 and line["machine"]["cpus"] >= 1
    # the CPU and its vector extensions: figures of different machines must not be compared as one
    # (any CPU: an ARM one lists none of the x86 extensions bench/_common.py looks for)
    assert line["machine"]["cpu"]["model"] and isinstance(line["machine"]["cpu"]["extensions"], list)
    return line


@pytest.mark.docker
def test_sandbox_bench_quick_measures_both_backends_and_the_pool() -> None:
    require_docker()
    line = bench_line("bench/sandbox.py", "--quick")
    for key in ("local_exec_p50_ms", "local_reset_p50_ms", "docker_warm_exec_p50_ms", "docker_reset_p50_ms",
                "pool_acquire_p50_ms"):
        assert line[key] > 0, (key, line)
    assert line["local_exec_p50_ms"] <= line["local_exec_p99_ms"]


def test_inference_bench_times_the_embedded_model() -> None:
    line = bench_line("bench/inference.py", "--tokens", "4", "--concurrency", "2", "--decode-rows", "2",
                      "--decode-context", "64", "--decode-rounds", "1")
    assert line["single_tok_s"] > 0 and line["concurrent_tok_s"] > 0 and line["cache_hit_load_s"] > 0
    assert set(line["decode_step_cpu_s"]) == {"sdpa", "sdpa_gqa", "sdpa_gqa+in_place_cache",
                                              "bf16+sdpa_gqa+in_place_cache", "bf16_packed+sdpa_gqa+in_place_cache"}
    assert line["decode_step_fp32_over_bf16_engine"] > 0 and line["decode_step_plain_over_packed_bf16"] > 0
    assert line["decode_packed_logits_bit_equal"] is True  # packing changes no logit
    assert line["decode_logits_max_abs_diff"] == 0.0 and line["decode_step_default_over_engine"] > 0


def test_learner_bench_times_a_padded_and_a_packed_pass() -> None:
    line = bench_line("bench/learner.py", "--prefix", "40", "--suffixes", "10,12", "--repeats", "1",
                      "--dtype", "float32")
    assert line["tokens_packed"] == 40 + 10 + 12 < line["tokens_padded"] == 2 * 52
    assert line["padded_s"] > 0 and line["packed_s"] > 0 and line["packed_speedup"] > 0
    assert line["policy_tokens"] > 0 and line["logprob_max_abs_diff"] < 1e-4  # the same log-probs


def test_learner_step_bench_trains_the_same_batch_under_the_baseline_and_the_config() -> None:
    line = bench_line("bench/learner_step.py", "--env", "swe", "--prefix", "40", "--suffixes", "10,12",
                      "--steps", "2")
    assert line["rows"] == 2 and line["tokens"] == 2 * 40 + 10 + 12  # swe's one group of two, unpadded
    assert line["baseline_step_s"] > 0 and line["config_step_s"] > 0 and line["step_speedup"] > 0
    assert "trainer.dtype=float32" in line["baseline_setting"]
    assert line["config_optimizer"].endswith("AdamW8bit")  # swe's `optimizer: auto` in one process
    assert line["baseline_peak_rss_gb"] > 0.5 and line["config_peak_rss_gb"] > 0.5  # each arm loaded the model


def test_rollout_bench_runs_every_engine_in_every_round() -> None:
    """bench/rollout.py's ratios come from engines interleaved round by round (load drift falls on
    each alike): after round 0 every engine has run, and round 1 adds to each."""
    out = subprocess.run([sys.executable, "bench/rollout.py", "--quick", "--engines", "hf,hf-transformers",
                          "--trajectories", "4", "--max-turns", "2", "--rounds", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rounds = [json.loads(line) for line in out.stderr.splitlines() if line.startswith('{"round"')]
    assert [r["round"] for r in rounds] == [0, 1]
    first, second = rounds
    assert min(first["hf"]["async"], first["hf"]["sync"], first["hf-transformers"]["async"]) > 0
    assert second["hf"]["async"] > first["hf"]["async"] and second["hf-transformers"]["async"] > first["hf-transformers"]["async"]
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["schedule"] == "engines interleaved per round" and line["rounds"] == 2
    assert line["tokens_per_s_over_hf_transformers"] > 0 and line["async_over_sync"] > 0
    assert line["agent_tokens_per_s_over_native"] > 0  # the same workload as an AgentEnv through the endpoint
    assert line["machine"]["cpu"]["model"] and len(line["machine"]["load_avg"]) == 3
