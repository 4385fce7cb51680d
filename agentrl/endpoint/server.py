"""The policy endpoint: an OpenAI-compatible HTTP server on 127.0.0.1 that samples from agentrl's
own inference engine and records every completion's tokens (issue 54).

    endpoint = PolicyEndpoint(engine, tokenizer, model_name="policy", max_context_tokens=4096)
    await endpoint.start()                        # 127.0.0.1, a free port
    episode = endpoint.open_episode(seed=7)       # its own key and base URL
    client = openai.AsyncOpenAI(base_url=episode.base_url, api_key=episode.key)
    ...                                           # the program calls the model
    episode.close(); episode.samples              # prompt ids, sampled ids, log-probs, version
    await endpoint.stop()

Routes: `/v1/chat/completions` (messages, tools, tool_choice, temperature, top_p, max_tokens,
stop, n, logprobs, seed, stream), `/v1/completions`, `/v1/models`; each also under
`/episodes/KEY/v1/...`. A request names its episode by its API key (`Authorization: Bearer KEY`)
or its base URL; with `require_key` (training) a request naming no open episode is refused (401).
A training endpoint (`pin_sampling`) samples at the run's temperature and top-p whatever the
request says (the learner's log-probs assume them) and seeds each request from the episode's
seed, so a group's samples differ even if the program sends a fixed seed.

FastAPI + uvicorn because they are the standard, maintained async Python HTTP stack: uvicorn serves
on the asyncio loop the rollout engine already runs (a request awaits `engine.generate` directly,
no thread hop), its sockets are ours to bind (loopback, port 0) and close, and FastAPI gives
routing and streaming responses. vLLM's OpenAI server was not an option: it serves only vLLM, and
agentrl needs the hf engine, per-episode attribution and the token records.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from agentrl.endpoint.conversation import Completion, Conversation, RequestError, tools_from_specs
from agentrl.endpoint.requests import Sampling, parse_sampling, tool_choice
from agentrl.inference.base import InferenceEngine, SamplingParams
from agentrl.parsing import get_parser
from agentrl.rollout.state import step_seed
from agentrl.rollout.stepwise import Sample
from agentrl.rollout.tokens import ChatTokens
from agentrl.types import Message

HOST = "127.0.0.1"  # loopback only: the endpoint serves this machine's agent programs


@dataclass
class Episode:
    """One agent episode's view of the endpoint: its key, base URL and recorded samples."""

    key: str
    base_url: str
    conversation: Conversation
    seed: int | None = None
    max_requests: int | None = None
    on_sample: Callable[[Sample], Any] | None = None
    samples: list[Sample] = field(default_factory=list)
    requests: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # why requests were refused → how many
    context: list[Message] = field(default_factory=list)  # the latest request's messages, as rendered
    closed: bool = False
    _open: set[asyncio.Task[Any]] = field(default_factory=set)
    _registry: dict[str, Episode] | None = None

    def refuse(self, error: RequestError) -> RequestError:
        code = error.code or "invalid_request"
        self.refused[code] = self.refused.get(code, 0) + 1
        return error

    def close(self) -> None:
        """No more requests; those still generating are aborted (their engine rows cancelled)."""
        self.closed = True
        if self._registry is not None:
            self._registry.pop(self.key, None)
        for task in list(self._open):
            task.cancel()


