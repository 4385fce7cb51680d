"""The hf engine in the trainer's forward precision (`engine.dtype: auto`): under a bf16 trainer it
keeps the linear weights in bf16 and runs under the same autocast; the relay stores those weights
in bf16 so the engine shares its snapshot. Real embedded model, built by `make_engine` as
`agentrl train` builds it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl import attention
from agentrl.attention import flash_decode_attention, grouped_decode_attention
from agentrl.config import load_config
from agentrl.inference import make_engine
from agentrl.inference.base import SamplingParams
from agentrl.inference.cpu import packed_linear
from agentrl.inference.cpu.packed_linear import PackedLinear
from agentrl.laminar.relay import Relay, layout
from agentrl.models import autocast_weight_names, load_model, load_tokenizer, resolve_configured
from agentrl.trainer.logprobs import token_logprobs


def _config(**overrides: str):
    return load_config(env="code", overrides=[f"{k}={v}" for k, v in overrides.items()])


@pytest.fixture(scope="module")
def path():
    return resolve_configured(_config().model)


@pytest.fixture(scope="module")
def prompts(path) -> list[list[int]]:
    tok = load_tokenizer(path)
    asks = ["Write a python function that reverses a string, then test it.", "What is 17 * 23? Think step by step.",
            "Name three prime numbers and say why they are prime.", "Explain recursion to a child."]
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for q in asks]


async def test_make_engine_follows_the_trainer_precision():
    bf16 = make_engine(_config(**{"trainer.dtype": "bfloat16"}))
    fp32 = make_engine(_config(**{"trainer.dtype": "float32"}))
    pinned = make_engine(_config(**{"trainer.dtype": "bfloat16", "engine.dtype": "float32"}))
    try:
        linear = autocast_weight_names(bf16.model)
        params = dict(bf16.model.named_parameters())
        assert bf16.autocast == "bfloat16" and linear and set(bf16.weight_dtypes) == linear
        assert all(params[n].dtype == torch.bfloat16 for n in linear)
        # the embedding (tied to the LM head) and the norms stay fp32, as autocast leaves them
        assert bf16.model.model.embed_tokens.weight.dtype == torch.float32
        assert bf16.model.lm_head.weight is bf16.model.model.embed_tokens.weight
        assert "lm_head.weight" not in linear and all("norm" not in n for n in linear)
        for engine in (fp32, pinned):
            assert engine.autocast == "float32" and engine.weight_dtypes == {}
            assert all(p.dtype == torch.float32 for p in engine.model.parameters())
    finally:
        for engine in (bf16, fp32, pinned):
            await engine.close()


def test_a_forward_on_the_cast_weights_is_the_trainers_bf16_forward_bit_for_bit(path, prompts):
    """Storing in bf16 what autocast casts changes nothing autocast computes."""
    trainer = load_model(path)
    engine = make_engine(_config(**{"trainer.dtype": "bfloat16"}))
    ids = torch.tensor([prompts[0]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = token_logprobs(trainer, ids)
        got = token_logprobs(engine.model, ids)
    assert torch.equal(ref, got)


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "grouped"])
async def test_bf16_engine_log_probs_agree_with_the_bf16_trainer_within_bf16_noise(monkeypatch, flash, path, prompts):
    """Generation (prefill, then one-token decode steps with a bf16 KV cache and the grouped decode
    attention or torch's flash kernel) against the trainer's full bf16 forward. Measured: mean |Δ|
    0.027, max 0.24-0.33, about what an fp32 engine shows beside a bf16 trainer (mean 0.024); a
    wrong cache, mask or head grouping gives errors of whole nats."""
    monkeypatch.setattr(attention, "half_precision_flash", lambda: flash)
    engine = make_engine(_config(**{"trainer.dtype": "bfloat16"}))
    trainer = load_model(path)
    try:
        outs = [await engine.generate(p, SamplingParams(temperature=1.0, max_tokens=48, seed=i))
                for i, p in enumerate(prompts)]
        outs += await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, max_tokens=48, seed=9 + i))
                                       for i, p in enumerate(prompts)))  # batched, left-padded rows
    finally:
        await engine.close()
    diffs = []
    for prompt, out in zip(prompts + prompts, outs):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            ref = token_logprobs(trainer, ids)[0, len(prompt):]
        diffs.append((ref - torch.tensor(out.logprobs)).abs())
    every = torch.cat(diffs)
    assert len(every) > 100
    assert float(every.mean()) < 0.06 and float(every.max()) < 1.0


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "grouped"])
async def test_a_short_batched_bf16_prefill_samples_its_left_padded_rows(monkeypatch, flash, path):
    """Prompts of at most MAX_GROUPED_QUERIES tokens and different lengths, with no prefix to reuse,
    are prefilled through the grouped attention (or the flash kernel), where a left-padding query
    attends to nothing. Its output must stay finite: the next layer reads that position back as a
    masked key (0 x NaN is NaN), and stop 38's first version sampled the padded rows from NaN log-probs."""
    from agentrl.attention import MAX_GROUPED_QUERIES

    monkeypatch.setattr(attention, "half_precision_flash", lambda: flash)

    tok = load_tokenizer(path)
    short = [tok.encode(q) for q in ("Say hello.", "Repeat: a b c a b c a b c", "Count from 1 to 20, one by one.")]
    assert len({len(p) for p in short}) == 3 and max(map(len, short)) <= MAX_GROUPED_QUERIES
    engine = make_engine(_config(**{"trainer.dtype": "bfloat16"}))
    trainer = load_model(path)
    try:
        outs = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, max_tokens=8, seed=i))
                                      for i, p in enumerate(short)))
    finally:
        await engine.close()
    for prompt, out in zip(short, outs):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            ref = token_logprobs(trainer, ids)[0, len(prompt):]
        assert float((ref - torch.tensor(out.logprobs)).abs().max()) < 1.0  # whole nats (or NaN) if broken


