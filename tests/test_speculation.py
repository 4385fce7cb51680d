"""Prompt-lookup speculation in the hf engine (`engine.speculative_tokens`): the drafts, the width
a step feeds, and on the real embedded model, built by `make_engine` as `agentrl train` builds it,
that a speculating engine emits what a plain one emits, with the trainer's log-probs, in fewer steps."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from agentrl.config import load_config
from agentrl.inference import make_engine
from agentrl.inference.base import SamplingParams
from agentrl.inference.cpu.speculation import (
    FORWARD_FIXED_TOKENS,
    ForwardCost,
    draft_width,
    propose_continuation,
)
from agentrl.models import load_tokenizer, resolve_configured
from agentrl.trainer.logprobs import token_logprobs


def test_prompt_lookup_proposes_what_followed_the_latest_longest_match():
    assert propose_continuation([1, 2, 3, 4, 5, 1, 2, 3], 3) == [4, 5, 1]
    # the latest occurrence of the tail wins, and the draft stops at the end of the context
    assert propose_continuation([1, 2, 7, 1, 2, 8, 9, 1, 2], 4) == [8, 9, 1, 2]
    # a longer n-gram match is preferred to a later shorter one
    assert propose_continuation([5, 1, 2, 6, 9, 2, 7, 5, 1, 2], 1, 2, 3) == [6]
    assert propose_continuation([5, 1, 2, 6, 9, 2, 7, 5, 1, 2], 1, 1, 1) == [7]
    assert propose_continuation([1, 2, 3, 4], 3) == []  # no earlier occurrence
    assert propose_continuation([1, 2, 1, 2], 0) == []
    assert propose_continuation([3, 3], 2) == []  # too short for a 2-gram with a continuation


def test_draft_width_weighs_expected_tokens_against_the_forward_cost():
    assert draft_width([], []) == 0
    assert draft_width([0, 0, 0], [0.9, 0.9, 0.9]) == 0
    assert draft_width([4] * 8, [0.95] * 8) == 4  # drafts that are nearly always kept: all of them
    assert draft_width([4] * 8, [0.05] * 8) == 0  # nearly never kept: a plain step is cheaper
    # one row's long draft would widen all sixteen rows: not worth it; alone it is
    assert draft_width([4] + [0] * 15, [0.5] * 16) == 0
    assert draft_width([4], [0.5]) == 4
    # the width follows the rows' acceptance: fewer tokens for a batch that keeps fewer
    assert 0 < draft_width([4] * 8, [0.5] * 8) < draft_width([4] * 8, [0.9] * 8)


def _config(**overrides: object):
    return load_config(env="code", overrides=[f"{k}={v}" for k, v in {"trainer.dtype": "float32", **overrides}.items()])


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tok = load_tokenizer(resolve_configured(_config().model))
    call = '{"name": "search", "arguments": {"query": "capital of France"}}'
    asks = [f"Copy this line three times, one per line: {call}", "Count from 1 to 20, separated by commas.",
            "Say hello.", f"Here is a tool call: {call}. Write another one for the capital of Spain."]
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for q in asks]


async def _generate(cfg, prompts, sampling):
    engine = make_engine(cfg)
    try:
        outs = await asyncio.gather(*[engine.generate(p, sampling(i)) for i, p in enumerate(prompts)])
        return outs, dict(engine.metrics), engine
    finally:
        await engine.close()


def test_forward_cost_fits_this_machines_fixed_part_once_the_step_widths_vary():
    cost = ForwardCost()
    assert cost.fixed_tokens() == FORWARD_FIXED_TOKENS  # nothing seen yet
    for _ in range(100):  # one width only: no slope to fit
        cost.add(8, 0.052)
    assert cost.fixed_tokens() == FORWARD_FIXED_TOKENS
    for step in range(400):  # 30 ms + 2.75 ms a token (the 2-core EPYC, bf16), widths 4-40
        tokens = 4 + (step * 7) % 37
        cost.add(tokens, 0.030 + 0.00275 * tokens)
    assert abs(cost.fixed_tokens() - 30 / 2.75) < 0.5
    # a cheaper fixed part turns drafts kept one time in three off where 40 would feed them
    assert draft_width([4] * 8, [0.35] * 8, cost.fixed_tokens()) == 0 < draft_width([4] * 8, [0.35] * 8)


async def test_the_engine_fits_the_forward_cost_per_thread_count(prompts):
    """A step beside a learner (own_cores) and one alone (all_cores) cost differently, so each
    thread count keeps its own fit, and a step feeds the fit of the count it runs on."""
    engine = make_engine(_config())
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=24)
        await asyncio.gather(*[engine.generate(p, sp) for p in prompts])
        with engine.all_cores():
            await asyncio.gather(*[engine.generate(p, sp) for p in prompts])
        counts = {engine.own_threads, max(engine.own_threads, os.cpu_count() or 1)}
        assert set(engine.forward_costs) == counts
        assert all(fit.w > 0 for fit in engine.forward_costs.values())
        assert engine.forward_cost() is engine.forward_costs[engine.own_threads]
    finally:
        await engine.close()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_speculating_engine_emits_the_plain_engines_tokens_and_the_trainers_log_probs(prompts, temperature):
    """A row samples each verified position with its own generator, one draw per emitted token, so
    a seeded request draws the same tokens as without speculation (fp32: the logits of a
    verification pass equal a decode step's to ~1e-5); the batch mixes rows of different lengths
    and drafts, so the rejected drafts' masked columns sit between kept ones."""
    def sampling(i: int) -> SamplingParams:
        return SamplingParams(temperature=temperature, max_tokens=48, seed=i)

    assert _config().engine.speculative_tokens > 0  # on by default
    plain, plain_m, _ = await _generate(_config(**{"engine.speculative_tokens": 0}), prompts, sampling)
    spec, spec_m, engine = await _generate(_config(), prompts, sampling)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert spec_m["tokens"] == plain_m["tokens"] == sum(len(o.token_ids) for o in spec)
    assert spec_m["accepted_tokens"] > 0 and spec_m["draft_tokens"] >= spec_m["accepted_tokens"]
    assert spec_m["batch_size_sum"] < plain_m["batch_size_sum"]  # fewer row-steps for the same tokens
    for prompt, out, ref in zip(prompts, spec, plain):
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref.logprobs)) < 1e-4
        with torch.no_grad():
            trainer = token_logprobs(engine.model, torch.tensor([prompt + out.token_ids]),
                                     temperature=temperature or 1.0)[0][len(prompt):]
        assert float((trainer - torch.tensor(out.logprobs)).abs().max()) < 1e-4


