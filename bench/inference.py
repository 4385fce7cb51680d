"""Model load and hf-engine throughput on the embedded model; prints one JSON line.

    python bench/inference.py [--convert] [--tokens 64] [--concurrency 8] [--decode-rows 11 --decode-context 2000]

Figures: `convert_s` (GGUF → HF folder into a fresh temp cache, only with --convert),
`cache_hit_resolve_s` (no conversion), `cache_hit_load_s` (resolve + load model + tokenizer), `single_tok_s` and
`concurrent_tok_s` (generated tokens per second for one request and for N concurrent ones),
`concurrent_over_single`, and the engine's mean batch size during the concurrent run.
`decode_step_cpu_s` (with `--decode-rows`): the CPU seconds of one batched decode step over a
left-padded cache of `--decode-context` tokens per row, one thread, for transformers' defaults
(`sdpa`, which copies the key/value heads per query head under a mask, and `DynamicCache`, which
concatenates the whole cache every step), agentrl's `sdpa_gqa` (agentrl/attention.py) on that
cache, and `sdpa_gqa` on the in-place cache the hf engine uses (agentrl/inference/cpu/kv_cache.py);
and the engine in bf16 (`engine.dtype: auto` under a bf16 trainer: linear weights and cache in bf16,
autocast, and the decode attention `half_precision_flash()` picks: torch's flash kernel with AMX,
else the grouped one); interleaved in one process, CPU time rather than wall time so a shared
machine's load does not tilt the ratios `decode_step_default_over_engine` and
`decode_step_fp32_over_bf16_engine`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.inference.base import SamplingParams
from agentrl.inference.cpu.packed_linear import keep_linear_weights
from agentrl.inference.cpu.threads import torch_threads
from agentrl.inference.hf import HFEngine
from agentrl.models import cast_for_autocast, load_model, load_tokenizer, resolve_model
from bench._common import emit, machine_info


async def throughput(path: str, tokens: int, concurrency: int) -> dict[str, float]:
    engine = HFEngine(path, max_batch_size=max(16, concurrency), seed=0)
    tok = engine.tokenizer
    prompt = list(tok.apply_chat_template([{"role": "user", "content": "Tell me a long story about a dragon."}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False))
    await engine.generate(prompt, SamplingParams(max_tokens=4))  # warm-up
    sp = SamplingParams(temperature=1.0, max_tokens=tokens, seed=0)
    start = time.perf_counter()
    one = await engine.generate(prompt, sp)
    single = len(one.token_ids) / (time.perf_counter() - start)
    steps0, sum0 = engine.metrics["steps"], engine.metrics["batch_size_sum"]
    start = time.perf_counter()
    outs = await asyncio.gather(*[engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=tokens, seed=i))
                                  for i in range(concurrency)])
    concurrent = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)
    mean_batch = (engine.metrics["batch_size_sum"] - sum0) / max(1, engine.metrics["steps"] - steps0)
    await engine.close()
    return {"single_tok_s": round(single, 2), "concurrent_tok_s": round(concurrent, 2),
            "concurrent_over_single": round(concurrent / single, 2), "mean_batch_size": round(mean_batch, 2),
            "concurrency": concurrency, "max_tokens": tokens}


def decode_step(path: str, rows: int, context: int, rounds: int = 2, steps: int = 4) -> dict[str, Any]:
    """CPU seconds per decode step, per (attention, cache) variant, best of `rounds`; and the
    largest logit difference from transformers' defaults."""
    from transformers import DynamicCache

    from agentrl.inference.cpu.kv_cache import growing_cache

    models = {impl: load_model(path, attn_implementation=impl) for impl in ("sdpa", "sdpa_gqa")}
    for name, pack in (("bf16", False), ("bf16_packed", True)):  # the engine under a bf16 trainer (engine.dtype:
        models[name] = load_model(path)  # auto on AVX512-BF16/AMX), with plain and oneDNN-packed linear weights
        cast_for_autocast(models[name], "bfloat16")
        keep_linear_weights(models[name], pack=pack)
    variants = {"sdpa": ("sdpa", DynamicCache), "sdpa_gqa": ("sdpa_gqa", DynamicCache),
                "sdpa_gqa+in_place_cache": ("sdpa_gqa", growing_cache),
                "bf16+sdpa_gqa+in_place_cache": ("bf16", growing_cache),
                "bf16_packed+sdpa_gqa+in_place_cache": ("bf16_packed", growing_cache)}
    config = models["sdpa"].config
    kv_heads, head_dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    best: dict[str, float] = {}
    logits: dict[str, torch.Tensor] = {}
    with torch_threads(1):  # as the engine on a 2-core machine (HFEngine.own_threads)
        for _ in range(rounds):
            for name, (impl, make_cache) in variants.items():
                torch.manual_seed(0)
                cache = make_cache(config=config)
                precision = torch.autocast("cpu", dtype=torch.bfloat16, enabled=impl.startswith("bf16"))
                with precision:  # a bf16 engine's cache holds bf16 keys and values
                    for layer in cache.layers:
                        layer.update(torch.randn(rows, kv_heads, context, head_dim),
                                     torch.randn(rows, kv_heads, context, head_dim))
                mask = torch.ones(rows, context, dtype=torch.long)
                mask[:, : context // 10] = 0  # left padding, as rows of different lengths have
                ids = torch.randint(100, 1000, (rows, 1))
                start = time.process_time()
                with torch.no_grad(), precision:
                    for s in range(steps):
                        mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long)], 1)
                        position = torch.full((rows, 1), context - context // 10 + s)
                        out = models[impl](input_ids=ids, attention_mask=mask, position_ids=position,
                                           past_key_values=cache, use_cache=True)
                best[name] = min(best.get(name, float("inf")), (time.process_time() - start) / steps)
                logits[name] = out.logits[:, -1]
    engine = "sdpa_gqa+in_place_cache"
    return {"decode_rows": rows, "decode_context": context,
            "decode_step_cpu_s": {k: round(v, 4) for k, v in best.items()},
            "decode_step_default_over_engine": round(best["sdpa"] / best[engine], 2),
            "decode_step_fp32_over_bf16_engine": round(best[engine] / best["bf16+" + engine], 2),
            "decode_step_plain_over_packed_bf16": round(best["bf16+" + engine] / best["bf16_packed+" + engine], 2),
            "decode_packed_logits_bit_equal": bool(torch.equal(logits["bf16+" + engine], logits["bf16_packed+" + engine])),
            "decode_logits_max_abs_diff": max(float((logits["sdpa"] - logits[k]).abs().max()) for k in variants
                                              if not k.startswith("bf16"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--convert", action="store_true", help="also time a conversion into a fresh cache")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--decode-rows", type=int, default=0, help="also time one decode step of this many rows")
    parser.add_argument("--decode-context", type=int, default=2000, help="cached tokens per row for --decode-rows")
    parser.add_argument("--decode-rounds", type=int, default=2,
                        help="alternations of the --decode-rows variants (best of them is reported)")
    args = parser.parse_args()
    figures: dict[str, float] = {}
    if args.convert:
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            resolve_model("smollm2-135m", cache)
            figures["convert_s"] = round(time.perf_counter() - start, 2)
    resolve_model("smollm2-135m")  # warm the default cache (converts if cold)
    start = time.perf_counter()
    path = resolve_model("smollm2-135m")
    figures["cache_hit_resolve_s"] = round(time.perf_counter() - start, 6)
    load_model(path)
    load_tokenizer(path)
    figures["cache_hit_load_s"] = round(time.perf_counter() - start, 3)  # includes first transformers imports
    figures.update(asyncio.run(throughput(str(path), args.tokens, args.concurrency)))
    if args.decode_rows:
        figures.update(decode_step(str(path), args.decode_rows, args.decode_context, args.decode_rounds))
    emit({**figures, "machine": machine_info()})  # load average at the end


if __name__ == "__main__":
    main()