def test_the_flash_kernel_is_chosen_exactly_where_the_cpu_has_amx_tiles():
    """`half_precision_flash` follows the CPU's own flags (Linux lists AMX tiles as `amx_tile`; a CPU
    without them, x86 or ARM, takes the grouped attention, which the tests below force either way)."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    assert ("amx_tile" in flags) == attention.half_precision_flash()


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "grouped"])
async def test_a_bf16_decode_step_takes_the_attention_chosen_for_the_cpu(prompts, monkeypatch, flash):
    """A request alone in the batch has no padding, so transformers passes no mask; batched rows
    come with one. Either way a bf16 decode step must take the kernel `half_precision_flash` picks:
    torch's flash kernel with AMX tiles, else the grouped attention (without AMX the flash kernel's
    one-token bf16 step took 0.196 s at 10 rows x 400 cached tokens, against 0.090 s)."""
    monkeypatch.setattr(attention, "half_precision_flash", lambda: flash)
    kernel_calls, grouped_calls = [], []
    real_kernel, real_grouped = torch.nn.functional.scaled_dot_product_attention, attention.grouped_decode_attention

    def counting_kernel(query, *args, **kwargs):
        if query.shape[-2] == 1:
            kernel_calls.append(query.dtype)
        return real_kernel(query, *args, **kwargs)

    def counting_grouped(query, *args, **kwargs):
        grouped_calls.append(query.shape[-2])
        return real_grouped(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_kernel)
    monkeypatch.setattr(attention, "grouped_decode_attention", counting_grouped)
    engine = make_engine(_config(**{"trainer.dtype": "bfloat16"}))
    try:
        alone = await engine.generate(prompts[0], SamplingParams(temperature=0.0, max_tokens=6))
        batched = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=0.0, max_tokens=6))
                                         for p in prompts[1:]))
    finally:
        await engine.close()
    assert len(alone.token_ids) == 6 and all(len(o.token_ids) == 6 for o in batched)
    if flash:
        assert kernel_calls and set(kernel_calls) == {torch.bfloat16} and grouped_calls == []
    else:
        assert kernel_calls == [] and 1 in grouped_calls


DECODE_ATTENTIONS = pytest.mark.parametrize("attend", [grouped_decode_attention, flash_decode_attention],
                                            ids=["grouped", "flash"])


@DECODE_ATTENTIONS
@pytest.mark.parametrize(("queries", "padded"), [(1, True), (1, False), (5, True)])
@pytest.mark.parametrize("length", [7, 300])
def test_decode_attention_equals_sdpa_on_a_strided_cache(length, padded, queries, attend):
    """One query per row (a decode step), or a few under a causal mask over the last columns (a
    speculative step's verification, with a rejected draft's column masked out in one row)."""
    torch.manual_seed(0)
    batch, heads, kv_heads, dim = 3, 9, 3, 64
    query = torch.randn(batch, heads, queries, dim).bfloat16()
    buffer = torch.randn(batch, kv_heads, length + 64, dim).bfloat16()  # spare columns, as GrowingLayer
    key, value = buffer[:, :, :length], buffer.flip(-1)[:, :, :length]
    mask = torch.ones(batch, 1, queries, length, dtype=torch.bool)
    mask[0, ..., : length // 2] = False  # a left-padded row
    if queries > 1:
        mask[..., -queries:] = torch.ones(queries, queries, dtype=torch.bool).tril()
        mask[1, ..., -2] = False
    mask = mask if padded else None  # no row padded: transformers passes no mask at all
    got = attend(query, key, value, mask, None)
    ref = torch.nn.functional.scaled_dot_product_attention(query.float(), key.float(), value.float(),
                                                           attn_mask=mask, enable_gqa=True).transpose(1, 2)
    assert got.shape == (batch, queries, heads, dim) and got.dtype == torch.bfloat16
    assert float((got.float() - ref).abs().max()) < 2e-2  # bf16 rounding of the weights and output


@DECODE_ATTENTIONS
def test_decode_attention_of_a_query_with_nothing_to_attend_is_finite(attend):
    """A left-padding query in a prefill attends to no key; its output must be finite (unused,
    but read back by the next layer as a masked key), and the other rows' unchanged."""
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 9, 4, 64).bfloat16(), torch.randn(2, 3, 6, 64).bfloat16(), \
        torch.randn(2, 3, 6, 64).bfloat16()
    mask = torch.ones(6, 6, dtype=torch.bool).tril()[-4:].expand(2, 1, 4, 6).clone()
    mask[1, ..., :3] = False  # row 1: three columns of left padding, so its first query sees nothing
    got = attend(query, key, value, mask, None)
    assert bool(got.isfinite().all())
    ref = torch.nn.functional.scaled_dot_product_attention(query.float(), key.float(), value.float(),
                                                           attn_mask=mask, enable_gqa=True).transpose(1, 2)
    live = mask.any(-1)[:, 0]  # [B, q]: queries with a key to attend
    assert float((got.float() - ref)[live].abs().max()) < 2e-2


