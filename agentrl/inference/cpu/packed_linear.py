"""Linear layers that keep their inference weight ready between forwards: cast to the autocast
dtype and, on a CPU with oneDNN, packed into oneDNN's blocked layout.

Two costs of a bf16 decode step on CPU go away:
- *the cast*: a head tied to the fp32 input embedding stays fp32 for the lookup, so autocast casts
  it on every forward (SmolLM2-135M: a 113 MB read and a 57 MB write per step, ~5% of a step);
- *the reorder*: `F.linear` hands oneDNN a plain weight, which oneDNN reorders into its blocked
  layout on every call. At the few rows of a decode step that reorder is most of the call: a
  1536 x 576 bf16 product of 16 rows takes 165 us plain and 78 us on a weight packed once (one
  thread, 2-core Xeon with AMX, weight hot in cache; the LM head 8.1 ms -> 2.6 ms), and the
  outputs are bit-equal, as the same oneDNN kernel computes both. In the model, whose weights
  stream from memory, a decode step gains 1.00-1.12x (docs/benchmarks.md, stop 42).
The kept weight is redone when the weight changes: a new tensor (`load_weights`) or an in-place
write (a learner's optimizer step on weights an engine shares; the tensor's version counter).
Under autograd with a trainable weight the layer is a plain `nn.Linear`: a kept copy carries no
gradient. The cost is memory: one packed copy of each linear weight in the autocast dtype.
"""

from __future__ import annotations

import torch


def onednn_packing_available() -> bool:
    """Whether this torch can pack a linear weight for oneDNN (a CPU build with mkldnn; the op
    torch's own inductor uses for frozen CPU linears)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class PackedLinear(torch.nn.Linear):
    """An `nn.Linear` that keeps its weight, cast to the autocast dtype and packed for oneDNN
    where `pack` (a CPU weight, oneDNN present), between forwards under autocast."""

    pack: bool = False
    _kept: torch.Tensor | None = None
    _kept_key: tuple[int, int, torch.dtype] | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kind = hidden.device.type
        if not torch.is_autocast_enabled(kind) or (torch.is_grad_enabled() and self.weight.requires_grad):
            return super().forward(hidden)
        low = torch.get_autocast_dtype(kind)
        key = (self.weight.data_ptr(), self.weight._version, low)
        if self._kept_key != key:
            self.drop_kept()  # free the stale copy before making the new one
            weight = self.weight.detach().to(low)
            # batch-size hint 64: measured no slower than any other hint from 1 to 1 024 rows
            self._kept = torch.ops.mkldnn._reorder_linear_weight(weight, 64) if self.pack else weight
            self._kept_key = key
        bias = None if self.bias is None else self.bias.to(low)
        # As one 2-d product: torch's matmul turns a [1, 1, d] input (one row, its last position:
        # a prefill's `logits_to_keep=1`) into a bmm against the weight expanded and copied whole,
        # ~200 ms for SmolLM2's 49152 x 576 head (stop 38, torch 2.13). Autocast stays on: its
        # casts of these bf16 operands are no-ops, and leaving it costs ~3 us a call.
        flat = hidden.to(low).reshape(-1, hidden.shape[-1])
        if self.pack:
            out = torch.ops.mkldnn._linear_pointwise(flat, self._kept, bias, "none", [], "")
        else:
            out = torch.nn.functional.linear(flat, self._kept, bias)
        return out.view(*hidden.shape[:-1], -1)

    def drop_kept(self) -> None:
        """Forget the kept weight (a released or swapped weight may reuse the old address)."""
        self._kept = self._kept_key = None

    def kept_weight(self) -> torch.Tensor | None:
        """The kept weight when it is a copy of this layer's own (None when nothing is kept, or
        when it is the weight itself: a bf16-stored weight, cast for free and not packed)."""
        kept = self._kept
        if kept is None or (not kept.is_mkldnn and kept.data_ptr() == self.weight.data_ptr()):
            return None
        return kept

    def kept_bytes(self) -> int:
        kept = self.kept_weight()
        return 0 if kept is None else kept.numel() * kept.element_size()


def keep_linear_weights(model: torch.nn.Module, pack: bool) -> list[PackedLinear]:
    """Make the inference model's linear layers `PackedLinear`s, packed for oneDNN where `pack`
    and this torch can (a CPU model). With `pack` off only an LM head tied to the input embedding
    is converted: its cast is the one autocast would redo every forward; the others are stored in
    the autocast dtype already (`models.cast_for_autocast`). The parameters stay the same objects,
    so ties and the state dict's names are kept. Returns the converted layers."""
    pack = pack and onednn_packing_available()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = head is not None and embedding is not None and getattr(head, "weight", None) is embedding.weight
    out = []
    for module in model.modules():
        if type(module) not in (torch.nn.Linear, PackedLinear):
            continue
        on_cpu_pack = pack and module.weight.device.type == "cpu"
        if not (on_cpu_pack or (module is head and tied)):
            continue
        module.__class__ = PackedLinear
        module.pack = on_cpu_pack
        module.drop_kept()
        out.append(module)
    return out
