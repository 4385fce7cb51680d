"""A KV cache that grows in place: transformers' `DynamicLayer` concatenates every decode step's
key/value onto the whole cache, copying each cached token of each layer on every step; here the
keys and values live in buffers with spare columns and a step writes its token into them.

For SmolLM2-135M at 11 rows over 2000 cached tokens a decode step took 0.54 CPU-s with the
concatenation and 0.42 in place (`bench/inference.py --decode-rows 11 --decode-context 2000`, one
thread, docs/benchmarks.md). The spare is `GrowingLayer.grow` tokens per row (64: about 3 MB per
row over the 30 layers in fp32), reallocated when used up, so a copy happens once per `grow` steps
instead of every step. The engine's batch edits keep it so: a finished row leaves in place, the
padding every row has is dropped as a view, and merged rows get spare columns (stop 43: copies of
the whole cache 13.3% -> 7.0% of the engine's forward time on the rollout benchmark).

`PrefixStore` keeps finished rows' KV for the next turn's prompt (`engine.prefix_cache_mb`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose `keys`/`values` are views of the filled part of larger buffers.
    Assigning `keys`/`values` (a merge, a trim of padding columns) adopts the tensor as the buffer;
    the next update that does not fit reallocates with `grow` spare columns."""

    grow = 64

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Each buffer with its own filled length: `keys` and `values` are assigned one after the
        # other (a trim reads `values` after `keys` was set), so neither may see the other's.
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._k_len = self._v_len = 0
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def keys(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[..., : self._k_len, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._k, self._k_len = value, _filled(value)

    @property  # type: ignore[override]
    def values(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[..., : self._v_len, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._v, self._v_len = value, _filled(value)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = self.values = None
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        kind = key_states.device.type
        if torch.is_autocast_enabled(kind):
            # Stored as attention will read them: autocast casts sdpa's inputs to its dtype (rotary
            # embeddings leave the keys fp32), so the cast here changes no result and halves the
            # cache and a step's reads of it.
            low = torch.get_autocast_dtype(kind)
            key_states, value_states = key_states.to(low), value_states.to(low)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._k, self._k_len = _append(self._k, self._k_len, key_states, self.grow)
        self._v, self._v_len = _append(self._v, self._v_len, value_states, self.grow)
        return self.keys, self.values  # type: ignore[return-value]

    def truncate(self, length: int) -> None:
        """Keep the first `length` columns; the buffer stays, so the next steps write in place."""
        self._k_len, self._v_len = min(self._k_len, length), min(self._v_len, length)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows `indices` (fewer rows than now), spare columns included (the next step still
        writes in place). In place: row i takes row indices[i] where the two differ, and the
        buffer becomes a view of its first rows, so only the moved rows are copied, not the
        whole cache. With the engine's plan (holes filled from the end) that is one row per
        finished request; a full index copy cost 5% of the engine's forward time (stop 43)."""
        if self._k is None or self._v is None or not self._k_len:
            return
        rows = len(indices)
        if rows > self._k.shape[0]:  # a selection that repeats rows: copy
            self._k, self._v = self._k[indices, ...], self._v[indices, ...]
            return
        moved = (indices != torch.arange(rows, device=indices.device)).nonzero().squeeze(-1)
        if len(moved):
            source = indices[moved]
            self._k[moved], self._v[moved] = self._k[source], self._v[source]  # sources gathered first
        self._k, self._v = self._k[:rows], self._v[:rows]

    def drop_leading(self, columns: int) -> None:
        """Forget the first `columns` columns (padding in every row): a view that keeps the spare
        columns after the filled ones, so the next step still writes in place."""
        if self._k is not None and self._v is not None:
            self._k, self._v = self._k[..., columns:, :], self._v[..., columns:, :]
            self._k_len, self._v_len = self._k_len - columns, self._v_len - columns

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
        """Take buffers whose first `filled` columns hold the cache and whose others are spare."""
        self._k, self._v, self._k_len, self._v_len = keys, values, filled, filled


def _filled(value: torch.Tensor | None) -> int:
    return 0 if value is None or value.dim() < 2 else value.shape[-2]


def _append(buffer: torch.Tensor | None, filled: int, new: torch.Tensor, grow: int) -> tuple[torch.Tensor, int]:
    """Write `new` after the first `filled` columns of `buffer`, reallocating with `grow` spare
    columns when it does not fit (or its rows changed); returns the buffer and its filled length."""
    end = filled + new.shape[-2]
    if buffer is None or end > buffer.shape[-2] or buffer.shape[:-2] != new.shape[:-2]:
        larger = new.new_empty((*new.shape[:-2], end + grow, new.shape[-1]))
        if buffer is not None and filled:
            larger[..., :filled, :] = buffer[..., :filled, :]
        buffer = larger
    buffer[..., filled:end, :] = new
    return buffer, end


def stack_rows(layers: list[DynamicLayer], width: int, out: DynamicLayer) -> None:
    """Stack the layers' rows into `out`, each left-padded to `width` columns (zero keys and
    values, which the batch's mask hides). A `GrowingLayer` gets buffers with `GrowingLayer.grow`
    spare columns: the next decode step writes in place instead of copying the merged cache once
    more."""
    first = layers[0].keys
    assert first is not None
    spare = GrowingLayer.grow if isinstance(out, GrowingLayer) else 0
    rows = sum(layer.keys.shape[0] for layer in layers)
    shape = (rows, *first.shape[1:-2], width + spare, first.shape[-1])
    buffers = []
    for name in ("keys", "values"):
        buffer, row = first.new_empty(shape), 0
        for layer in layers:
            part = getattr(layer, name)
            n, pad = part.shape[0], width - part.shape[-2]
            buffer[row:row + n, ..., :pad, :] = 0
            buffer[row:row + n, ..., pad:width, :] = part
            row += n
        buffers.append(buffer)
    if isinstance(out, GrowingLayer):
        out.adopt(buffers[0], buffers[1], width)
    else:
        out.keys, out.values = buffers


def drop_leading(cache: DynamicCache, columns: int) -> None:
    """Drop every layer's first `columns` columns (padding in every row; as views that keep a
    `GrowingLayer`'s spare columns)."""
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer):
            layer.drop_leading(columns)
        elif layer.keys is not None and layer.values is not None:
            layer.keys, layer.values = layer.keys[..., columns:, :], layer.values[..., columns:, :]


def truncate_cache(cache: DynamicCache, length: int) -> None:
    """Cut every layer of `cache` to its first `length` columns (in place for `GrowingLayer`s)."""
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer):
            layer.truncate(length)
        elif layer.keys is not None and layer.values is not None:
            layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]


def growing_cache(config: Any) -> DynamicCache:
    """A `DynamicCache` for `config`'s model whose layers grow in place (full-attention models)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (1, heads, tokens, dim)
Hit = tuple[int, KV | None, int | None]  # tokens reused, their KV, the store entry they came from


class PrefixStore:
    """Finished rows' KV keyed by their token ids, least recently used evicted past `budget`
    bytes. A lookup returns the longest common prefix with any entry (SUPO's rollback and a
    group's shared task prompt match part of an entry; a next turn matches all of one)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.bytes = 0
        self._entries: OrderedDict[int, tuple[list[int], KV, int]] = OrderedDict()
        self._next = 0

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def put(self, tokens: list[int], kv: KV) -> None:
        size = sum(k.nelement() * k.element_size() * 2 for k, _ in kv)
        if size > self.budget:
            return
        while self._entries and self.bytes + size > self.budget:
            self._remove(next(iter(self._entries)))
        self._entries[self._next] = (tokens, kv, size)
        self._next += 1
        self.bytes += size

    def lookup(self, prompt: list[int]) -> Hit:
        """The longest kept prefix of `prompt`, at most len(prompt) - 1 tokens (the last prompt
        token must be computed to get the next token's logits)."""
        best, best_key = 0, None
        for key, (tokens, _, _) in self._entries.items():
            n = common_prefix(tokens, prompt, len(prompt) - 1)
            if n > best:
                best, best_key = n, key
        if best_key is None:
            return 0, None, None
        self._entries.move_to_end(best_key)
        tokens, kv, _ = self._entries[best_key]
        if best < len(tokens):
            kv = [(k[..., :best, :], v[..., :best, :]) for k, v in kv]
        return best, kv, best_key

    def drop_consumed(self, hits: list[Hit]) -> None:
        """Forget entries some request extends whole: that request's own entry will supersede them."""
        for n, _, key in hits:
            if key in self._entries and n == len(self._entries[key][0]):
                self._remove(key)

    def _remove(self, key: int) -> None:
        self.bytes -= self._entries.pop(key)[2]


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of a and b, at most `limit` (slice compares run in C)."""
    n = min(len(a), len(b), limit)
    if n <= 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    lo, hi = 1, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