async def test_relay_stores_the_engine_precision_and_the_engine_shares_it(path, prompts):
    engine = make_engine(_config(**{"trainer.dtype": "bfloat16"}))
    weights = load_model(path).state_dict()  # the learner's fp32 weights
    relay = Relay("m")
    try:
        full = layout(weights)[1]
        await relay.push(weights, 1, engine.weight_dtypes)
        snap = await relay.fetch_latest(-1, policy="local")
        saved = sum(weights[n].numel() * 2 for n in engine.weight_dtypes)
        assert snap.nbytes <= full - saved + 64 * len(weights)
        state = snap.state_dict()
        for name in engine.weight_dtypes:
            assert torch.equal(state[name], weights[name].to(torch.bfloat16))  # the cast autocast makes
        await engine.load_weights(state, 1)
        start, end = snap.flat.data_ptr(), snap.flat.data_ptr() + snap.nbytes
        assert all(start <= p.data_ptr() < end for p in engine.model.parameters())  # nothing of its own
        assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
        out = await engine.generate(prompts[1], SamplingParams(temperature=0.0, max_tokens=8))
        assert len(out.token_ids) == 8 and out.version == 1
    finally:
        await engine.close()
        await relay.stop()


async def test_the_linear_weights_are_packed_once_per_weight_version_and_stay_bit_equal(path, prompts):
    """The bf16 engine keeps every linear weight (the tied head's cast included) packed for oneDNN
    between steps (packed_linear.py): logits equal autocast's per-step `F.linear` to the bit, and a
    changed weight — in place (a learner step on shared weights) or swapped by `load_weights` — is
    packed again, not served stale."""
    engine = make_engine(_config(**{"trainer.dtype": "bfloat16"}))
    if not packed_linear.onednn_packing_available():  # this torch cannot pack: the fallback (tested below too)
        try:
            assert len(engine._linears) == 1 and not engine.model.lm_head.pack
        finally:
            await engine.close()
        return
    reference = load_model(path)  # transformers' own layers, autocast casting the head on every forward
    ids = torch.tensor([prompts[2]])
    head, down = engine.model.lm_head, engine.model.model.layers[3].mlp.down_proj
    linears = [m for m in engine.model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        assert head.weight is engine.model.model.embed_tokens.weight
        assert all(isinstance(m, PackedLinear) and m.pack for m in linears) and len(linears) == 7 * 30 + 1

        def both() -> tuple[torch.Tensor, torch.Tensor]:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                return token_logprobs(reference, ids), token_logprobs(engine.model, ids)

        ref, got = both()
        assert torch.equal(ref, got)
        assert all(m.kept_weight().is_mkldnn and m.kept_bytes() == m.weight.numel() * 2 for m in linears)
        with torch.no_grad():  # in-place writes, as an optimizer step on weights the engine shares
            for model in (reference, engine.model):
                model.model.embed_tokens.weight.mul_(1.5)
                model.model.layers[3].mlp.down_proj.weight.mul_(2.0)  # exact in bf16 and fp32 alike
        ref2, got2 = both()
        assert torch.equal(ref2, got2) and not torch.equal(got, got2)
        state = {n: t.clone() for n, t in reference.state_dict().items()}
        state["model.embed_tokens.weight"] /= 1.5
        state["model.layers.3.mlp.down_proj.weight"] /= 2.0
        state["lm_head.weight"] = state["model.embed_tokens.weight"]  # the clones untied them
        await engine.load_weights(state, 1)
        assert head.kept_bytes() == down.kept_bytes() == 0  # dropped with the old weights
        with torch.no_grad():
            reference.model.embed_tokens.weight.div_(1.5)
            reference.model.layers[3].mlp.down_proj.weight.div_(2.0)
        ref3, got3 = both()
        assert torch.equal(ref3, got3) and torch.equal(got3, got)
        assert await engine.release_weights() > 0 and all(m.kept_bytes() == 0 for m in linears)
    finally:
        await engine.close()


async def test_packing_changes_no_token_or_log_prob_of_generation(prompts):
    """`engine.pack_weights` on (the default) and off: the same sampled tokens and bit-equal
    log-probs over batched, speculative multi-token decoding; off, only the tied head keeps a cast."""
    packed = make_engine(_config(**{"trainer.dtype": "bfloat16"}))
    plain = make_engine(_config(**{"trainer.dtype": "bfloat16", "engine.pack_weights": "false"}))
    try:
        outs = {}
        for name, engine in (("packed", packed), ("plain", plain)):
            outs[name] = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=1.0, max_tokens=24,
                                                                                   seed=i))
                                                for i, p in enumerate(prompts)))
        for a, b in zip(outs["packed"], outs["plain"]):
            assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
        assert len(plain._linears) == 1 and plain._linears[0] is plain.model.lm_head and not plain.model.lm_head.pack
        assert packed.metrics["draft_tokens"] > 0  # speculative (multi-query) steps were compared too
    finally:
        await packed.close()
        await plain.close()


