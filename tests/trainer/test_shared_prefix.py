"""The packed micro-batch (trainer/shared_prefix.py): the rows' common prompt computed once gives
the padded pass's log-probs, entropy and gradients, and is taken only where it is right."""

from __future__ import annotations

import pytest
import torch

from agentrl.attention import register
from agentrl.trainer import logprobs, shared_prefix
from agentrl.trainer.learner import enable_activation_checkpointing
from agentrl.trainer.logprobs import token_logprobs_and_stats

from .conftest import VOCAB, tiny_llama

PREFIX = 9


def _rows(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows that share their first PREFIX tokens, and policy positions after it (plus
    one inside the prefix, whose log-prob every row shares)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    positions = torch.zeros_like(ids, dtype=torch.bool)
    prefix = torch.randint(0, VOCAB, (PREFIX,), generator=g)
    for i, n in enumerate(lengths):
        ids[i, :PREFIX] = prefix
        ids[i, PREFIX:n] = torch.randint(0, VOCAB, (n - PREFIX,), generator=g)
        ids[i, PREFIX] = (prefix[0] + 1 + i) % VOCAB  # the rows part right after the prefix
        attn[i, :n] = 1
        positions[i, PREFIX + 1:n] = True
    positions[:, 4] = True
    return ids, attn, positions


@pytest.fixture
def gqa_model() -> torch.nn.Module:
    model = tiny_llama()
    model.set_attn_implementation(register())  # the attention every agentrl model loads with
    return model


def _stats_and_grads(model, ids, attn, positions, packs: bool, monkeypatch):
    monkeypatch.setattr(logprobs, "_packs", lambda m: packs)
    model.zero_grad()
    stats = token_logprobs_and_stats(model, ids, attn, temperature=0.7, positions=positions, entropy=True)
    (stats.logprobs * positions).sum().backward()
    return stats, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("checkpointed", [False, True])
def test_packed_pass_equals_the_padded_pass(gqa_model, monkeypatch, checkpointed) -> None:
    monkeypatch.setattr(shared_prefix, "MIN_SHARED_TOKENS", 4)
    if checkpointed:  # the learner's setting: the layout must reach the recomputed layers too
        gqa_model.train()
        enable_activation_checkpointing(gqa_model)
    ids, attn, positions = _rows([17, 12, 21, 14])
    padded, g_padded = _stats_and_grads(gqa_model, ids, attn, positions, False, monkeypatch)
    calls: list[int] = []
    pack = shared_prefix.pack
    monkeypatch.setattr(shared_prefix, "pack", lambda *a: (calls.append(1), pack(*a))[1])
    packed, g_packed = _stats_and_grads(gqa_model, ids, attn, positions, True, monkeypatch)
    assert calls, "the packed path was not taken"
    torch.testing.assert_close(packed.logprobs, padded.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed.entropy, padded.entropy, atol=1e-5, rtol=0)
    for a, b in zip(g_padded, g_packed):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_plan_packs_the_common_prefix_once(monkeypatch) -> None:
    monkeypatch.setattr(shared_prefix, "MIN_SHARED_TOKENS", 4)
    ids, attn, _ = _rows([17, 12, 21])
    spec = shared_prefix.plan(ids, attn)
    assert (spec.prefix, spec.lengths, spec.offsets) == (PREFIX, [8, 3, 12], [9, 17, 20])
    assert spec.masks[1].tolist() == [[True] * PREFIX + [True, False, False], [True] * PREFIX + [True, True, False],
                                      [True] * PREFIX + [True, True, True]]
    packed_ids, pos = shared_prefix.pack(ids, spec)
    assert packed_ids.shape == (1, PREFIX + 8 + 3 + 12)
    assert pos[0, :PREFIX].tolist() == list(range(PREFIX))
    assert pos[0, 17:20].tolist() == [PREFIX, PREFIX + 1, PREFIX + 2]  # row 1's suffix restarts at P
    assert torch.equal(packed_ids[0, 17:20], ids[1, PREFIX:12])
    index = shared_prefix.packed_index(spec, ids.shape[1])
    assert torch.equal(packed_ids[0, index[1, :12]], ids[1, :12])


def test_plan_declines_where_packing_is_wrong_or_pays_nothing(monkeypatch) -> None:
    monkeypatch.setattr(shared_prefix, "MIN_SHARED_TOKENS", 4)
    ids, attn, _ = _rows([17, 12, 21])
    assert shared_prefix.plan(ids, attn) is not None
    assert shared_prefix.plan(ids[:1], attn[:1]) is None  # one row: nothing to share
    left = attn.flip(-1)
    assert shared_prefix.plan(ids, left) is None  # left padding: not the layout it packs
    other = ids.clone()
    other[1, 2] = (other[1, 2] + 1) % VOCAB
    assert shared_prefix.plan(other, attn) is None  # 2 tokens in common < MIN_SHARED_TOKENS
    same = ids[:1].repeat(2, 1)
    spec = shared_prefix.plan(same, attn[:1].repeat(2, 1))
    assert spec is not None and spec.lengths == [1, 1]  # identical rows keep one token each


def test_other_attentions_take_the_padded_pass(monkeypatch) -> None:
    """A model on transformers' own attention would let packed rows attend to each other."""
    monkeypatch.setattr(shared_prefix, "MIN_SHARED_TOKENS", 4)
    model = tiny_llama()  # sdpa, not sdpa_gqa
    assert not logprobs._packs(model)
    ids, attn, positions = _rows([17, 12, 21])
    monkeypatch.setattr(shared_prefix, "pack", lambda *a: pytest.fail("packed on another attention"))
    token_logprobs_and_stats(model, ids, attn, positions=positions, entropy=False)
