"""The `hf` inference engine: transformers in-process, concurrent requests batched (architecture.md §7).

A background scheduler task owns one running batch. Each step it (1) advances every running
sequence by one token with the KV cache and (2) prefills the requests that arrived since the last
step (left-padded), then merges the new rows into the batch and drops the finished ones. Both
go through the model as one ragged forward pass (`fuse_passes`): all their tokens through the
linear layers at once, attention per rectangle against its own cache. So a request joins at the
next step boundary instead of waiting for the batch to drain, which is what trajectory-level
rollout needs. Forward passes run on the engine's own worker thread so the event loop keeps
serving envs and tools.

Prefix reuse: a multi-turn rollout's turn k+1 prompt starts with turn k's prompt and
completion (append-only token bookkeeping, architecture.md §6), so when a request finishes its row's KV
is kept in a prefix store (LRU under `prefix_cache_mb`) and a later prompt that starts with
those tokens prefills only the new ones. Rows of a prefill whose new-token counts differ a lot
go in separate forward passes instead of one padded one.

Prompt-lookup speculation (`speculative_tokens` > 0): an agent's turn repeats much of its context
(the tool-call format of earlier turns, fields it copies from a tool's output), so each decode
step proposes up to K tokens per row that follow the latest earlier occurrence of the row's last
n-gram (`cpu/speculation.py`), feeds them with the row's next token in one forward pass, and keeps the
longest run the model itself samples. Each position is sampled from the model's own processed
distribution with the row's generator, one draw per emitted token, and a draft is kept only while
it equals what was sampled: for a point-mass draft that is exactly speculative sampling's rule, so
the output distribution and the log-probs are those of plain decoding.

Weight updates (`load_weights`) follow Laminar (algorithms.md §1): admission pauses, the requests
in flight finish on the weights they started with, the weights are swapped on an empty engine,
then admission resumes. Every GenerateOutput therefore comes from exactly one weight version.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentrl.attention import RAGGED, SDPA_GQA, RaggedPart, causal_padding_mask
from agentrl.inference.base import GenerateOutput, SamplingParams
from agentrl.inference.cpu.kv_cache import (
    Hit,
    PrefixStore,
    drop_leading,
    growing_cache,
    stack_rows,
    truncate_cache,
)
from agentrl.inference.cpu.memory import bound_kernel_caches, trim_heap
from agentrl.inference.cpu.packed_linear import keep_linear_weights
from agentrl.inference.cpu.speculation import ForwardCost, draft_width, propose_continuation
from agentrl.inference.cpu.threads import release_idle_workers, torch_threads
from agentrl.inference.sampling import SAMPLERS, processed_logprobs, sample_tokens
from agentrl.models import cast_for_autocast, load_model, load_tokenizer, torch_dtype
from agentrl.phases import track

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[GenerateOutput]
    generator: torch.Generator
    stop_ids: frozenset[int]
    submitted: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    checked_chars: int = 0  # decoded text already searched for stop strings
    batch_size_sum: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix store
    drafted: int = 0  # prompt-lookup draft tokens fed for this request, and of them accepted
    accepted: int = 0

    def acceptance(self) -> float:
        """The chance a draft token is kept, estimated from this request's own drafts (Laplace's
        rule: 1/2 before any)."""
        return (self.accepted + 1) / (self.drafted + 2)


@dataclass
class _Batch:
    """Running sequences. `cache` and `mask` hold every token except each row's last sampled one
    (`next_ids`), which the next decode step feeds; `positions` is that token's position id."""

    rows: list[_Request]
    cache: DynamicCache
    mask: torch.Tensor  # (B, T) long, 0 on left padding
    next_ids: torch.Tensor  # (B,) long
    positions: torch.Tensor  # (B,) long


