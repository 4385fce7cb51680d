"""The `openai` inference engine: any OpenAI-compatible server over httpx (architecture.md §7).

It calls `/v1/completions` with the prompt as token ids and asks for the sampled tokens' ids and
log-probs (`logprobs=0`, vLLM's `return_token_ids` and `return_tokens_as_token_ids`), so the
rollout engine stays token-in/token-out: nothing is re-tokenized on either side. A server that
cannot return token ids is refused with a clear error rather than silently re-tokenized.

Weights belong to the server. `load_weights` works only with a vLLM server started with
`VLLM_SERVER_DEV_MODE=1` that shares a filesystem with this process (`weights_dir`): the state
dict is written there as safetensors, `POST /collective_rpc {"method": "reload_weights"}` loads it
in place and `POST /reset_prefix_cache` drops KV computed with the old weights. Without
`weights_dir` it raises NotImplementedError. Requests in flight finish first (as in the hf engine).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx

from agentrl.inference.base import GenerateOutput, SamplingParams, eos_token_ids
from agentrl.models import load_tokenizer


class OpenAIEngineError(RuntimeError):
    """The server answered with an error or without the token ids / log-probs we need."""


class OpenAIEngine:
    """InferenceEngine over an OpenAI-compatible `/v1/completions` endpoint."""

    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", timeout_s: float = 600.0,
                 weights_dir: str | os.PathLike[str] | None = None, max_connections: int = 256,
                 tokenizer_path: str | os.PathLike[str] | None = None) -> None:
        """`tokenizer_path`: a local copy of the served model's tokenizer (the rollout builds
        prompts and decodes with it; token ids never go through the server's tokenizer)."""
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        # Server-level endpoints (/collective_rpc, /health) live beside /v1, not under it.
        self.server_url = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        self.model = model
        self.version = 0
        self.tokenizer: Any = None
        self.eos_ids: frozenset[int] = frozenset()
        if tokenizer_path is not None:
            self.tokenizer = load_tokenizer(tokenizer_path)
            self.eos_ids = eos_token_ids(tokenizer_path, self.tokenizer)
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self._client = httpx.AsyncClient(headers={"Authorization": f"Bearer {api_key}"},
                                         timeout=httpx.Timeout(timeout_s, connect=10.0),
                                         limits=httpx.Limits(max_connections=max_connections))
        self._inflight = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._open = asyncio.Event()
        self._open.set()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        body = completion_request(self.model, prompt_ids, sampling)
        await self._open.wait()
        self._inflight += 1
        self._drained.clear()
        version, start = self.version, time.perf_counter()
        try:
            response = await self._client.post(f"{self.base_url}/completions", json=body)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._drained.set()
        if response.status_code != 200:
            raise OpenAIEngineError(f"POST {self.base_url}/completions → {response.status_code}: "
                                    f"{response.text[:500]}")
        token_ids, logprobs, finish_reason = parse_completion(response.json())
        return GenerateOutput(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason,
                              version=version, metrics={"seconds": time.perf_counter() - start,
                                                        "prompt_tokens": float(len(prompt_ids))})

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        if self.weights_dir is None:
            raise NotImplementedError(
                "the OpenAI-compatible server owns its weights; to push weights to a local vLLM server, "
                "start it with VLLM_SERVER_DEV_MODE=1 and pass weights_dir= (a folder both can read)")
        from safetensors.torch import save_file  # heavy lazy load: torch, only to push weights

        self._open.clear()
        folder = self.weights_dir / f"v{version}"
        try:
            await self._drained.wait()
            folder.mkdir(parents=True, exist_ok=True)
            # clone(): tied weights share storage, which safetensors refuses to save.
            tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
            await asyncio.to_thread(save_file, tensors, str(folder / "model.safetensors"))
            await self._post_server("/collective_rpc", {"method": "reload_weights",
                                                        "kwargs": {"weights_path": str(folder)}})
            await self._post_server("/reset_prefix_cache", None)
            self.version = version
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            self._open.set()

    async def _post_server(self, path: str, body: dict[str, Any] | None) -> None:
        response = await self._client.post(f"{self.server_url}{path}", json=body)
        if response.status_code != 200:
            raise OpenAIEngineError(f"POST {self.server_url}{path} → {response.status_code}: "
                                    f"{response.text[:500]} (is the server a vLLM one with VLLM_SERVER_DEV_MODE=1?)")

    async def close(self) -> None:
        await self._client.aclose()


def completion_request(model: str, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
    """The JSON body of a token-in/token-out completion request."""
    if not prompt_ids or not all(isinstance(t, int) and t >= 0 for t in prompt_ids):
        raise ValueError("prompt_ids must be a non-empty list of non-negative token ids")
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1 or sampling.max_tokens < 1:
        raise ValueError(f"bad sampling params {sampling}: need temperature >= 0, top_p in (0, 1], "
                         "max_tokens >= 1")
    body: dict[str, Any] = {
        "model": model, "prompt": list(prompt_ids), "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature, "top_p": sampling.top_p,
        "logprobs": 0,  # only the sampled token's log-prob
        "return_token_ids": True, "return_tokens_as_token_ids": True,
        "include_stop_str_in_output": True, "skip_special_tokens": False,
    }
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return body


def parse_completion(payload: dict[str, Any]) -> tuple[list[int], list[float], str]:
    """Token ids, their log-probs and the finish reason from a completion response."""
    try:
        choice = payload["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise OpenAIEngineError(f"completion response has no choices: {str(payload)[:300]}") from None
    lp = choice.get("logprobs") or {}
    logprobs = lp.get("token_logprobs")
    token_ids = choice.get("token_ids")
    if token_ids is None and lp.get("tokens"):  # servers that only know return_tokens_as_token_ids
        tokens = lp["tokens"]
        if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            raise OpenAIEngineError("the server returned token strings, not token ids; it must support "
                                    "return_token_ids or return_tokens_as_token_ids (vLLM does)")
        token_ids = [int(t.split(":", 1)[1]) for t in tokens]
    if token_ids is None or logprobs is None:
        raise OpenAIEngineError("the server returned no token ids or no log-probs; it must support "
                                "logprobs and return_token_ids (vLLM does)")
    if len(token_ids) != len(logprobs) or any(x is None for x in logprobs):
        raise OpenAIEngineError(f"{len(token_ids)} token ids but log-probs {logprobs[:5]}... "
                                f"({len(logprobs)} entries)")
    return [int(t) for t in token_ids], [float(x) for x in logprobs], choice.get("finish_reason") or "abort"
