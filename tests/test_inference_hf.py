"""The hf engine on the real embedded model: batching, log-prob exactness, stops, weight swaps."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from agentrl.config import load_config
from agentrl.inference import make_engine
from agentrl.inference.base import GenerateOutput, InferenceEngine, SamplingParams
from agentrl.inference.hf import HFEngine
from agentrl.inference.sampling import processed_logprobs
from agentrl.models import load_tokenizer, resolve_model
from agentrl.trainer.logprobs import token_logprobs

TOL = 1e-3  # fp32 acceptance bound (issue 2)


@pytest.fixture(scope="module")
def model_path():
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def prompts(model_path) -> list[list[int]]:
    tok = load_tokenizer(model_path)
    questions = ["Name a fruit.", "What is 2+2?", "Write a haiku about rain.", "Say hello in French.",
                 "List three colors.", "What is Python?", "Give me a random word.", "Count to five."]
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for q in questions]


@pytest.fixture
async def engine(model_path):
    eng = HFEngine(model_path, max_batch_size=16, seed=0)
    yield eng
    await eng.close()


def reference_logprobs(model: torch.nn.Module, prompt: list[int], out: GenerateOutput,
                       temperature: float = 1.0) -> torch.Tensor:
    """The trainer's forward pass over prompt + completion, read at the completion tokens."""
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        lp = token_logprobs(model, ids, temperature=temperature)[0]
    return lp[len(prompt):]


def max_diff(model, prompt, out, temperature=1.0) -> float:
    ref = reference_logprobs(model, prompt, out, temperature)
    return float((ref - torch.tensor(out.logprobs)).abs().max())


async def test_engine_satisfies_protocol(engine):
    assert isinstance(engine, InferenceEngine)


async def test_eight_concurrent_match_forward_pass(engine, prompts):
    sp = SamplingParams(temperature=1.0, max_tokens=16, seed=1)
    outs = await asyncio.gather(*[engine.generate(p, sp) for p in prompts])
    for p, o in zip(prompts, outs):
        assert 1 <= len(o.token_ids) == len(o.logprobs) <= 16
        assert o.version == 0 and o.finish_reason in ("stop", "length")
        assert max_diff(engine.model, p, o) < TOL
    assert engine.metrics["max_batch_size"] == 8  # one batch, not 8 sequential requests
    assert engine.metrics["prefills"] == 1
    assert min(o.metrics["mean_batch_size"] for o in outs) > 1


async def test_temperature_and_top_p_logprobs_are_processed(engine, prompts):
    sp = SamplingParams(temperature=0.7, max_tokens=16, seed=2)
    outs = await asyncio.gather(*[engine.generate(p, sp) for p in prompts[:4]])
    for p, o in zip(prompts, outs):
        assert max_diff(engine.model, p, o, temperature=0.7) < TOL
        # ... and not those of the untempered model (the check could fail)
        assert max_diff(engine.model, p, o, temperature=1.0) > 1e-2

    sp = SamplingParams(temperature=0.8, top_p=0.5, max_tokens=16, seed=3)
    out = await engine.generate(prompts[2], sp)
    ids = torch.tensor([prompts[2] + out.token_ids])
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(prompts[2]) - 1:-1]
    n = logits.shape[0]
    ref = processed_logprobs(logits, torch.full((n,), 0.8), torch.full((n,), 0.5))
    ref = ref.gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert float((ref - torch.tensor(out.logprobs)).abs().max()) < TOL
    tempered = reference_logprobs(engine.model, prompts[2], out, 0.8)
    assert (torch.tensor(out.logprobs) >= tempered - 1e-5).all()  # renormalised nucleus mass