async def test_a_torch_without_onednn_packing_keeps_the_plain_cast(monkeypatch, prompts):
    """Packing rests on inductor's private oneDNN ops; where this torch lacks them the engine
    falls back to stop 32's behaviour (only the tied head keeps a cast) and generates the same."""
    reference = make_engine(_config(**{"trainer.dtype": "bfloat16", "engine.pack_weights": "false"}))
    monkeypatch.setattr(packed_linear, "onednn_packing_available", lambda: False)
    fallback = make_engine(_config(**{"trainer.dtype": "bfloat16"}))  # pack_weights on, but nothing to pack with
    try:
        assert len(fallback._linears) == 1 and not fallback.model.lm_head.pack
        sampling = SamplingParams(temperature=1.0, max_tokens=8, seed=3)
        a, b = await fallback.generate(prompts[1], sampling), await reference.generate(prompts[1], sampling)
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    finally:
        await fallback.close()
        await reference.close()


def test_the_packed_head_reads_a_prefills_last_position_without_copying_its_weight():
    """A prefill keeps only each row's last position (`logits_to_keep=1`): a [rows, 1, d] slice of
    the hidden states. torch's matmul sends such a slice through a batched product that copies the
    whole 49152 x 576 weight per row (~190 ms a row in bf16, stop 38); the head must not."""
    engine = make_engine(_config(**{"trainer.dtype": "bfloat16"}))
    head = engine.model.lm_head
    assert isinstance(head, PackedLinear)
    hidden = torch.randn(2, 7, head.in_features).bfloat16()[:, -1:, :]  # not contiguous, as the model hands it
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = head(hidden)
        ref = head(hidden.contiguous())
    assert got.shape == (2, 1, head.out_features) and torch.equal(got, ref)
    assert "aten::bmm" not in {e.key for e in prof.key_averages()}