@dataclass
class _Pass:
    """The inputs of one rectangle of a step's forward: `ids` and `positions` (rows, width) fed
    over `cache`, `mask` (rows, cached + width) 0 on padding and on fed columns not to attend.
    `last_only`: a prefill needs each row's last logits only, a decode step every column's."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    cache: DynamicCache
    last_only: bool


class HFEngine:
    """InferenceEngine over a transformers causal LM with continuous batching."""

    shares_read_only_weights = True  # load_weights takes a relay snapshot's tensors as its own (no copy)

    def __init__(self, model_path: str | Path, dtype: str = "float32", max_batch_size: int = 16,
                 device: str = "cpu", num_threads: int | None = None, seed: int | None = None,
                 max_model_len: int | None = None, prefix_cache_mb: float = 1024,
                 attn_implementation: str | None = None, in_place_kv: bool = True,
                 autocast: str = "float32", trim_every: int = 512, speculative_tokens: int = 4,
                 prompt_lookup_min: int = 2, prompt_lookup_max: int = 4, sampler: str = "gumbel_max",
                 fuse_passes: bool = True, pack_weights: bool = True) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if speculative_tokens < 0:
            raise ValueError(f"speculative_tokens must be >= 0 (0 turns prompt-lookup speculation off), "
                             f"got {speculative_tokens}")
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {prompt_lookup_min} "
                             f"and {prompt_lookup_max}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 turns prefix reuse off), got {prefix_cache_mb}")
        if trim_every < 0:
            raise ValueError(f"trim_every must be >= 0 (0 never trims), got {trim_every}")
        # Half the cores by default (1 on a 2-core box): the event loop, tools and sandboxes need
        # the rest, and an oversubscribed OpenMP pool spin-waits — measured 10-20x slower decode
        # steps with 2 threads than with 1 on a loaded 2-core machine. Set per forward step on the
        # engine's own thread only (`_step`), so a learner in the same process keeps its pool.
        self.own_threads = num_threads or max(1, (os.cpu_count() or 2) // 2)
        self.num_threads = self.own_threads  # what the next step runs on (all_cores / own_cores set it)
        self._pool_threads = self.num_threads  # what the last step ran on
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self.model_path = Path(model_path)
        self.device = torch.device(device)
        if self.device.type == "cpu":
            bound_kernel_caches()  # before this process's first bf16 kernel (inference/cpu/memory.py)
        # attn_implementation / in_place_kv: None and True are the fast defaults (agentrl/attention.py,
        # kv_cache.py); "sdpa" and False give transformers' own, which the benchmarks compare against.
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        self.model = load_model(model_path, dtype=dtype, device=device, **extra)
        # autocast: the trainer's forward precision. Under bf16 the engine keeps the weights that
        # autocast casts (the linear layers) in bf16 and runs under the same autocast: a forward
        # computes what the trainer's computes, without re-casting the weights every step, and its
        # matmuls and KV cache run at bf16 speed and size (a decode step 1.3-1.5x less CPU, a prefill
        # ~2x, on an AVX512-BF16 CPU; `bench/inference.py`). Incremental decoding still rounds in
        # another order than the trainer's full forward: log-probs differ by bf16 noise (mean
        # 0.03, as an fp32 engine beside a bf16 trainer), which the trainer's ratios correct.
        self.autocast = autocast
        cast = cast_for_autocast(self.model, autocast) if autocast != "float32" else set()
        # Under autocast each linear layer keeps its weight cast and, on CPU with `pack_weights`,
        # packed for oneDNN, redone per weight version, not per step (packed_linear.py): a decode
        # step 1.0-1.12x faster, for one packed copy of the linear weights
        self._linears = keep_linear_weights(self.model, pack=pack_weights) if cast else []
        # what a relay should store each weight as for this engine to share it (laminar/loop.py)
        self.weight_dtypes: dict[str, str] = dict.fromkeys(sorted(cast), autocast)
        self._new_cache = growing_cache if in_place_kv else (lambda config: DynamicCache(config=config))
        # transformers 5.2x renamed forward's `past_key_values` to `cache` (the old name goes in 5.40)
        params = inspect.signature(type(self.model).forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.tokenizer = load_tokenizer(model_path)
        self.max_batch_size = max_batch_size
        self.speculative_tokens = speculative_tokens
        # one fit per thread count: a 1-thread step (a learner step beside it) and a 2-thread one
        # differ in both fixed and per-token cost, and one fit over both drifted to 33-77 tokens
        self.forward_costs: dict[int, ForwardCost] = {}
        self.sampler = sampler  # sampling.py: how a sampled row draws its token
        # a step's decode rows and new rows in one ragged forward (`_forward`); only agentrl's attention
        # reads a ragged pass's parts, so a model loaded with another runs a pass per rectangle
        self.fuse_passes = fuse_passes and getattr(self.model.config, "_attn_implementation", None) == SDPA_GQA
        self.prompt_lookup = (prompt_lookup_min, prompt_lookup_max)
        self.max_model_len = max_model_len or int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.vocab_size = int(self.model.config.vocab_size)
        self.version = 0
        layers = DynamicCache(config=self.model.config).layers
        if not all(type(layer) is DynamicLayer for layer in layers):
            # Joining requests mid-batch pads and stacks plain per-layer key/value tensors.
            raise NotImplementedError(f"HFEngine batches full-attention models only; {self.model_path} has "
                                      f"cache layers {sorted({type(x).__name__ for x in layers})}")
        self.eos_ids = self._eos_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self._rng = torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
        self._waiting: deque[_Request] = deque()
        self._batch: _Batch | None = None
        self._wake = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._paused = False
        self._swap_lock = asyncio.Lock()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._prefix = PrefixStore(int(prefix_cache_mb * 2**20))
        # Heap trims from the worker thread (`_trim_due`): every `trim_every` steps, and sooner
        # (after a quarter of that) once a prefill's transients or a finished row's KV were freed.
        self.trim_every = trim_every
        self._since_trim = 0
        self._borrowed: set[str] = set()  # parameters that are views of weights the engine does not own
        self._released: set[str] = set()  # parameters freed by `release_weights` until the next load
        self._shapes = {n: tuple(p.shape) for n, p in self.model.state_dict(keep_vars=True).items()}
        # prefill_tokens: prompt tokens computed; prefix_hit_tokens: prompt tokens whose KV was reused;
        # draft_tokens / accepted_tokens: prompt-lookup drafts fed / kept (their ratio is the acceptance);
        # prefill_forwards / prefill_s: the prefills' own forward passes and their share of forward_s;
        # fused_prefills: prompt groups fed in a pass with other rectangles instead (`_forward`).
        self.metrics: dict[str, float] = {"steps": 0, "prefills": 0, "tokens": 0, "max_batch_size": 0,
                                          "draft_tokens": 0, "accepted_tokens": 0, "prefill_forwards": 0,
                                          "prefill_s": 0.0, "fused_prefills": 0,
                                          "batch_size_sum": 0, "forward_s": 0.0, "prefill_tokens": 0,
                                          "prefill_padding": 0, "prefix_hit_tokens": 0, "prefix_cache_bytes": 0,
                                          "heap_trims": 0, "heap_trim_s": 0.0}
        track("engine_weights", self, lambda e: [*e.model.parameters(), *e._kept_weights()],
              views=True)  # bench/memory.py's phase marks
        track("engine_kv", self, lambda e: e._kv_tensors())

    def _eos_ids(self) -> frozenset[int]:
        ids = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        return frozenset(ids)

    # ------------------------------------------------------------------ public API

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        if self._closed:
            raise RuntimeError("HFEngine is closed")
        self._check(prompt_ids, sampling)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        gen = torch.Generator()
        gen.manual_seed(sampling.seed if sampling.seed is not None
                        else int(torch.randint(0, 2**62, (1,), generator=self._rng)))
        request = _Request(list(prompt_ids), sampling, asyncio.get_running_loop().create_future(), gen,
                           self.eos_ids | frozenset(sampling.stop_token_ids))
        self._waiting.append(request)
        self._wake.set()
        return await request.future

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Swap weights on an empty engine: new requests wait, running ones finish first. Weights
        marked read-only (a relay snapshot, `relay.ReadOnlyWeights`) are shared, not copied: the
        model's parameters become views of them (one copy of the rollout weights per process)."""
        await self._swap(state_dict, version, share=bool(getattr(state_dict, "read_only", False)))

    async def share_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """As `load_weights`, but the model takes the given tensors as its parameters where dtype
        and device match: no copy, no second set of weights in memory. The caller keeps them
        unchanged while the engine generates (the held-out evaluator passes the learner's own
        parameters, which do not move during an evaluation)."""
        await self._swap(state_dict, version, share=True)

    async def _swap(self, state_dict: dict[str, Any], version: int, share: bool) -> None:
        async with self._swap_lock:
            self._paused = True
            try:
                await self._empty.wait()
                await asyncio.get_running_loop().run_in_executor(self._executor, self._copy_weights, state_dict,
                                                                 share)
                self.version = version
            finally:
                self._paused = False
                self._wake.set()

    async def release_weights(self) -> int:
        """Free the weights this engine holds of its own (not views of another's memory): an
        evaluation engine idles between evaluations, and under bf16 it holds cast copies of the
        linear weights (a fifth of the model's fp32 bytes). The next `load_weights` or
        `share_weights` brings them back; generating before that fails. Returns the bytes freed."""
        async with self._swap_lock:
            await self._empty.wait()
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._release)

    def _release(self) -> int:
        freed = sum(linear.kept_bytes() for linear in self._linears)
        self._drop_kept_weights()
        self._prefix.clear()
        for name, param in self.model.named_parameters(remove_duplicate=False):
            if name in self._borrowed or name in self._released:
                continue
            freed += param.numel() * param.element_size() if param.numel() else 0
            param.data = param.data.new_empty(0)
            self._released.add(name)
        return freed

    @property
    def decoding(self) -> bool:
        """Whether the engine has rows running or requests waiting (read from any thread: a learner
        step beside it takes the cores back while this is False)."""
        return self._batch is not None or bool(self._waiting)

    def all_cores(self) -> contextlib.AbstractContextManager[None]:
        """Forward passes on every core while the block runs: for generation that runs alone (the
        held-out evaluations before, between and after the training stages), or beside a learner
        that steps now and then (`own_cores` around each step). Read at each step, so it applies
        from the next one. The calling thread (the event loop's, which loaded the models) gives its
        OpenMP workers back first: beside the engine's they would throttle both (cpu/threads.py)."""
        release_idle_workers()
        return self._threads(max(self.own_threads, os.cpu_count() or 1))

    def own_cores(self) -> contextlib.AbstractContextManager[None]:
        """Forward passes on the engine's own share of the cores (`own_threads`) while the block
        runs, also inside `all_cores`: while a learner step computes on the rest."""
        return self._threads(self.own_threads)

    @contextlib.contextmanager
    def _threads(self, threads: int) -> Iterator[None]:
        previous, self.num_threads = self.num_threads, threads
        try:
            yield
        finally:
            self.num_threads = previous

    async def reset_prefix_cache(self) -> None:
        """Forget every kept prefix (as vLLM's reset_prefix_cache): benchmarks that replay the
        same prompts start each run cold."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._prefix.clear)
        self.metrics["prefix_cache_bytes"] = 0

    async def drop_prefixes(self) -> int:
        """Forget every kept prefix to free its memory (the loop calls it when the trajectories
        that would extend them have all finished); returns the bytes released."""
        freed = self._prefix.bytes
        await self.reset_prefix_cache()
        return freed

    async def close(self) -> None:
        """Stop the scheduler; requests still waiting or running finish with reason 'abort'."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        for request in list(self._waiting) + (self._batch.rows if self._batch else []):
            request.finish_reason = "abort"
            self._resolve(request)
        self._waiting.clear()
        self._batch = None
        self._prefix.clear()
        self._executor.shutdown(wait=False)
        self._empty.set()  # a load_weights waiting for the drain must not hang

    def _kept_weights(self) -> list[torch.Tensor]:
        """The linear layers' kept (cast, packed) copies of their weights (packed_linear.py)."""
        return [kept for linear in self._linears if (kept := linear.kept_weight()) is not None]

    def _drop_kept_weights(self) -> None:
        for linear in self._linears:
            linear.drop_kept()

    def _kv_tensors(self) -> list[torch.Tensor]:
        """The KV tensors held now: the running batch's cache and the prefix store's entries."""
        out = [kv for _, layers, _ in list(self._prefix._entries.values()) for pair in layers for kv in pair]
        batch = self._batch
        if batch is not None:
            out += [t for layer in batch.cache.layers for t in (layer.keys, layer.values) if t is not None]
        return out

    @property
    def mean_batch_size(self) -> float:
        return self.metrics["batch_size_sum"] / max(1, self.metrics["steps"])

    # ------------------------------------------------------------------ checks

    def _check(self, prompt_ids: list[int], sampling: SamplingParams) -> None:
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be SamplingParams, got {type(sampling).__name__}")
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt_ids):
            bad = next(t for t in prompt_ids if not (isinstance(t, int) and 0 <= t < self.vocab_size))
            raise ValueError(f"prompt_ids holds {bad!r}, not a token id in [0, {self.vocab_size})")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens; max_model_len is {self.max_model_len}")
        if sampling.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {sampling.temperature}")
        if not 0 < sampling.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {sampling.top_p}")
        if sampling.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {sampling.max_tokens}")
        if isinstance(sampling.stop, str) or not all(isinstance(s, str) and s for s in sampling.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {sampling.stop!r}")

    def _copy_weights(self, state_dict: dict[str, Any], share: bool = False) -> None:
        params = self.model.state_dict()
        unknown = sorted(set(state_dict) - set(params))
        if unknown:
            raise KeyError(f"load_weights: unknown parameter names {unknown[:5]}"
                           f"{' ...' if len(unknown) > 5 else ''}; expected names like {next(iter(params))!r}")
        for name, value in state_dict.items():
            if tuple(value.shape) != self._shapes[name]:
                raise ValueError(f"load_weights: '{name}' has shape {tuple(value.shape)}, "
                                 f"expected {self._shapes[name]}")
        live = dict(self.model.named_parameters(remove_duplicate=False))
        with torch.no_grad():
            for name, value in state_dict.items():
                target = live.get(name)
                if share and target is not None and value.dtype == target.dtype and value.device == target.device:
                    target.data = value.detach()  # the same Parameter object: tied weights stay tied
                    self._borrowed.add(name)
                elif target is not None and (name in self._borrowed or name in self._released):
                    # the parameter is someone else's memory (a relay snapshot, the learner's
                    # weights), or was released: never write into it; take a private copy instead
                    target.data = value.detach().to(dtype=target.dtype, device=target.device, copy=True)
                    self._borrowed.discard(name)
                else:
                    params[name].copy_(value)
                self._released.discard(name)
        self._prefix.clear()  # the kept KV belongs to the old weights
        self._drop_kept_weights()  # a new weight may sit at the old one's address

    # ------------------------------------------------------------------ scheduler

    async def _run(self) -> None:
        while not self._closed:
            admitted: list[_Request] = []
            if not self._paused:
                while self._waiting and len(admitted) + self._batch_rows() < self.max_batch_size:
                    request = self._waiting.popleft()
                    if not request.future.done():  # the caller may have been cancelled meanwhile
                        admitted.append(request)
            if self._batch is not None:
                for request in self._batch.rows:
                    if request.future.cancelled():
                        request.finish_reason = "abort"
            if not admitted and self._batch is None:
                self._empty.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            self._empty.clear()
            try:
                finished = await asyncio.get_running_loop().run_in_executor(self._executor, self._step, admitted)
            except Exception as e:  # a failed forward fails its requests, never the engine
                for request in admitted + (self._batch.rows if self._batch else []):
                    if not request.future.done():
                        request.future.set_exception(e)
                self._batch = None
                continue
            for request in finished:
                self._resolve(request)

    def _batch_rows(self) -> int:
        return len(self._batch.rows) if self._batch is not None else 0

    def _resolve(self, request: _Request) -> None:
        if request.future.done():
            return
        now = time.perf_counter()
        steps = max(1, len(request.token_ids))
        request.future.set_result(GenerateOutput(
            token_ids=request.token_ids, logprobs=request.logprobs,
            finish_reason=request.finish_reason or "abort", version=self.version,
            metrics={"queue_s": (request.started or now) - request.submitted,
                     "seconds": now - request.submitted,
                     "mean_batch_size": request.batch_size_sum / steps,
                     "prompt_tokens": float(len(request.prompt_ids)),
                     "cached_tokens": float(request.cached_tokens)}))

    # ------------------------------------------------------------------ one step (worker thread)

    @torch.no_grad()
    def _step(self, admitted: list[_Request]) -> list[_Request]:
        """Prefill `admitted`, decode one token for the running batch, merge, drop finished rows."""
        start = time.perf_counter()
        if self.num_threads < self._pool_threads:  # fewer from now on (a learner step beside it): the
            release_idle_workers()  # pool's workers exit, so the learner's do not outnumber the cores
        self._pool_threads = self.num_threads
        with torch_threads(self.num_threads), self._precision():  # this thread's pool only (see __init__)
            finished = self._step_locked(admitted)
        self.metrics["forward_s"] += time.perf_counter() - start
        if self._batch is None:  # nothing left to decode: the pool's workers exit until the next step,
            release_idle_workers()  # so a learner stepping meanwhile is not throttled (cpu/threads.py)
        if self._trim_due(bool(admitted or finished)):
            start = time.perf_counter()
            trim_heap()
            self.metrics["heap_trims"] += 1
            self.metrics["heap_trim_s"] += time.perf_counter() - start
        return finished

    def _trim_due(self, freed: bool) -> bool:
        """Whether to hand the heap's free pages back to the OS after this step. The KV buffers grow
        by reallocation (kv_cache.py) and a prefill's activations are freed at its end; glibc keeps
        what they leave in the heap, and the engine's thread allocates outside the learner's
        `cpu.memory.mapped_tensors`, so without trims that slack stays resident (the held-out evaluation's
        replay peaked 0.09 GB lower with them; a trim takes ~5-20 ms against 0.1-0.3 s a step). Not
        often: the pages a trim returns are faulted in again by the next steps' tensors, and at
        every 64 steps (16 after a turn ends) `agentrl eval --env search --n 16` took 90-95 s with
        2.4M page faults, at every 512 83 s with 1.3M (never: 82 s; peak RSS +0.12 GB)."""
        if not self.trim_every:
            return False
        self._since_trim += 1
        if self._since_trim >= self.trim_every or (freed and self._since_trim >= max(1, self.trim_every // 4)):
            self._since_trim = 0
            return True
        return False

    def _precision(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch_dtype(self.autocast))

    def _step_locked(self, admitted: list[_Request]) -> list[_Request]:
        self._drop_finished()
        old = self._batch
        passes: list[_Pass] = []
        drafts: list[list[int]] = []
        if old is not None:
            drafts = self._drafts(old)
            passes.append(self._speculate_pass(old, drafts) if any(drafts) else self._decode_pass(old))
        groups: list[tuple[list[_Request], list[Hit]]] = []
        if admitted:
            start = time.perf_counter()
            for request in admitted:
                request.started = start
            groups = self._prefill_groups(admitted)
            passes += [self._prefill_pass(requests, hits) for requests, hits in groups]
        start = time.perf_counter()
        logits = self._forward(passes, prefills=len(groups))
        if not groups:  # a decode step alone: a point of the forward's cost (`ForwardCost`)
            fit = self.forward_cost()
            fit.add(passes[0].ids.numel(), time.perf_counter() - start)
            self.metrics["forward_fixed_tokens"] = fit.fixed_tokens()
        emitted = 0
        if old is not None:
            if any(drafts):
                emitted = self._accept(old, drafts, passes[0], logits[0])
            else:
                old.mask, old.positions = passes[0].mask, old.positions + 1
                self._advance(old, logits[0][:, -1])
                emitted = len(old.rows)
        if groups:
            new: _Batch | None = None
            for (requests, hits), p, out in zip(groups, passes[-len(groups):], logits[-len(groups):]):
                part = self._prefilled(requests, hits, p, out)
                new = part if new is None else _merge(new, part)
            assert new is not None
            self._batch = new if old is None else _merge(old, new)
        size = self._batch_rows()
        for request in self._batch.rows if self._batch else []:
            request.batch_size_sum += size
        m = self.metrics
        m["steps"] += 1
        m["prefills"] += bool(admitted)
        m["tokens"] += emitted + len(admitted)
        m["batch_size_sum"] += size
        m["max_batch_size"] = max(m["max_batch_size"], size)
        finished = [r for r in (self._batch.rows if self._batch else []) if r.finish_reason is not None]
        if finished and self._prefix.budget:
            self._keep_prefixes()
        self._drop_finished()
        if self._batch is not None:
            _compact_if_sparse(self._batch)
        return finished

    def _forward(self, passes: list[_Pass], prefills: int) -> list[torch.Tensor]:
        """Each pass's logits (rows, 1 or width, vocab). With `fuse_passes` the step's rectangles
        (its decode rows, its new rows' prompt groups) go through the model as one ragged pass:
        every token through the linear layers at once, attention per rectangle against its own
        cache (`agentrl.attention.ragged_attention`). A forward's cost is mostly a fixed part (the
        weights streamed once), so a step that also prefills pays it once instead of per pass.
        The last `prefills` passes are prefills: their own passes' count and time are metered."""
        m = self.metrics
        runs = [passes] if self.fuse_passes and len(passes) > 1 else [[p] for p in passes]
        if len(runs) == 1 and len(passes) > 1:
            m["fused_prefills"] += prefills
        outs: list[torch.Tensor] = []
        for run in runs:
            start = time.perf_counter()
            if len(run) > 1:
                outs += self._ragged_forward(run)
            else:
                p = run[0]
                outs.append(self.model(input_ids=p.ids, attention_mask=p.mask, position_ids=p.positions,
                                       use_cache=True, logits_to_keep=1 if p.last_only else 0,
                                       **{self._cache_kwarg: p.cache}).logits)
            if len(outs) - len(run) >= len(passes) - prefills:  # every pass of this run is a prefill
                m["prefill_forwards"] += 1
                m["prefill_s"] += time.perf_counter() - start
        return outs

    def _ragged_forward(self, passes: list[_Pass]) -> list[torch.Tensor]:
        parts, keep, offset = [], [], 0
        for p in passes:
            rows, width = p.ids.shape
            parts.append(RaggedPart(offset, rows, width, p.cache, causal_padding_mask(p.mask, width)))
            columns = torch.arange(offset, offset + rows * width, device=self.device).view(rows, width)
            keep.append(columns[:, -1:] if p.last_only else columns)
            offset += rows * width
        ids = torch.cat([p.ids.reshape(-1) for p in passes])[None]
        positions = torch.cat([p.positions.reshape(-1) for p in passes])[None]
        out = self.model(input_ids=ids, position_ids=positions, use_cache=False,
                         logits_to_keep=torch.cat([k.reshape(-1) for k in keep]), **{RAGGED: parts})
        sizes = [k.numel() for k in keep]
        return [chunk.view(*k.shape, -1) for chunk, k in zip(out.logits[0].split(sizes), keep)]

    def _prefill_groups(self, requests: list[_Request]) -> list[tuple[list[_Request], list[Hit]]]:
        """The new requests with the kept KV of their prompts' longest stored prefixes, in groups
        whose new-token counts are alike (one rectangle each, so a long first-turn prompt does not
        pad a dozen short continuations)."""
        hits = [self._prefix.lookup(r.prompt_ids) for r in requests]
        self._prefix.drop_consumed(hits)
        for r, (n, _, _) in zip(requests, hits):
            r.cached_tokens = n
        new_tokens = [len(r.prompt_ids) - n for r, (n, _, _) in zip(requests, hits)]
        return [([requests[i] for i in group], [hits[i] for i in group]) for group in _similar_length_groups(new_tokens)]

    def _prefill_pass(self, requests: list[_Request], hits: list[Hit]) -> _Pass:
        """Rows laid out as [pad | kept prefix | pad | new tokens]: the kept prefix goes into the
        cache, only the new tokens are computed; padding has mask 0."""
        cached = [n for n, _, _ in hits]
        past, width = max(cached), max(len(r.prompt_ids) - n for r, n in zip(requests, cached))
        rows = len(requests)
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, past + width), dtype=torch.long)
        for i, (r, n) in enumerate(zip(requests, cached)):
            fresh = r.prompt_ids[n:]
            ids[i, width - len(fresh):] = torch.tensor(fresh)
            mask[i, past - n:past] = 1
            mask[i, past + width - len(fresh):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        cache = self._new_cache(self.model.config)  # by default decode steps write in place (kv_cache.py)
        if past:
            for index, layer in enumerate(cache.layers):
                kept = next(kv[index][0] for _, kv, _ in hits if kv)
                blank = kept.new_zeros((1, kept.shape[1], past, kept.shape[3]))
                layer.update(*(torch.cat([_left_pad(kv[index][j], past, -2) if kv else blank for _, kv, _ in hits])
                               for j in (0, 1)))
        return _Pass(ids=ids.to(self.device), positions=positions.to(self.device), mask=mask.to(self.device),
                     cache=cache, last_only=True)

    def _prefilled(self, requests: list[_Request], hits: list[Hit], p: _Pass, logits: torch.Tensor) -> _Batch:
        """The new rows as a batch, their first tokens sampled from the prefill's last logits."""
        rows, width = p.ids.shape
        computed = int(p.mask[:, -width:].sum())
        m = self.metrics
        m["prefill_tokens"] += computed
        m["prefill_padding"] += rows * width - computed
        m["prefix_hit_tokens"] += sum(n for n, _, _ in hits)
        # the cache passed in is the one the model filled in place
        batch = _Batch(rows=list(requests), cache=p.cache, mask=p.mask,
                       next_ids=torch.zeros(rows, dtype=torch.long, device=self.device),
                       positions=p.mask.sum(-1))
        self._advance(batch, logits[:, -1])
        return batch

    def _keep_prefixes(self) -> None:
        """Put each finished row's KV (its prompt and all but its last sampled token, which was
        never fed) into the prefix store, padding columns left out."""
        batch = self._batch
        assert batch is not None
        for i, r in enumerate(batch.rows):
            if r.finish_reason not in ("stop", "length") or r.future.cancelled():
                continue
            tokens = r.prompt_ids + r.token_ids[:-1]
            cols = batch.mask[i].nonzero().squeeze(-1)
            if len(cols) != len(tokens):  # bookkeeping broke: keep nothing rather than wrong KV
                log.warning("hf engine: a finished row holds %d cached tokens, expected %d; not kept",
                            len(cols), len(tokens))
                continue
            kv = [(layer.keys[i:i + 1, :, cols], layer.values[i:i + 1, :, cols]) for layer in batch.cache.layers]
            self._prefix.put(tokens, kv)
        self.metrics["prefix_cache_bytes"] = self._prefix.bytes

    def _decode_pass(self, batch: _Batch) -> _Pass:
        mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        return _Pass(ids=batch.next_ids[:, None], positions=batch.positions[:, None], mask=mask, cache=batch.cache,
                     last_only=False)

    def _drafts(self, batch: _Batch) -> list[list[int]]:
        """Each row's prompt-lookup draft, empty when speculation is off or nothing matches, cut
        so that the tokens a step can emit (the drafts and one more) stay within the row's
        max_tokens and the model's length, and to the common length `_draft_width` picks."""
        if not self.speculative_tokens:
            return [[] for _ in batch.rows]
        out = []
        for r in batch.rows:
            room = min(r.sampling.max_tokens - len(r.token_ids),
                       self.max_model_len - len(r.prompt_ids) - len(r.token_ids)) - 1
            k = min(self.speculative_tokens, room)
            out.append(propose_continuation(r.prompt_ids + r.token_ids, k, *self.prompt_lookup) if k > 0 else [])
        width = draft_width([len(d) for d in out], [r.acceptance() for r in batch.rows], self.forward_cost().fixed_tokens())
        return [d[:width] for d in out]

    def forward_cost(self) -> ForwardCost:
        """The forward-cost fit for the thread count the next step runs on."""
        return self.forward_costs.setdefault(self.num_threads, ForwardCost())

    def _speculate_pass(self, batch: _Batch, drafts: list[list[int]]) -> _Pass:
        """Each row's next token and its draft, one column each; a shorter draft's columns are padding."""
        width = 1 + max(len(d) for d in drafts)
        rows = len(batch.rows)
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        fed = torch.zeros((rows, width), dtype=torch.long)
        ids[:, 0] = batch.next_ids.cpu()
        for i, d in enumerate(drafts):
            ids[i, 1:1 + len(d)] = torch.tensor(d, dtype=torch.long)
            fed[i, :1 + len(d)] = 1
        mask = torch.cat([batch.mask, fed.to(self.device)], dim=1)
        positions = batch.positions[:, None] + torch.arange(width, device=self.device)
        return _Pass(ids=ids.to(self.device), positions=positions, mask=mask, cache=batch.cache, last_only=False)

    def _accept(self, batch: _Batch, drafts: list[list[int]], p: _Pass, logits: torch.Tensor) -> int:
        """Each row keeps the drafts that equal the tokens it samples, position by position, and one
        sampled token more (see the module docstring). The columns of rejected drafts stay in the
        cache with mask 0 (as padding), the trailing ones that no row kept are cut. Returns the
        tokens emitted."""
        rows, width = p.ids.shape
        past, mask = batch.mask.shape[1], p.mask
        temps = torch.tensor([r.sampling.temperature for r in batch.rows], device=self.device).repeat_interleave(width)
        top_p = torch.tensor([r.sampling.top_p for r in batch.rows], device=self.device).repeat_interleave(width)
        logp = processed_logprobs(logits.reshape(rows * width, -1), temps, top_p).reshape(rows, width, -1)
        kept = []
        for i, (r, d) in enumerate(zip(batch.rows, drafts)):
            n = 0  # tokens this row emits; the first n fed columns are then its sequence
            for j in range(1 + len(d)):
                (tok,), (lp,) = sample_tokens(logp[i, j:j + 1], [r.sampling.temperature == 0], [r.generator],
                                              self.sampler)
                r.token_ids.append(tok)
                r.logprobs.append(lp)
                r.finish_reason = self._finish_reason(r)
                n += 1
                if r.finish_reason is not None or j == len(d) or tok != d[j]:
                    break
            mask[i, past + n:] = 0
            kept.append(n)
            r.drafted += len(d)
            r.accepted += n - 1
        m = self.metrics
        m["draft_tokens"] += sum(len(d) for d in drafts)
        m["accepted_tokens"] += sum(kept) - rows
        used = past + max(kept)
        if used < mask.shape[1]:  # columns no row kept: cut them from the cache
            mask = mask[:, :used]
            truncate_cache(batch.cache, used)
        batch.mask = mask
        batch.positions = batch.positions + torch.tensor(kept, device=self.device)
        batch.next_ids = torch.tensor([r.token_ids[-1] for r in batch.rows], dtype=torch.long, device=self.device)
        return sum(kept)

    def _advance(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Sample one token per row from the last logits, record it, decide whether the row is done."""
        rows = batch.rows
        temps = torch.tensor([r.sampling.temperature for r in rows], device=logits.device)
        top_p = torch.tensor([r.sampling.top_p for r in rows], device=logits.device)
        logp = processed_logprobs(logits, temps, top_p)
        tokens, lps = sample_tokens(logp, [r.sampling.temperature == 0 for r in rows],
                                    [r.generator for r in rows], self.sampler)
        for r, tok, lp in zip(rows, tokens, lps):
            r.token_ids.append(tok)
            r.logprobs.append(lp)
            r.finish_reason = self._finish_reason(r)
        batch.next_ids = torch.tensor(tokens, dtype=torch.long, device=self.device)

    def _finish_reason(self, r: _Request) -> str | None:
        if r.token_ids[-1] in r.stop_ids:
            return "stop"
        if r.sampling.stop and self._hit_stop_string(r):
            return "stop"
        if len(r.token_ids) >= r.sampling.max_tokens or len(r.prompt_ids) + len(r.token_ids) >= self.max_model_len:
            return "length"
        return None

    def _hit_stop_string(self, r: _Request) -> bool:
        text = self.tokenizer.decode(r.token_ids, skip_special_tokens=False)
        longest = max(len(s) for s in r.sampling.stop)
        # Search only the tail that could hold a new match (a multi-byte character completing
        # can rewrite the last few characters, hence the margin).
        window = text[max(0, r.checked_chars - longest - 4):]
        r.checked_chars = len(text)
        return any(s in window for s in r.sampling.stop)

    def _drop_finished(self) -> None:
        batch = self._batch
        if batch is None:
            return
        keep = [i for i, r in enumerate(batch.rows) if r.finish_reason is None]
        if len(keep) == len(batch.rows):
            return
        if not keep:
            self._batch = None
            return
        # The holes the finished rows leave among the first len(keep) are filled by the kept rows
        # beyond them: a cache that selects rows in place (GrowingLayer) then moves one row per
        # finished request, not every row after the first one that finished.
        order = list(range(len(keep)))
        holes = [i for i in order if batch.rows[i].finish_reason is not None]
        for hole, row in zip(holes, [i for i in keep if i >= len(keep)]):
            order[hole] = row
        index = torch.tensor(order, dtype=torch.long, device=self.device)
        batch.rows = [batch.rows[i] for i in order]
        batch.cache.batch_select_indices(index)
        batch.mask = batch.mask[index]
        batch.next_ids = batch.next_ids[index]
        batch.positions = batch.positions[index]
        # Columns that are padding for every remaining row only cost compute: trim them.
        lead = int((batch.mask.sum(0) == 0).long().cumprod(0).sum())
        if lead:
            batch.mask = batch.mask[:, lead:]
            drop_leading(batch.cache, lead)


def _similar_length_groups(lengths: list[int], slack: float = 1.25, floor: int = 32) -> list[list[int]]:
    """Indices grouped, longest first, so that each group's padded size (rows × longest) stays
    within `slack` × its real tokens (+ `floor`, below which an extra forward pass costs more
    than the padding)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups:
            g = groups[-1]
            longest = lengths[g[0]]
            if (len(g) + 1) * longest <= slack * (sum(lengths[j] for j in g) + lengths[i]) + floor:
                g.append(i)
                continue
        groups.append([i])
    return groups


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    if t.shape[dim] == width:
        return t
    shape = list(t.shape)
    shape[dim] = width - t.shape[dim]
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _compact_if_sparse(batch: _Batch, min_saved: int = 64, min_fraction: float = 0.5) -> None:
    """Move each row's cached tokens to the right end of a narrower cache when masked columns (a
    prefill's padding between a kept prefix and the new tokens, the drafts a row rejected while
    another kept them) make up `min_fraction` of it, and at least `min_saved` columns: every
    later step reads every column, and a long generation in a mixed batch would otherwise grow
    its cache by the widest row's drafts. The keys carry their rotary positions already and
    `positions` counts real tokens, so nothing else changes."""
    counts = batch.mask.sum(-1)
    width, kept = batch.mask.shape[1], int(counts.max())
    if width - kept < max(min_saved, min_fraction * width):
        return
    rows = batch.mask.shape[0]
    index = torch.zeros((rows, kept), dtype=torch.long, device=batch.mask.device)
    mask = torch.zeros((rows, kept), dtype=batch.mask.dtype, device=batch.mask.device)
    for i in range(rows):
        cols = batch.mask[i].nonzero().squeeze(-1)
        index[i, kept - len(cols):] = cols
        mask[i, kept - len(cols):] = 1
    for layer in batch.cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            setattr(layer, name, t.gather(2, index[:, None, :, None].expand(t.shape[0], t.shape[1], kept, t.shape[3])))
    batch.mask = mask


def _merge(a: _Batch, b: _Batch) -> _Batch:
    """One batch from two: left-pad the shorter cache (zero keys/values, mask 0) and stack rows."""
    width = max(a.mask.shape[1], b.mask.shape[1])
    for la, lb in zip(a.cache.layers, b.cache.layers):
        stack_rows([la, lb], width, out=la)
    return _Batch(rows=a.rows + b.rows, cache=a.cache,
                  mask=torch.cat([_left_pad(a.mask, width, 1), _left_pad(b.mask, width, 1)]),
                  next_ids=torch.cat([a.next_ids, b.next_ids]),
                  positions=torch.cat([a.positions, b.positions]))
