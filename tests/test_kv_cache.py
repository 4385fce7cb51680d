"""The hf engine's in-place KV cache (agentrl/inference/kv_cache.py) against transformers'
DynamicCache on the embedded model: the same logits through prefill, decode steps, a row
dropped and a reallocation; decode steps write into the same buffer."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import DynamicCache

from agentrl.inference.cpu.kv_cache import GrowingLayer, growing_cache, stack_rows
from agentrl.models import load_model, resolve_model


def _decode(model: torch.nn.Module, cache: DynamicCache, steps: int) -> tuple[list[torch.Tensor], list[int]]:
    """Prefill 4 left-padded rows, then greedy decode; row 0 leaves after 15 steps (as a finished
    request does) and the columns left all padding are trimmed. Returns every step's logits and the first layer's key buffer address per step."""
    torch.manual_seed(0)
    ids = torch.randint(100, 20000, (4, 50))
    mask = torch.ones(4, 50, dtype=torch.long)
    mask[1, :10] = 0
    mask[2, :3] = 0
    mask[3, :5] = 0
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                past_key_values=cache, use_cache=True)
    logits, addresses = [out.logits[:, -1]], []
    positions = mask.sum(-1, keepdim=True)
    for step in range(steps):
        token = logits[-1].argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones(len(mask), 1, dtype=torch.long)], 1)
        out = model(input_ids=token, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        positions = positions + 1
        layer = cache.layers[0]
        addresses.append(layer._k.data_ptr() if isinstance(layer, GrowingLayer) else layer.keys.data_ptr())
        if step == 15:
            keep = torch.tensor([1, 2, 3])
            cache.batch_select_indices(keep)
            mask, positions, logits[-1] = mask[keep], positions[keep], logits[-1][keep]
            # the 3 columns that are now padding in every row are trimmed, as HFEngine._drop_finished does
            mask = mask[:, 3:]
            for layer in cache.layers:
                layer.keys = layer.keys[..., 3:, :]
                layer.values = layer.values[..., 3:, :]
    return logits, addresses


def test_in_place_cache_matches_dynamic_cache_and_writes_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GrowingLayer, "grow", 8)  # reallocations within a short test
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the engine on 2 cores; 2 threads spin-wait on a loaded machine
    try:
        model = load_model(resolve_model("smollm2-135m"))
        with torch.no_grad():
            reference, copied = _decode(model, DynamicCache(config=model.config), steps=40)
            ours, in_place = _decode(model, growing_cache(model.config), steps=40)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(reference, ours))  # bit-equal: the same numbers attended
    assert all(a != b for a, b in itertools.pairwise(copied))  # DynamicCache: a new tensor every step
    # ours: prefill leaves 50 tokens in a 58-column buffer; a new one when the 8 spare columns run out
    # (step 8), after the row drop and trim (the trimmed view is adopted as it is, so step 16
    # reallocates) and again when its spare runs out (steps 25, 34): 4 changes in 40 steps
    assert sum(a != b for a, b in itertools.pairwise(in_place)) == 4, in_place
    assert len(set(in_place[:8])) == 1
    layer = growing_cache(model.config).layers[0]
    keys = torch.zeros(2, 3, 5, 64)
    layer.update(keys, keys)
    assert layer.keys.shape == (2, 3, 5, 64) and layer._k.shape[-2] == 5 + GrowingLayer.grow


def test_the_engines_row_drop_trim_and_merge_keep_writing_in_place() -> None:
    """HFEngine's batch edits on GrowingLayers: a finished row's hole filled by the last row moves
    that row alone (a view of the same buffer, the other rows untouched); the all-padding leading
    columns are dropped as a view; two batches are stacked left-padded into buffers with spare
    columns. After each, the next step's keys go into the same buffer, and the contents equal
    what copying would give."""
    keys = torch.arange(4 * 2 * 6 * 3, dtype=torch.float32).view(4, 2, 6, 3)
    layer = GrowingLayer()
    layer.update(keys, -keys)
    buffer = layer._k  # its spare columns are uninitialised (compare only the filled ones)
    layer.batch_select_indices(torch.tensor([0, 3, 2]))  # row 1 finished; row 3 fills its hole
    assert torch.equal(layer.keys, keys[[0, 3, 2]]) and torch.equal(layer.values, -keys[[0, 3, 2]])
    assert layer._k.data_ptr() == buffer.data_ptr()  # the same buffer: row 3 was moved into row 1's slot
    assert torch.equal(buffer[:, :, :6], keys[[0, 3, 2, 3]])  # rows 0 and 2 kept their place
    layer.drop_leading(2)
    assert torch.equal(layer.keys, keys[[0, 3, 2], :, 2:])
    step = torch.full((3, 2, 1, 3), 7.0)
    before = layer._k.data_ptr()
    layer.update(step, -step)
    assert layer._k.data_ptr() == before and torch.equal(layer.keys[:, :, -1:], step)  # in the spare columns
    other = GrowingLayer()
    other.update(torch.ones(2, 2, 3, 3), -torch.ones(2, 2, 3, 3))
    expected = torch.cat([layer.keys, torch.cat([torch.zeros(2, 2, 2, 3), other.keys], 2)])
    stack_rows([layer, other], 5, out=layer)
    assert torch.equal(layer.keys, expected) and torch.equal(layer.values[3:, :, :2], torch.zeros(2, 2, 2, 3))
    assert layer._k.shape[-2] == 5 + GrowingLayer.grow
    before = layer._k.data_ptr()
    layer.update(torch.ones(5, 2, 1, 3), torch.ones(5, 2, 1, 3))
    assert layer._k.data_ptr() == before and layer.keys.shape == (5, 2, 6, 3)
