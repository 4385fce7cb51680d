"""A tied LM head that an inference engine casts once, not on every forward.

Under bf16 autocast the hf engine stores the linear weights in bf16 (`models.cast_for_autocast`),
but a head tied to the input embedding must stay fp32 for the embedding lookup, so autocast
casts it again on every forward: for SmolLM2-135M a 113 MB read and a 57 MB write per decode
step, 4-5 ms of an 80-88 ms step of 10 rows over 300 cached tokens (5%, one thread, CPU time,
best of 6 alternations; docs/benchmarks.md). The engine keeps the cast instead (57 MB more while
it holds weights) and redoes it when the weight changes. It is the rounding autocast applies, so
the logits are bit-equal.
"""

from __future__ import annotations

import torch


class CastOnceHead(torch.nn.Linear):
    """An `nn.Linear` that keeps its weight's autocast cast between forwards, redone when the
    weight changes: a new tensor (`load_weights`) or an in-place write (the learner's optimizer
    step on weights an engine shares; the tensor's version counter). Under autograd with a
    trainable weight it is a plain `nn.Linear`: a kept cast carries no gradient."""

    _cast: torch.Tensor | None = None
    _cast_key: tuple[int, int, torch.dtype] | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kind = hidden.device.type
        if not torch.is_autocast_enabled(kind) or (torch.is_grad_enabled() and self.weight.requires_grad):
            return super().forward(hidden)
        low = torch.get_autocast_dtype(kind)
        key = (self.weight.data_ptr(), self.weight._version, low)
        if self._cast_key != key:
            self.drop_cast()  # free the stale cast before making the new one
            self._cast = self.weight.detach().to(low)
            self._cast_key = key
        bias = None if self.bias is None else self.bias.to(low)
        with torch.autocast(kind, enabled=False):
            # As one 2-d product: torch's matmul turns a [1, 1, d] input (one row, its last
            # position: a prefill's `logits_to_keep=1`) into a bmm against the weight expanded and
            # copied whole, ~200 ms for SmolLM2's 49152 x 576 head (stop 38, torch 2.13).
            flat = hidden.to(low).reshape(-1, hidden.shape[-1])
            return torch.nn.functional.linear(flat, self._cast, bias).view(*hidden.shape[:-1], -1)

    def drop_cast(self) -> None:
        """Forget the cast (a released or swapped weight may reuse the old address)."""
        self._cast = self._cast_key = None

    def cast_bytes(self) -> int:
        return 0 if self._cast is None else self._cast.numel() * self._cast.element_size()


def cast_tied_head_once(model: torch.nn.Module) -> CastOnceHead | None:
    """Make `model`'s LM head a `CastOnceHead` when it is an `nn.Linear` tied to the input
    embedding (the parameters stay the same objects, so the tie and the state dict's names are
    kept); returns it, or None where the head is untied (autocast casts a bf16-stored weight for
    free) or of another kind."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, CastOnceHead):
        return head
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if type(head) is not torch.nn.Linear or embedding is None or head.weight is not embedding.weight:
        return None
    head.__class__ = CastOnceHead
    return head
