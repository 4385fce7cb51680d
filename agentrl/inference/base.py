"""The inference-engine interface (design §7). Every engine — hf, vllm, openai — implements it."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    version: int

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput: ...

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None: ...

    async def close(self) -> None: ...
