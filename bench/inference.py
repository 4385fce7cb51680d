"""Model load and hf-engine throughput on the embedded model; prints one JSON line.

    python bench/inference.py [--convert] [--tokens 64] [--concurrency 8]

Figures: `convert_s` (GGUF → HF folder into a fresh temp cache, only with --convert),
`cache_hit_resolve_s` (no conversion), `cache_hit_load_s` (resolve + load model + tokenizer), `single_tok_s` and
`concurrent_tok_s` (generated tokens per second for one request and for N concurrent ones),
`concurrent_over_single`, and the engine's mean batch size during the concurrent run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.inference.base import SamplingParams
from agentrl.inference.hf import HFEngine
from agentrl.models import load_model, load_tokenizer, resolve_model
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--convert", action="store_true", help="also time a conversion into a fresh cache")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
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
    emit({**figures, "machine": machine_info()})  # load average at the end


if __name__ == "__main__":
    main()