async def test_a_speculated_turn_is_kept_whole_for_the_next_turns_prefix(prompts):
    """The rejected drafts' columns are padding, not sequence: the kept prefix of a speculated turn
    is exactly its prompt and completion, so turn 2 prefills only its new tokens."""
    engine = make_engine(_config())
    tok = engine.tokenizer
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=40)
        first = await engine.generate(prompts[0], sp)
        assert engine.metrics["accepted_tokens"] > 0
        obs = tok.encode("<|im_end|>\n<|im_start|>user\nOnce more.<|im_end|>\n<|im_start|>assistant\n",
                         add_special_tokens=False)
        prompt = prompts[0] + first.token_ids + obs
        second = await engine.generate(prompt, sp)
        assert second.metrics["cached_tokens"] == len(prompts[0]) + len(first.token_ids) - 1
        with torch.no_grad():
            trainer = token_logprobs(engine.model, torch.tensor([prompt + second.token_ids]))[0][len(prompt):]
        assert float((trainer - torch.tensor(second.logprobs)).abs().max()) < 1e-4
    finally:
        await engine.close()


async def test_speculation_respects_max_tokens_and_stop_tokens(prompts):
    engine = make_engine(_config())
    try:
        for n in (1, 2, 5, 9):
            out = await engine.generate(prompts[1], SamplingParams(temperature=0.0, max_tokens=n))
            assert len(out.token_ids) == n and out.finish_reason == "length"
        full = await engine.generate(prompts[2], SamplingParams(temperature=0.0, max_tokens=200))
        assert full.finish_reason == "stop" and full.token_ids[-1] in engine.eos_ids
        assert all(t not in engine.eos_ids for t in full.token_ids[:-1])
    finally:
        await engine.close()


def test_speculative_tokens_must_not_be_negative():
    from agentrl.inference.hf import HFEngine

    with pytest.raises(ValueError, match="speculative_tokens"):
        HFEngine(resolve_configured(_config().model), speculative_tokens=-1)


async def test_a_compacted_cache_generates_what_the_sparse_one_does(prompts, monkeypatch):
    """Rows whose masked columns are squeezed out of the cache (here after every step that can
    save a column) emit the same tokens with the same log-probs as the uncompacted engine."""
    import agentrl.inference.hf as hf

    def sampling(i: int) -> SamplingParams:
        return SamplingParams(temperature=0.7, max_tokens=40, seed=i)

    sparse, _, _ = await _generate(_config(), prompts, sampling)
    compactions = []
    real = hf._compact_if_sparse

    def always(batch):
        before = batch.mask.shape[1]
        real(batch, min_saved=1, min_fraction=0.0)
        compactions.append(before - batch.mask.shape[1])

    monkeypatch.setattr(hf, "_compact_if_sparse", always)
    dense, _, _ = await _generate(_config(), prompts, sampling)
    assert sum(compactions) > 0  # columns were squeezed out
    assert [o.token_ids for o in dense] == [o.token_ids for o in sparse]
    assert max(abs(a - b) for o, r in zip(dense, sparse) for a, b in zip(o.logprobs, r.logprobs)) < 1e-4
