"""The inference-engine interface (architecture.md §7). Every engine — hf, vllm, openai — implements it."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings; the matched text is kept in the output
    stop_token_ids: tuple[int, ...] = ()  # in addition to the tokenizer's EOS
    seed: int | None = None


@dataclass
class GenerateOutput:
    """The policy's own tokens, the log-probs of the distribution they were sampled from
    (after temperature/top-p), why generation stopped, and the weight version that made them."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    version: int
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class InferenceEngine(Protocol):
    """What the rollout needs from an engine: the tokenizer of the served model (chat template,
    decoding), the token ids that end a turn, the weight version it generates with, and
    generation and in-place weight updates. `make_engine` is the only place engines are built."""

    version: int
    tokenizer: Any
    eos_ids: frozenset[int]

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput: ...

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None: ...

    async def close(self) -> None: ...


def all_cores(engine: Any) -> contextlib.AbstractContextManager[Any]:
    """The engine's `all_cores()` (decode on every core while nothing else computes; the hf
    engine has it), or a no-op for engines whose threads are not ours to set."""
    cores = getattr(engine, "all_cores", None)
    return cores() if cores is not None else contextlib.nullcontext()


def own_cores(engine: Any) -> contextlib.AbstractContextManager[Any]:
    """The engine's `own_cores()` (back on its own share of the cores while the block runs, inside
    `all_cores`: while a learner step runs beside it), or a no-op."""
    cores = getattr(engine, "own_cores", None)
    return cores() if cores is not None else contextlib.nullcontext()


def eos_token_ids(model_path: str | Path | None, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's EOS plus the model's generation_config.json `eos_token_id` (one or a list)."""
    ids: set[int] = set()
    sources: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    gen = Path(model_path) / "generation_config.json" if model_path is not None else None
    if gen is not None and gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    for source in sources:
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return frozenset(ids)
