"""One learner pass (forward + backward) of a micro-batch whose rows share a prompt, padded against
packed (trainer/shared_prefix.py: the common prefix computed once); prints one JSON line.

    python bench/learner.py [--prefix 460] [--suffixes 410,380,430,400] [--repeats 3] [--dtype bfloat16]

The default shape is a `search` RL micro-batch: 4 rows of ~870 tokens whose first ~460 (system
prompt and tool schemas) are the same, scored on ~120 policy tokens each; the embedded model in
train mode with per-layer activation checkpointing, as the learner runs it. Token ids are random
(speed does not depend on them). The two passes alternate in one process; figures are the median
wall seconds (`padded_s`, `packed_s`), `packed_speedup`, the tokens each pass computes and the
largest log-prob difference between them (`logprob_max_abs_diff`, float rounding only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.models import load_model, resolve_model
from agentrl.trainer import logprobs
from agentrl.trainer.learner import enable_activation_checkpointing
from agentrl.trainer.logprobs import token_logprobs_and_stats
from bench._common import emit, machine_info


def search_like_rows(prefix: int, suffixes: list[int], vocab: int, seed: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, policy positions) of right-padded rows sharing `prefix` tokens; every
    row scores 30 of each 130 tokens after the prefix (the replies between tool outputs; a short
    row its second half)."""
    g = torch.Generator().manual_seed(seed)
    width = prefix + max(suffixes)
    ids = torch.zeros(len(suffixes), width, dtype=torch.long)
    attn, positions = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
    shared = torch.randint(0, vocab, (prefix,), generator=g)
    for i, n in enumerate(suffixes):
        ids[i, :prefix] = shared
        ids[i, prefix:prefix + n] = torch.randint(0, vocab, (n,), generator=g)
        attn[i, :prefix + n] = 1
        for start in range(prefix + min(30, n // 2), prefix + n, 130):
            positions[i, start:min(start + 30, prefix + n)] = True
    return ids, attn, positions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", type=int, default=460)
    ap.add_argument("--suffixes", default="410,380,430,400", help="each row's tokens after the prefix")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="autocast dtype")
    args = ap.parse_args()
    suffixes = [int(n) for n in args.suffixes.split(",")]

    model = load_model(resolve_model("smollm2-135m"))
    model.train()
    enable_activation_checkpointing(model)
    ids, attn, positions = search_like_rows(args.prefix, suffixes, model.config.vocab_size)
    packs = logprobs._packs

    def run(packed: bool) -> tuple[float, torch.Tensor]:
        logprobs._packs = packs if packed else (lambda m: False)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=getattr(torch, args.dtype), enabled=args.dtype != "float32"):
            stats = token_logprobs_and_stats(model, ids, attn, positions=positions, entropy=False, sum_pi_sq=False)
        (stats.logprobs * positions).sum().backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, stats.logprobs.detach()

    times: dict[bool, list[float]] = {False: [], True: []}
    out: dict[bool, torch.Tensor] = {}
    for _ in range(args.repeats):
        for packed in (False, True):
            seconds, out[packed] = run(packed)
            times[packed].append(seconds)
    logprobs._packs = packs
    padded_s, packed_s = statistics.median(times[False]), statistics.median(times[True])
    emit({"bench": "learner", "rows": len(suffixes), "prefix": args.prefix, "dtype": args.dtype,
          "tokens_padded": len(suffixes) * ids.shape[1], "tokens_packed": args.prefix + sum(suffixes),
          "policy_tokens": int(positions.sum()),
          "padded_s": round(padded_s, 3), "packed_s": round(packed_s, 3),
          "packed_speedup": round(padded_s / packed_s, 3),
          "logprob_max_abs_diff": float((out[False] - out[True]).abs().max()),
          "machine": machine_info()})


if __name__ == "__main__":
    main()