class _LoopbackServer(uvicorn.Server):
    """uvicorn without its signal handlers: Ctrl-C belongs to the run, which stops the endpoint."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass

    @contextlib.contextmanager
    def capture_signals(self) -> Any:  # uvicorn >= 0.29
        yield


class PolicyEndpoint:
    """An OpenAI-compatible server for `engine` (see the module docstring)."""

    def __init__(self, engine: InferenceEngine, tokenizer: Any, *, model_name: str = "policy",
                 max_context_tokens: int = 4096, sampling: SamplingParams | None = None,
                 eos_token_ids: list[int] | None = None, require_key: bool = True,
                 pin_sampling: bool = False, port: int = 0, compare_renderings: bool = True) -> None:
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.max_context_tokens = max_context_tokens
        self.sampling = sampling or SamplingParams()
        eos = list(eos_token_ids or [])
        if not eos:  # the template's EOS first, as the rollout engine orders them
            eos = [tokenizer.eos_token_id, *sorted(set(getattr(engine, "eos_ids", ())) - {tokenizer.eos_token_id})]
        self.chat = ChatTokens(tokenizer, eos)
        self.require_key, self.pin_sampling, self.port = require_key, pin_sampling, port
        self.compare_renderings = compare_renderings  # False: the template passed verify_append_only
        self.episodes: dict[str, Episode] = {}
        self._server: _LoopbackServer | None = None
        self._task: asyncio.Task[Any] | None = None
        self.app = self._app()

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = _LoopbackServer(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():  # it failed to start: raise its error
                self._task.result()
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Abort open requests, close every episode and stop listening."""
        for episode in list(self.episodes.values()):
            episode.close()
        server, task, self._server, self._task = self._server, self._task, None, None
        if server is not None and task is not None:
            server.should_exit = True
            await asyncio.gather(task, return_exceptions=True)

    async def __aenter__(self) -> PolicyEndpoint:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def open_episode(self, *, seed: int | None = None, parser: str = "hermes", max_requests: int | None = None,
                     on_sample: Callable[[Sample], Any] | None = None) -> Episode:
        key = f"ep-{secrets.token_urlsafe(18)}"
        episode = Episode(key, f"http://{HOST}:{self.port}/episodes/{key}/v1",
                          Conversation(self.chat, get_parser(parser), self.compare_renderings), seed=seed,
                          max_requests=max_requests,
                          on_sample=on_sample, _registry=self.episodes)
        self.episodes[key] = episode
        return episode

    # -- requests -------------------------------------------------------------------------------

    def _episode(self, request: Request) -> Episode | None:
        key = request.path_params.get("key")
        auth = request.headers.get("authorization", "")
        if key is None and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        episode = self.episodes.get(key or "")
        if episode is None and self.require_key:
            raise RequestError("this request names no open agentrl episode: use the base URL and API key of "
                               "the client agentrl handed to the program (AgentEnv.run's `client`)",
                               code="invalid_api_key", status=401, kind="authentication_error")
        return episode

    def _params(self, episode: Episode | None, asked: Sampling, prompt_len: int, index: int) -> SamplingParams:
        room = self.max_context_tokens - prompt_len
        if room < 1:
            raise RequestError(f"the prompt has {prompt_len} tokens; the context limit is {self.max_context_tokens}",
                               param="messages", code="context_length_exceeded")
        limit = self.sampling.max_tokens if self.pin_sampling else (asked.max_tokens or self.sampling.max_tokens)
        if asked.max_tokens is not None:
            limit = min(limit, asked.max_tokens)
        if episode is not None:  # the rollout engine's seeds: a pure function of episode seed and step
            seed = step_seed(episode.seed, len(episode.samples) + index)
        else:
            seed = asked.seed + index if asked.seed is not None else self.sampling.seed
        params = replace(self.sampling, max_tokens=min(limit, room), stop=asked.stop, seed=seed)
        if not self.pin_sampling:
            params = replace(params, temperature=self.sampling.temperature if asked.temperature is None
                             else asked.temperature, top_p=self.sampling.top_p if asked.top_p is None else asked.top_p)
        return params

    async def _sample(self, episode: Episode | None, prompt_ids: list[int], asked: Sampling) -> list[Sample]:
        """`asked.n` samples of `prompt_ids`, each tagged with the weight version that made it."""
        if episode is not None:
            if episode.closed:
                raise RequestError("the episode is over", code="episode_closed", status=409)
            if episode.max_requests is not None and episode.requests >= episode.max_requests:
                raise episode.refuse(RequestError(
                    f"the episode's budget of {episode.max_requests} model requests is spent",
                    code="request_budget_exhausted", status=429, kind="rate_limit_error"))
            episode.requests += 1
        try:
            params = [self._params(episode, asked, len(prompt_ids), i) for i in range(asked.n)]
        except RequestError as e:
            if episode is not None:
                episode.refuse(e)
            raise
        t0 = time.perf_counter()
        runs = [asyncio.ensure_future(self.engine.generate(list(prompt_ids), p)) for p in params]
        if episode is not None:
            episode._open.update(runs)
        try:
            outs = await asyncio.gather(*runs)
        except asyncio.CancelledError:
            for run in runs:
                run.cancel()
            if episode is not None and episode.closed:
                raise RequestError("the episode ended while this request ran (aborted)", code="aborted",
                                   status=409) from None
            raise
        finally:
            if episode is not None:
                episode._open.difference_update(runs)
        wall = time.perf_counter() - t0
        opening = episode.conversation.opening if episode is not None and not episode.samples else None
        samples = [Sample(list(prompt_ids), list(o.token_ids), list(o.logprobs), o.version,
                          text=self.chat.action_text(o.token_ids), finish_reason=o.finish_reason,
                          generate_seconds=wall / len(outs), prompt_len=opening) for o in outs]
        if any(o.finish_reason == "abort" for o in outs):
            raise RequestError("the inference engine aborted the generation", code="aborted", status=503,
                               kind="server_error")
        return samples

    def _keep(self, episode: Episode | None, samples: list[Sample]) -> None:
        if episode is None:
            return
        for sample in samples:
            episode.samples.append(sample)
            if episode.on_sample is not None:
                episode.on_sample(sample)

    async def chat_completions(self, request: Request) -> Response:
        episode = self._episode(request)
        body = await _json(request)
        asked = parse_sampling(body, chat=True)
        conversation = episode.conversation if episode is not None else Conversation(self.chat, get_parser("hermes"))
        tools = tools_from_specs(body.get("tools"))
        choice = tool_choice(body)
        context = conversation.messages(body.get("messages"), tools)
        kwargs = conversation.template_kwargs(tools)
        prompt_ids = conversation.prompt_ids(context, kwargs)
        if episode is not None:
            episode.context = context
        samples = await self._sample(episode, prompt_ids, asked)
        self._keep(episode, samples)
        completions = [conversation.record(context, kwargs, s, parse_tools=bool(tools) and choice != "none")
                       for s in samples]
        reply = _ChatReply(self, samples, completions, asked)
        return StreamingResponse(reply.stream(), media_type="text/event-stream") if asked.stream \
            else JSONResponse(reply.body())

    async def completions(self, request: Request) -> Response:
        episode = self._episode(request)
        body = await _json(request)
        asked = parse_sampling(body, chat=False)
        if asked.stream:
            raise RequestError("'stream' is supported on /v1/chat/completions only", param="stream")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            prompt_ids = self.chat.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise RequestError("'prompt' must be a non-empty string or a list of token ids (one prompt)",
                               param="prompt")
        if episode is not None:
            episode.context = [Message(role="user", content=self.chat.decode(prompt_ids))]
        samples = await self._sample(episode, prompt_ids, asked)
        self._keep(episode, samples)
        choices = []
        for i, s in enumerate(samples):
            choice: dict[str, Any] = {"index": i, "text": self.chat.decode(s.completion_ids),
                                      "finish_reason": s.finish_reason, "logprobs": None}
            if asked.logprobs:
                tokens = [self.chat.decode([t]) for t in s.completion_ids]
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(s.logprobs), "top_logprobs": None,
                                      "text_offset": _offsets(tokens)}
            choices.append(choice)
        return JSONResponse({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                             "created": int(time.time()), "model": self.model_name, "choices": choices,
                             "usage": _usage(samples)})

    # -- the app --------------------------------------------------------------------------------

    def _app(self) -> FastAPI:
        app = FastAPI(title="agentrl policy endpoint", docs_url=None, redoc_url=None, openapi_url=None)

        async def models(request: Request) -> Response:
            self._episode(request)
            return JSONResponse({"object": "list", "data": [
                {"id": self.model_name, "object": "model", "created": 0, "owned_by": "agentrl"}]})

        for prefix in ("/v1", "/episodes/{key}/v1"):
            app.add_api_route(f"{prefix}/chat/completions", self.chat_completions, methods=["POST"])
            app.add_api_route(f"{prefix}/completions", self.completions, methods=["POST"])
            app.add_api_route(f"{prefix}/models", models, methods=["GET"])

        @app.exception_handler(RequestError)
        async def request_error(_: Request, e: RequestError) -> Response:
            return JSONResponse(e.body(), status_code=e.status)

        @app.exception_handler(HTTPException)
        async def http_error(_: Request, e: HTTPException) -> Response:
            return JSONResponse(RequestError(str(e.detail), status=e.status_code).body(), status_code=e.status_code)

        return app


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from None