async def test_multi_turn_tokens_reproduce_in_one_forward(engine, prompts):
    """Two policy turns with a tool observation between them, token-in/token-out: one forward
    pass over the whole sequence reproduces every policy token's log-prob."""
    tok = engine.tokenizer
    sp = SamplingParams(temperature=0.9, max_tokens=12, seed=6)
    tokens = list(prompts[5])
    policy: list[tuple[int, float]] = []  # (position, behaviour log-prob)
    for turn in range(2):
        out = await engine.generate(tokens, sp)
        policy += [(len(tokens) + i, lp) for i, lp in enumerate(out.logprobs)]
        tokens += out.token_ids
        if out.token_ids[-1] != tok.eos_token_id:
            tokens.append(tok.eos_token_id)  # close the turn as the chat template would
        obs = tok.encode(f"\n<|im_start|>tool\nresult {turn}<|im_end|>\n<|im_start|>assistant\n",
                         add_special_tokens=False)
        tokens += obs  # observation tokens appended, history never re-tokenized
    with torch.no_grad():
        ref = token_logprobs(engine.model, torch.tensor([tokens]), temperature=0.9)[0]
    diffs = [abs(float(ref[pos]) - lp) for pos, lp in policy]
    assert len(diffs) > 2 and max(diffs) < TOL


