"""Step-wise trajectories with the real components: Qwen3's chat template (it drops past `<think>`
blocks; tests/fixtures/qwen3_chat_template.jinja) on the embedded SmolLM2-135M's tokenizer, the hf
engine, the built-in `code`, `search` and `swe` envs with their real sandboxes, the trainer's
forward pass, and `agentrl train` through the CLI."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import agentrl
from agentrl.config import TrainerConfig
from agentrl.inference.base import SamplingParams
from agentrl.rollout import RolloutEngine
from agentrl.rollout.stepwise import APPEND, STEPWISE
from agentrl.trainer.learner import Learner
from agentrl.trainer.logprobs import token_logprobs
from agentrl.types import Message, Status, Trajectory

from .fakes import ScriptedEnv

TEMPLATE_FILE = Path(__file__).resolve().parent.parent / "fixtures" / "qwen3_chat_template.jinja"
TASK = {"id": "count", "prompt": "Count to three, one number per turn."}


@pytest.fixture
async def hf_engine(smollm2_path: Path):
    from agentrl.inference.hf import HFEngine

    engine = HFEngine(smollm2_path, max_batch_size=4)
    yield engine
    await engine.close()


@pytest.fixture(scope="module")
def qwen3_tokenizer(smollm2_tokenizer):
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = TEMPLATE_FILE.read_text()
    return tok


def contexts_before_requests(traj: Trajectory) -> list[list[Message]]:
    return [traj.messages[:i] for i, m in enumerate(traj.messages) if m["role"] == "assistant"]


def check_stepwise_rows(traj: Trajectory, tokenizer, model: torch.nn.Module) -> None:
    """Each step-wise row is Hugging Face's own tokenization of the template's prompt for its request
    followed by exactly the tokens sampled under it; the trainer's forward pass over the row gives
    the engine's log-probs on them."""
    assert traj.mode == STEPWISE and len(traj.segments) == traj.num_turns >= 2
    for k, (seg, context) in enumerate(zip(traj.segments, contexts_before_requests(traj))):
        seg.check()
        (turn,) = seg.turns
        want = tokenizer.apply_chat_template([dict(m) for m in context], tokenize=True, add_generation_prompt=True,
                                             return_dict=True)["input_ids"]
        assert seg.token_ids[:turn.action_start] == list(want)
        if k:  # the first request continues the reset's prompt segment
            assert seg.prompt_len == turn.action_start and turn.action_end == len(seg.token_ids)
        assert seg.loss_mask == [0] * turn.action_start + [1] * (turn.action_end - turn.action_start)
        assert tokenizer.decode(seg.token_ids[turn.action_start:turn.action_end]).removesuffix("<|im_end|>") \
            == turn.action_text == context_reply(traj, k)
        with torch.no_grad():
            learner = token_logprobs(model, torch.tensor([seg.token_ids]))[0]
        mask = torch.tensor(seg.loss_mask, dtype=torch.bool)
        diff = float((learner[mask] - torch.tensor(seg.logprobs)[mask]).abs().max())
        assert diff < 1e-4, f"row {k}: learner vs engine log-prob max abs diff {diff}"


def context_reply(traj: Trajectory, k: int) -> str:
    return [m for m in traj.messages if m["role"] == "assistant"][k]["content"]


@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
async def test_qwen3_template_rows_are_the_templates_prompts_and_the_learner_agrees(
        hf_engine, qwen3_tokenizer, smollm2_tokenizer) -> None:
    sampling = SamplingParams(seed=11, max_tokens=12)
    rollout = RolloutEngine(hf_engine, qwen3_tokenizer, sampling)
    assert rollout.compare_renderings
    group = await rollout.run_group(lambda: ScriptedEnv(turns=3), TASK, 2, group_id="qwen3")
    for traj in group.trajectories:
        assert traj.status is Status.FINISHED, traj.error
        check_stepwise_rows(traj, qwen3_tokenizer, hf_engine.model)
        text = qwen3_tokenizer.decode(traj.segments[2].token_ids)
        assert text.count("<think>") == 1  # only the open turn's; the past turns' empty blocks are gone
    # The learner's step over these rows: one row per request, each with its trajectory's
    # advantage, and its log-probs before the update are the engine's.
    group.trajectories[0].reward, group.trajectories[1].reward = 1.0, 0.0
    learner = Learner(copy.deepcopy(hf_engine.model), TrainerConfig(dtype="float32", lr=1e-6))
    stats = learner.step([group])
    assert not stats.get("skipped") and stats["num_rows"] == 6.0 and learner.version == 1
    assert stats["max_abs_log_rho"] < 1e-4 and math.isfinite(stats["loss"])
    # The model's own (append-only) template: one growing row, as before.
    same = await RolloutEngine(hf_engine, smollm2_tokenizer, sampling).run_trajectory(ScriptedEnv(turns=3), TASK)
    assert same.mode == APPEND and len(same.segments) == 1 and same.num_turns == 3