def _usage(samples: list[Sample]) -> dict[str, int]:
    prompt = len(samples[0].prompt_ids) if samples else 0
    completion = sum(len(s.completion_ids) for s in samples)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _offsets(tokens: list[str]) -> list[int]:
    out, at = [], 0
    for t in tokens:
        out.append(at)
        at += len(t)
    return out


class _ChatReply:
    """One chat completion as a JSON body or as server-sent events."""

    def __init__(self, endpoint: PolicyEndpoint, samples: list[Sample], completions: list[Completion],
                 asked: Sampling) -> None:
        self.endpoint, self.samples, self.completions, self.asked = endpoint, samples, completions, asked
        self.id, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def _finish(self, sample: Sample, completion: Completion) -> str:
        return "tool_calls" if completion.tool_calls else ("length" if sample.finish_reason == "length" else "stop")

    def _logprobs(self, sample: Sample) -> dict[str, Any] | None:
        if not self.asked.logprobs:
            return None
        chat = self.endpoint.chat
        tokens = [chat.decode([t]) for t in sample.completion_ids]
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                            for t, lp in zip(tokens, sample.logprobs)]}

    def _message(self, completion: Completion) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": completion.content}
        if completion.tool_calls:
            message["tool_calls"] = completion.tool_calls
        return message

    def body(self) -> dict[str, Any]:
        choices = [{"index": i, "message": self._message(c), "finish_reason": self._finish(s, c),
                    "logprobs": self._logprobs(s)}
                   for i, (s, c) in enumerate(zip(self.samples, self.completions))]
        return {"id": self.id, "object": "chat.completion", "created": self.created,
                "model": self.endpoint.model_name, "choices": choices, "usage": _usage(self.samples)}

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.endpoint.model_name, "choices": choices, **extra}
        return f"data: {json.dumps(chunk)}\n\n"

    async def stream(self) -> AsyncIterator[str]:
        """The whole completion in a few chunks (role and content, tool calls, finish): the
        engine returns a completion at once, so there is nothing to send token by token."""
        for i, (s, c) in enumerate(zip(self.samples, self.completions)):
            delta: dict[str, Any] = {"role": "assistant", "content": c.content}
            yield self._chunk([{"index": i, "delta": delta, "logprobs": self._logprobs(s), "finish_reason": None}])
            if c.tool_calls:
                calls = [{"index": j, **call} for j, call in enumerate(c.tool_calls)]
                yield self._chunk([{"index": i, "delta": {"tool_calls": calls}, "finish_reason": None}])
            yield self._chunk([{"index": i, "delta": {}, "finish_reason": self._finish(s, c)}])
        if self.asked.include_usage:
            yield self._chunk([], usage=_usage(self.samples))
        yield "data: [DONE]\n\n"
