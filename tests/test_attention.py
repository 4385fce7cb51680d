"""Grouped-query attention without key/value copies (agentrl/attention.py), on the embedded model
loaded through `load_model`, the factory the learner and the hf engine use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers.integrations.sdpa_attention as hf_sdpa

from agentrl.models import load_model, resolve_model


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    path = resolve_model("smollm2-135m")
    return {"default": load_model(path), "sdpa": load_model(path, attn_implementation="sdpa")}


def _padded_batch() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(100, 20000, (3, 40))
    mask = torch.ones(3, 40, dtype=torch.long)
    mask[1, :9] = 0  # left padding: the masked path, where transformers' sdpa repeats the kv heads
    mask[2, :23] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def test_load_model_uses_grouped_sdpa_and_never_repeats_kv_heads(models: dict[str, torch.nn.Module],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model = models["default"]
    assert model.config._attn_implementation == "sdpa_gqa"
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # the case that matters
    copies = []
    real = hf_sdpa.repeat_kv
    monkeypatch.setattr(hf_sdpa, "repeat_kv", lambda *a: copies.append(1) or real(*a))
    with torch.no_grad():
        ours = model(**_padded_batch()).logits
    assert copies == []
    with torch.no_grad():
        theirs = models["sdpa"](**_padded_batch()).logits
    assert len(copies) == 2 * model.config.num_hidden_layers  # keys and values, every layer
    assert torch.equal(ours, theirs)  # the same kernel on the same numbers


def test_grouped_sdpa_gradients_match_transformers_sdpa(models: dict[str, torch.nn.Module]) -> None:
    batch = _padded_batch()
    grads = []
    for name in ("default", "sdpa"):
        model = models[name]
        model.zero_grad(set_to_none=True)
        logits = model(**batch).logits
        (logits.float().log_softmax(-1)[..., 7] * batch["attention_mask"]).sum().backward()
        layer = model.model.layers[3].self_attn
        grads.append(torch.cat([layer.k_proj.weight.grad.flatten(), layer.q_proj.weight.grad.flatten()]))
    scale = grads[1].abs().max()
    assert (grads[0] - grads[1]).abs().max() <= 1e-4 * scale  # fp32 rounding: the group's sums in another order


def test_a_model_without_the_attention_interface_loads_with_its_own_default(tmp_path: Path) -> None:
    """A user's local model whose class cannot take a registered attention function (CodeGen) still
    loads through `load_model`, with the attention it defaults to."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("codegen", n_layer=1, n_embd=64, n_head=4, rotary_dim=8, vocab_size=64, n_positions=32)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    model = load_model(tmp_path)
    assert model.config._attn_implementation != "sdpa_gqa"
    with torch.no_grad():
        assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 64)
