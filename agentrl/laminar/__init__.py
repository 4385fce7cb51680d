"""Laminar backend: trajectory-level asynchrony with a relay tier and dynamic repack (architecture.md §9,
algorithms.md §1). `run_training` is the entry point; the pieces are importable on their own.

Importing the package loads nothing: each name below is imported from its module on first use
(PEP 562), so `agentrl.laminar.prompts` or `.buffer` does not pull in torch and the loop."""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    "ExperienceBuffer": "buffer", "GroupVersionError": "buffer",
    "LaminarSystem": "loop", "build_system": "loop", "run_training": "loop", "run_training_async": "loop",
    "train": "loop",
    "RolloutManager": "manager",
    "PartialResponsePool": "partial",
    "PromptPool": "prompts",
    "Relay": "relay", "RelayChain": "relay", "WeightSnapshot": "relay", "broadcast_time": "relay",
    "optimal_broadcast_time": "relay", "optimal_chunks": "relay",
    "RolloutLoad": "repack", "best_fit_repack": "repack",
    "ActorDied": "runtime", "LocalRuntime": "runtime", "RayRuntime": "runtime", "make_runtime": "runtime",
    "GroupSpec": "types", "PartialEntry": "types", "WorkerLoad": "types",
    "RolloutWorker": "worker",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'agentrl.laminar' has no attribute {name!r}")
    return getattr(importlib.import_module(f"agentrl.laminar.{_MODULE_OF[name]}"), name)
