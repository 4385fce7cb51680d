"""Inference engines behind one interface (architecture.md §7): hf, vllm, openai.

    engine = make_engine(cfg)                     # cfg.engine.kind picks the backend
    out = await engine.generate(prompt_ids, SamplingParams(temperature=0.7))

Backends are imported lazily so that `hf` users never import vLLM.
"""

from __future__ import annotations

import os
import tempfile

from agentrl.config import Config
from agentrl.inference.base import GenerateOutput, InferenceEngine, SamplingParams
from agentrl.models import autocast_dtype, resolve_configured, resolve_device, use_chat_template

__all__ = ["GenerateOutput", "InferenceEngine", "SamplingParams", "make_engine"]


def make_engine(cfg: Config) -> InferenceEngine:
    """Build the engine named by `cfg.engine.kind` for `cfg.model`; its tokenizer (the rollout's)
    renders turns with `model.chat_template` when one is set."""
    engine = _build_engine(cfg)
    use_chat_template(engine.tokenizer, cfg.model)  # type: ignore[attr-defined]
    return engine


def _build_engine(cfg: Config) -> InferenceEngine:
    kind = cfg.engine.kind
    path = resolve_configured(cfg.model)  # openai too: the rollout tokenizes with a local copy
    if kind == "openai":  # the server owns the model; cfg.model.name is the served model name
        from agentrl.inference.openai import OpenAIEngine  # each engine's module loads only when asked for

        # Weight pushes go through a folder the server reads (a server on this machine shares /tmp).
        weights_dir = cfg.engine.weights_dir or os.path.join(tempfile.gettempdir(), f"agentrl-weights-{os.getpid()}")
        return OpenAIEngine(cfg.engine.base_url, cfg.model.name, api_key=cfg.engine.api_key,
                            weights_dir=weights_dir, tokenizer_path=path)
    if kind == "hf":
        from agentrl.inference.hf import HFEngine  # heavy lazy load: torch and transformers

        device = resolve_device(cfg.engine.device)
        # fp32 master weights (the trainer's pushes land in them); the forward runs in engine.dtype
        return HFEngine(path, dtype="float32", max_batch_size=cfg.engine.max_batch_size, device=device,
                        seed=cfg.run.seed, max_model_len=cfg.engine.max_model_len,
                        prefix_cache_mb=cfg.engine.prefix_cache_mb,
                        speculative_tokens=cfg.engine.speculative_tokens, pack_weights=cfg.engine.pack_weights,
                        autocast=engine_dtype(cfg, device))
    if kind == "vllm":
        from agentrl.inference.vllm import VLLMEngine  # optional: the vllm extra

        return VLLMEngine(path, dtype=engine_dtype(cfg, resolve_device(cfg.engine.device)), max_model_len=cfg.engine.max_model_len,
                          max_num_seqs=cfg.engine.max_batch_size,
                          gpu_memory_utilization=cfg.engine.gpu_memory_utilization, seed=cfg.run.seed,
                          lora=cfg.trainer.lora)
    raise ValueError(f"engine.kind {kind!r} is not one of 'hf', 'vllm', 'openai'")


def engine_dtype(cfg: Config, device: str) -> str:
    """engine.dtype resolved on `device`: auto follows trainer.dtype, so the engine samples in the
    precision the trainer scores in."""
    return autocast_dtype(cfg.trainer.dtype if cfg.engine.dtype == "auto" else cfg.engine.dtype, device)
