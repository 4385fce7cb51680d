"""token_logprobs against a direct per-sequence computation on a real (tiny) Llama."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.logprobs import (
    entropy_from_logits,
    sum_pi_sq_from_logits,
    token_logprobs,
    token_logprobs_and_stats,
)

from .conftest import VOCAB


def _reference(model, ids: list[int], temperature: float) -> list[float]:
    """Unbatched, one position at a time: log softmax(logits/T) of the next token."""
    x = torch.tensor([ids])
    logits = model(input_ids=x).logits[0].float() / temperature
    return [0.0] + [torch.log_softmax(logits[t - 1], -1)[ids[t]].item() for t in range(1, len(ids))]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_reference_with_right_padding(tiny_model, temperature):
    torch.manual_seed(1)
    a = torch.randint(0, VOCAB, (7,)).tolist()
    b = torch.randint(0, VOCAB, (4,)).tolist()
    ids = torch.zeros(2, 7, dtype=torch.long)
    mask = torch.zeros(2, 7, dtype=torch.long)
    ids[0], mask[0] = torch.tensor(a), 1
    ids[1, :4], mask[1, :4] = torch.tensor(b), 1
    with torch.no_grad():
        out = token_logprobs(tiny_model, ids, mask, temperature=temperature)
        ref_a, ref_b = _reference(tiny_model, a, temperature), _reference(tiny_model, b, temperature)
    assert out.dtype == torch.float32 and out.shape == (2, 7)
    torch.testing.assert_close(out[0], torch.tensor(ref_a), atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1, :4], torch.tensor(ref_b), atol=1e-5, rtol=0)
    assert out[:, 0].abs().max() == 0


def test_stats_share_forward_and_match_closed_forms(tiny_model):
    ids = torch.randint(0, VOCAB, (3, 5))
    stats = token_logprobs_and_stats(tiny_model, ids, temperature=0.9)
    torch.testing.assert_close(stats.logprobs, token_logprobs(tiny_model, ids, temperature=0.9))
    assert stats.logprobs.requires_grad and not stats.entropy.requires_grad
    logits = tiny_model(input_ids=ids).logits[:, :-1].float() / 0.9
    pi = torch.softmax(logits, -1)
    torch.testing.assert_close(stats.sum_pi_sq[:, 1:], (pi ** 2).sum(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(stats.entropy[:, 1:], -(pi * pi.log()).sum(-1), atol=1e-5, rtol=0)


def test_otb_proxy_example():
    """algorithms.md §6.5 test 1: z=[2,1,0], y=0."""
    z = torch.tensor([2.0, 1.0, 0.0], requires_grad=True)
    assert sum_pi_sq_from_logits(z).item() == pytest.approx(0.510543, abs=1e-5)
    pi = torch.softmax(z, -1)
    torch.testing.assert_close(pi, torch.tensor([0.665241, 0.244728, 0.090031]), atol=1e-5, rtol=0)
    (grad,) = torch.autograd.grad(torch.log_softmax(z, -1)[0], z)
    energy = (grad ** 2).sum().item()
    assert energy == pytest.approx(0.180061, abs=1e-5)
    assert energy == pytest.approx(1 - 2 * pi[0].item() + sum_pi_sq_from_logits(z).item(), abs=1e-6)


def test_entropy_uniform():
    assert entropy_from_logits(torch.zeros(8)).item() == pytest.approx(math.log(8), abs=1e-6)


def test_bad_input_is_named(tiny_model):
    with pytest.raises(ValueError, match="input_ids must be"):
        token_logprobs(tiny_model, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(tiny_model, torch.zeros(1, 5, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="attention_mask shape"):
        token_logprobs(tiny_model, torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 4))


def test_positions_path_matches_the_full_forward(tiny_model) -> None:
    """Running the LM head only on policy tokens gives the same log-probs, entropy and Σπ² there
    (and gradients flow the same way)."""
    import torch

    from agentrl.trainer.logprobs import token_logprobs_and_stats

    torch.manual_seed(0)
    ids = torch.randint(0, tiny_model.config.vocab_size, (2, 12))
    attn = torch.ones_like(ids)
    attn[1, 9:] = 0
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[0, 3:7] = True
    positions[1, 5:9] = True
    full = token_logprobs_and_stats(tiny_model, ids, attn, temperature=0.7)
    part = token_logprobs_and_stats(tiny_model, ids, attn, temperature=0.7, positions=positions)
    for a, b in [(full.logprobs, part.logprobs), (full.entropy, part.entropy), (full.sum_pi_sq, part.sum_pi_sq)]:
        assert torch.allclose(a[positions], b[positions], atol=1e-5)
        assert (b[~positions] == 0).all()
    (full.logprobs * positions).sum().backward()
    g_full = [p.grad.clone() for p in tiny_model.parameters()]
    tiny_model.zero_grad()
    part.logprobs.sum().backward()
    for a, p in zip(g_full, tiny_model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-5)


def test_chunked_head_matches_one_chunk_and_skips_unasked_stats(tiny_model, monkeypatch) -> None:
    """Chunks of 3 policy tokens (checkpointed) give the same log-probs, stats and gradients as one
    chunk; entropy / Σπ² are None when not asked for."""
    import torch

    from agentrl.trainer import logprobs as lp_mod

    torch.manual_seed(1)
    ids = torch.randint(0, tiny_model.config.vocab_size, (2, 16))
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[0, 2:13] = True
    positions[1, 6:15] = True

    def run(chunk: int, **flags):
        monkeypatch.setattr(lp_mod, "CHUNK_TOKENS", chunk)
        tiny_model.zero_grad()
        st = lp_mod.token_logprobs_and_stats(tiny_model, ids, None, 0.9, positions=positions, **flags)
        (st.logprobs * torch.linspace(0.1, 1.0, 16)).sum().backward()
        return st, [p.grad.clone() for p in tiny_model.parameters()]

    whole, g_whole = run(10_000)
    chunked, g_chunked = run(3)
    for a, b in [(whole.logprobs, chunked.logprobs), (whole.entropy, chunked.entropy),
                 (whole.sum_pi_sq, chunked.sum_pi_sq)]:
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    for a, b in zip(g_whole, g_chunked):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    lean, _ = run(3, entropy=False, sum_pi_sq=False)
    assert lean.entropy is None and lean.sum_pi_sq is None
    torch.testing.assert_close(lean.logprobs, whole.logprobs, atol=1e-6, rtol=0)


def test_right_padding_runs_causal_without_a_mask_and_other_masks_are_kept(tiny_model) -> None:
    """A right-padded batch reaches the model with no mask (torch's causal attention then skips the
    blocks above the diagonal); a mask with a hole or left padding still reaches it, and either way
    the log-probs of real tokens equal each sequence scored alone."""
    from agentrl.trainer.logprobs import causal_mask_only

    right = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    left = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    assert causal_mask_only(right) is None and causal_mask_only(None) is None
    assert causal_mask_only(left) is left
    torch.manual_seed(2)
    a, b = torch.randint(0, VOCAB, (4,)).tolist(), torch.randint(0, VOCAB, (2,)).tolist()
    ids = torch.tensor([a, [0, 0, *b]])
    with torch.no_grad():
        out = token_logprobs(tiny_model, ids, left)
    torch.testing.assert_close(out[0], torch.tensor(_reference(tiny_model, a, 1.0)), atol=1e-5, rtol=0)
    assert out[1, 3].item() == pytest.approx(_reference(tiny_model, b, 1.0)[1], abs=1e-5)