async def test_next_turn_reuses_the_kept_prefix(engine, prompts):
    """Turn 2's prompt extends turn 1's prompt and completion: only the new tokens are
    prefilled (engine metrics), and the log-probs still match the trainer's forward pass."""
    tok = engine.tokenizer
    sp = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
    first = await engine.generate(prompts[2], sp)
    assert first.metrics["cached_tokens"] == 0
    assert engine.metrics["prefill_tokens"] == len(prompts[2])
    obs = tok.encode("<|im_end|>\n<|im_start|>user\nAnd another one?<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False)
    prompt = prompts[2] + first.token_ids + obs
    second = await engine.generate(prompt, sp)
    kept = len(prompts[2]) + len(first.token_ids) - 1  # the last sampled token was never fed
    assert second.metrics["cached_tokens"] == kept == engine.metrics["prefix_hit_tokens"]
    assert engine.metrics["prefill_tokens"] == len(prompts[2]) + len(prompt) - kept
    assert engine.metrics["prefill_forwards"] == 2  # one pass per lone request
    assert 0 < engine.metrics["prefill_s"] < engine.metrics["forward_s"]
    assert max_diff(engine.model, prompt, second) < 1e-4


async def test_prefix_store_off_and_over_budget(model_path, prompts):
    """prefix_cache_mb=0 keeps nothing; a budget smaller than one prefix keeps nothing either."""
    for mb in (0, 0.01):
        eng = HFEngine(model_path, seed=0, prefix_cache_mb=mb)
        try:
            first = await eng.generate(prompts[0], SamplingParams(max_tokens=4, seed=0))
            again = await eng.generate(prompts[0] + first.token_ids, SamplingParams(max_tokens=4, seed=0))
            assert again.metrics["cached_tokens"] == 0 and eng.metrics["prefix_cache_bytes"] == 0
        finally:
            await eng.close()
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        HFEngine(model_path, prefix_cache_mb=-1)


async def test_engine_trims_the_heap_from_its_worker_thread(model_path, prompts, monkeypatch):
    """The engine hands freed heap pages back every `trim_every` steps, sooner after a step that
    prefilled or finished rows, on its own worker thread; trim_every=0 never trims."""
    import threading

    import agentrl.inference.hf as hf

    calls: list[str] = []
    monkeypatch.setattr(hf, "trim_heap", lambda: calls.append(threading.current_thread().name) or True)
    sp = SamplingParams(max_tokens=24, seed=0, stop_token_ids=())
    for every in (8, 0):
        calls.clear()
        eng = HFEngine(model_path, seed=0, trim_every=every)
        try:
            out = await eng.generate(prompts[0], sp)
        finally:
            await eng.close()
        steps = int(eng.metrics["steps"])
        if every == 0:
            assert calls == [] and eng.metrics["heap_trims"] == 0
            continue
        # the first step prefilled: trimmed after every // 4 steps; then every `every` steps
        assert steps == len(out.token_ids) and len(calls) == eng.metrics["heap_trims"]
        assert steps // every <= len(calls) <= steps // (every // 4)
        assert calls and all(name.startswith("hf-engine") for name in calls)
    with pytest.raises(ValueError, match="trim_every"):
        HFEngine(model_path, trim_every=-1)


async def test_engine_leaves_the_process_thread_count_alone(model_path, prompts):
    """The engine's forward passes run with its own thread count on its own thread; the rest of
    the process (a learner) keeps the pool it set."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    eng = HFEngine(model_path, num_threads=1)
    seen: list[int] = []
    eng.model.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    try:
        await eng.generate(prompts[0], SamplingParams(max_tokens=2))
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        await eng.close()
        torch.set_num_threads(before)


async def test_all_cores_decodes_on_every_core_for_the_block_only(model_path, prompts):
    """Generation that runs alone (an evaluation between training stages) takes every core; the
    engine's own count comes back after, and the process's pool is never touched."""
    eng = HFEngine(model_path, num_threads=1)
    seen: list[int] = []
    eng.model.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    threads = torch.get_num_threads()
    try:
        with eng.all_cores():
            await eng.generate(prompts[0], SamplingParams(max_tokens=2))
            alone, seen[:] = set(seen), []
            with eng.own_cores():  # a learner step beside it: back to its own share
                await eng.generate(prompts[2], SamplingParams(max_tokens=2))
            beside, seen[:] = set(seen), []
        await eng.generate(prompts[1], SamplingParams(max_tokens=2))
        assert alone == {os.cpu_count()} and beside == {1} and set(seen) == {1} and eng.num_threads == 1
        assert torch.get_num_threads() == threads
    finally:
        await eng.close()


async def test_stop_string_ends_generation_and_logprobs_still_match(engine, prompts):
    tok = engine.tokenizer
    free = await engine.generate(prompts[2], SamplingParams(temperature=0.7, max_tokens=30, seed=5))
    text = tok.decode(free.token_ids)
    stop = tok.decode(free.token_ids[6:8]).strip() or tok.decode(free.token_ids[6:9])
    assert stop and stop in text
    out = await engine.generate(prompts[2], SamplingParams(temperature=0.7, max_tokens=30, seed=5, stop=(stop,)))
    assert out.finish_reason == "stop"
    assert out.token_ids == free.token_ids[: len(out.token_ids)]  # same seed: a prefix of the free run
    assert stop in tok.decode(out.token_ids)  # the matched text is kept
    assert stop not in tok.decode(out.token_ids[:-1])  # ... and it ends at the first match
    assert max_diff(engine.model, prompts[2], out, temperature=0.7) < TOL


async def test_stop_token_ids_eos_and_length(engine, prompts):
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    free = await engine.generate(prompts[5], greedy)
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    target = free.token_ids[4]
    out = await engine.generate(prompts[5], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(target,)))
    assert out.finish_reason == "stop" and out.token_ids[-1] == target
    assert out.token_ids == free.token_ids[: free.token_ids.index(target) + 1]
    short = await engine.generate(prompts[1], SamplingParams(temperature=0.0, max_tokens=64))
    assert short.finish_reason == "stop" and short.token_ids[-1] == engine.tokenizer.eos_token_id


async def test_seed_reproducible_alone_and_in_a_batch(engine, prompts):
    sp = SamplingParams(temperature=1.0, max_tokens=12, seed=42)
    alone = await engine.generate(prompts[0], sp)
    batched = await asyncio.gather(engine.generate(prompts[0], sp),
                                   *[engine.generate(p, SamplingParams(max_tokens=12)) for p in prompts[1:4]])
    assert batched[0].token_ids == alone.token_ids
    other = await engine.generate(prompts[0], SamplingParams(temperature=1.0, max_tokens=12, seed=43))
    assert other.token_ids != alone.token_ids


async def test_requests_join_a_running_batch(engine, prompts):
    """A request arriving mid-generation joins at a step boundary (cache merge with padding both
    ways: a short prompt into a long-context batch, then a long prompt into it); every
    sequence still matches the forward pass."""
    long_prompt = prompts[2] + prompts[3][1:]  # longer than anything running
    first = asyncio.create_task(engine.generate(prompts[1], SamplingParams(max_tokens=40, seed=7)))
    while engine.metrics["steps"] < 5:
        await asyncio.sleep(0.01)
    second = asyncio.create_task(engine.generate(prompts[0], SamplingParams(max_tokens=8, seed=8)))
    while engine.metrics["steps"] < 10:
        await asyncio.sleep(0.01)
    third = asyncio.create_task(engine.generate(long_prompt, SamplingParams(max_tokens=8, seed=9)))
    a, b, c = await asyncio.gather(first, second, third)
    assert engine.metrics["prefills"] >= 3 and engine.metrics["max_batch_size"] >= 2
    assert b.metrics["mean_batch_size"] > 1
    for p, o in ((prompts[1], a), (prompts[0], b), (long_prompt, c)):
        assert max_diff(engine.model, p, o) < TOL


async def test_rows_that_join_a_decoding_batch_are_prefilled_in_its_forward_pass(model_path, prompts):
    """Through `make_engine`, as `agentrl train` builds the engine: new requests (first turns of
    unlike lengths, and a second turn that reuses its kept prefix) admitted while another row
    decodes with speculation go through the model in that step's one ragged pass (`fused_prefills`,
    no prefill pass of their own). Every output is the one the same engine gives with a pass per
    rectangle: the same tokens, log-probs within 3e-5 (fp32 kernel-shape noise: up to 1.1e-5 on an
    AVX512-BF16 EPYC without AMX, under 1e-5 on an AMX Xeon), and within 1e-4 of the trainer's forward."""
    tok = load_tokenizer(model_path)
    obs = tok.encode("<|im_end|>\n<|im_start|>user\nAnd another one?<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False)

    async def run(fuse: bool) -> tuple[list[tuple[list[int], GenerateOutput]], dict[str, float], torch.nn.Module]:
        engine = make_engine(load_config(overrides=["trainer.dtype=float32"]))  # fp32: outputs compare exactly
        engine.fuse_passes = fuse
        try:
            first_turn = await engine.generate(prompts[5], SamplingParams(max_tokens=8, seed=1))
            steps = engine.metrics["steps"]
            running = asyncio.create_task(engine.generate(prompts[1], SamplingParams(temperature=0.0, max_tokens=40)))
            while engine.metrics["steps"] < steps + 3:  # it decodes when the others arrive
                await asyncio.sleep(0.005)
            joining = [prompts[0], prompts[2] + prompts[3][1:] + prompts[4][1:], prompts[5] + first_turn.token_ids + obs]
            outs = await asyncio.gather(running, *(engine.generate(p, SamplingParams(max_tokens=10, seed=i))
                                                   for i, p in enumerate(joining)))
            return list(zip([prompts[1], *joining], outs)), dict(engine.metrics), engine.model
        finally:
            await engine.close()

    fused, fused_metrics, model = await run(True)
    separate, separate_metrics, _ = await run(False)
    assert fused_metrics["fused_prefills"] >= 1 and separate_metrics["fused_prefills"] == 0
    assert fused_metrics["prefill_forwards"] < separate_metrics["prefill_forwards"]
    assert fused_metrics["draft_tokens"] > 0 and fused[3][1].metrics["cached_tokens"] > 0
    for (prompt, a), (_, b) in zip(fused, separate):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 3e-5
        assert max_diff(model, prompt, a) < 1e-4


async def test_a_model_loaded_with_another_attention_runs_a_pass_per_rectangle(model_path, prompts):
    """Only agentrl's attention reads a ragged pass's parts: with transformers' own `sdpa` the
    engine fuses nothing (`fuse_passes` is off whatever was asked), and rows that join a decoding
    batch still get the tokens greedy decoding gives each of them alone."""
    engine = HFEngine(model_path, attn_implementation="sdpa", fuse_passes=True, speculative_tokens=0)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    try:
        assert engine.fuse_passes is False
        alone = [await engine.generate(p, greedy) for p in prompts[:3]]
        steps = engine.metrics["steps"]
        running = asyncio.create_task(engine.generate(prompts[0], SamplingParams(temperature=0.0, max_tokens=24)))
        while engine.metrics["steps"] < steps + 2:  # it decodes when the others arrive
            await asyncio.sleep(0.005)
        joined = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts[1:3]))
        await running
    finally:
        await engine.close()
    assert engine.metrics["fused_prefills"] == 0
    assert [o.token_ids for o in joined] == [o.token_ids for o in alone[1:]]