@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (three envs, real sandboxes); a loaded one takes several times that
async def test_builtin_envs_go_stepwise_under_the_qwen3_template(hf_engine, qwen3_tokenizer) -> None:
    """`code`, `search` and `swe` (real sandboxes, tools and graders), two turns each."""
    rollout = RolloutEngine(hf_engine, qwen3_tokenizer, SamplingParams(seed=5, max_tokens=12),
                            max_context_tokens=4096)
    for env_name in ("code", "search", "swe"):
        env = agentrl.make(env_name, max_turns=2)
        task = next(iter(env.tasks("train")))
        traj = await rollout.run_trajectory(env, task, traj_id=env_name)
        assert traj.status in (Status.FINISHED, Status.TRUNCATED), (env_name, traj.error)
        check_stepwise_rows(traj, qwen3_tokenizer, hf_engine.model)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
def test_code_trains_with_the_qwen3_template_through_the_cli(tmp_path: Path) -> None:
    """`agentrl train --env code model.chat_template=...`: two steps on step-wise rows, the mode of
    every episode in trajectories.jsonl and the share of step-wise ones in metrics.jsonl."""
    tiny = ["trainer.batch_groups=1", "rollout.group_size=2", "rollout.concurrency=2", "sampling.max_tokens=24",
            "env.max_turns=2", "trainer.micro_batch_size=2", "sandbox.pool_size=2", "rollout.trajectory_timeout_s=1800",
            "trainer.warm_start.enabled=false", "eval.enabled=false", "--quiet"]
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--env", "code", "trainer.steps=2",
                          f"model.chat_template={TEMPLATE_FILE}", f"run.dir={tmp_path}", "run.name=qwen3", *tiny],
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "qwen3"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    episodes = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert episodes and {e["mode"] for e in episodes} <= {APPEND, STEPWISE}
    # Two turns under this template always rewrite the first (its empty think block goes).
    assert all(e["mode"] == STEPWISE for e in episodes if e["turns"] >= 2 and e["status"] in ("finished", "truncated"))
    assert any(e["mode"] == STEPWISE for e in episodes), [(e["status"], e["turns"], e["error"]) for e in episodes]
    assert all(0 <= r["stepwise_fraction"] <= 1 for r in rows) and sum(r["stepwise_fraction"] for r in rows) > 0
    trained = [r for r in rows if not r.get("skipped")]
    assert rows[-1]["version"] == len(trained)  # a weight version per step that trained
    assert all(r["policy_tokens"] > 0 for r in rows)


async def test_the_warm_start_plays_demonstrations_under_a_template_that_rewrites_history(qwen3_tokenizer) -> None:
    """The demonstration players check the template themselves: under Qwen3's, `code`'s expert
    (view, fix, test, submit) plays step-wise from the first rewrite: each later row is the
    template's prompt for that request and the expert's own tokens."""
    from agentrl.demos import collect_demonstrations

    env = agentrl.make("code")
    task = next(iter(env.tasks("train")))
    [demo] = await collect_demonstrations(lambda: agentrl.make("code"), [task], qwen3_tokenizer)
    assert demo.status == Status.FINISHED and demo.mode == STEPWISE and len(demo.segments) >= 2
    for seg in demo.segments:
        seg.check()
    for seg in demo.segments[1:]:
        assert seg.loss_mask[seg.prompt_len:] == [1] * (len(seg.token_ids) - seg.prompt_len) != []