async def test_load_weights_changes_outputs_and_version(engine, prompts):
    sp = SamplingParams(temperature=0.0, max_tokens=10)
    before = await engine.generate(prompts[3], sp)
    norm = engine.model.state_dict()["model.norm.weight"]
    gen = torch.Generator().manual_seed(0)
    new = {"model.norm.weight": norm * (1 + 0.5 * torch.randn(norm.shape, generator=gen))}
    # A request in flight finishes on the old weights; one submitted during the swap on the new.
    steps = engine.metrics["steps"]
    inflight = asyncio.create_task(engine.generate(prompts[4], SamplingParams(max_tokens=20, seed=1)))
    while engine.metrics["steps"] < steps + 2:
        await asyncio.sleep(0.01)
    swap = asyncio.create_task(engine.load_weights(new, version=7))
    await asyncio.sleep(0)
    after = await engine.generate(prompts[3], sp)
    await swap
    old = await inflight
    assert old.version == 0 and after.version == 7 and engine.version == 7
    assert after.metrics["cached_tokens"] == 0  # KV kept under the old weights was dropped
    assert after.logprobs != before.logprobs
    assert max_diff(engine.model, prompts[3], after) < TOL  # engine really runs the new weights


async def test_share_weights_uses_the_given_tensors_without_a_copy(model_path, prompts):
    from agentrl.models import load_model

    policy = load_model(model_path)  # as the learner holds it: the evaluator passes views of these
    views = {k: v.detach() for k, v in policy.state_dict().items()}
    with torch.no_grad():
        policy.model.norm.weight.mul_(1.5)  # differ from the engine's own copy loaded from disk
    eng = HFEngine(model_path, seed=0)
    try:
        await eng.share_weights(views, version=4)
        live = dict(eng.model.named_parameters(remove_duplicate=False))
        assert live["model.norm.weight"].data_ptr() == policy.model.norm.weight.data_ptr()
        assert live["model.embed_tokens.weight"].data_ptr() == policy.model.embed_tokens.weight.data_ptr()
        assert eng.model.lm_head.weight is eng.model.model.embed_tokens.weight  # tied weights stay tied
        sp = SamplingParams(temperature=0.0, max_tokens=8)
        out = await eng.generate(prompts[0], sp)
        assert out.version == 4 and max_diff(policy, prompts[0], out) < TOL
        with torch.no_grad():  # the learner steps between evaluations: the engine sees it
            policy.model.norm.weight.mul_(0.5)
        await eng.share_weights(views, version=5)  # drops the KV kept under the old weights
        again = await eng.generate(prompts[0], sp)
        assert again.metrics["cached_tokens"] == 0 and max_diff(policy, prompts[0], again) < TOL
        await eng.share_weights({"model.norm.weight": views["model.norm.weight"].double()}, version=6)
        assert live["model.norm.weight"].dtype == torch.float32  # another dtype is copied, not shared
    finally:
        await eng.close()


async def test_forward_runs_off_the_event_loop(engine, prompts):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    task = asyncio.create_task(ticker())
    out = await engine.generate(prompts[0], SamplingParams(max_tokens=16, seed=0))
    task.cancel()
    seconds = out.metrics["seconds"]
    assert ticks > 0.3 * seconds / 0.005, (ticks, seconds)  # the loop kept ticking during forwards


async def test_cancelled_request_leaves_the_batch(engine, prompts):
    doomed = asyncio.create_task(engine.generate(prompts[0], SamplingParams(max_tokens=200, seed=0)))
    kept = asyncio.create_task(engine.generate(prompts[1], SamplingParams(max_tokens=12, seed=0)))
    while engine.metrics["steps"] < 3:
        await asyncio.sleep(0.01)
    doomed.cancel()
    out = await kept
    assert len(out.token_ids) >= 1 and max_diff(engine.model, prompts[1], out) < TOL
    assert doomed.cancelled()
    steps = engine.metrics["steps"]
    await asyncio.sleep(0.5)
    assert engine.metrics["steps"] == steps  # the 200-token request did not keep running


async def test_bad_input_is_named(engine, prompts):
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], SamplingParams())
    with pytest.raises(ValueError, match="not a token id"):
        await engine.generate([1, 10**9], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        await engine.generate(prompts[0], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="max_tokens"):
        await engine.generate(prompts[0], SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="non-empty strings"):
        await engine.generate(prompts[0], SamplingParams(stop=("",)))
    with pytest.raises(KeyError, match="unknown parameter"):
        await engine.load_weights({"nope.weight": torch.zeros(1)}, 1)
    with pytest.raises(ValueError, match="shape"):
        await engine.load_weights({"model.norm.weight": torch.zeros(3)}, 1)
    assert engine.version == 0


async def test_close_aborts_and_refuses(model_path, prompts):
    eng = HFEngine(model_path, max_batch_size=1)
    running = asyncio.create_task(eng.generate(prompts[0], SamplingParams(max_tokens=200)))
    waiting = asyncio.create_task(eng.generate(prompts[1], SamplingParams(max_tokens=200)))
    while eng.metrics["steps"] < 2:
        await asyncio.sleep(0.01)
    await eng.close()
    a, b = await running, await waiting
    assert a.finish_reason == "abort" and 1 <= len(a.token_ids) < 200
    assert b.finish_reason == "abort" and b.token_ids == []
    with pytest.raises(RuntimeError, match="closed"):
        await eng.generate(prompts[0], SamplingParams())


async def test_make_engine_follows_config(model_path):
    from agentrl.inference.openai import OpenAIEngine

    eng = make_engine(load_config(overrides=["engine.kind=hf", "engine.max_batch_size=3"]))
    assert isinstance(eng, HFEngine) and eng.max_batch_size == 3 and eng.model_path == model_path
    await eng.close()
    eng = make_engine(load_config(overrides=["engine.kind=openai", "engine.base_url=http://127.0.0.1:9/v1"]))
    assert isinstance(eng, OpenAIEngine) and eng.model == "smollm2-135m"
    await eng.close()


def test_common_prefix_and_length_groups():
    from agentrl.inference.cpu.kv_cache import common_prefix
    from agentrl.inference.hf import _similar_length_groups

    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 4, 5], 4) == 4
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 4], 3) == 3  # the last prompt token is always computed
    assert common_prefix([1, 2, 9, 4], [1, 2, 3, 4], 10) == 2
    assert common_prefix([7], [1], 10) == 0
    # a long first-turn prompt is not padded together with short continuations
    groups = _similar_length_groups([30, 400, 25, 28, 390])
    assert sorted(map(sorted, groups)) == [[0, 2, 3], [1, 4]]
    assert _similar_length_groups([5, 6, 7]) == [[2, 1, 0]]  # below the floor one pass is cheaper
