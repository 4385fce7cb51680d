"""Laminar backend: trajectory-level asynchrony with a relay tier and dynamic repack (design §9,
algorithms.md §1). `run_training` is the entry point; the pieces are importable on their own."""

from agentrl.laminar.buffer import ExperienceBuffer, GroupVersionError
from agentrl.laminar.loop import LaminarSystem, build_system, run_training, run_training_async, train
from agentrl.laminar.manager import RolloutManager
from agentrl.laminar.partial import PartialEntry, PartialResponsePool
from agentrl.laminar.prompts import GroupSpec, PromptPool
from agentrl.laminar.relay import (
    Relay,
    RelayChain,
    WeightSnapshot,
    broadcast_time,
    optimal_broadcast_time,
    optimal_chunks,
)
from agentrl.laminar.repack import RolloutLoad, best_fit_repack
from agentrl.laminar.runtime import ActorDied, LocalRuntime, RayRuntime, make_runtime
from agentrl.laminar.worker import RolloutWorker

__all__ = [
    "ActorDied", "ExperienceBuffer", "GroupSpec", "GroupVersionError", "LaminarSystem", "LocalRuntime",
    "PartialEntry", "PartialResponsePool", "PromptPool", "RayRuntime", "Relay", "RelayChain",
    "RolloutLoad", "RolloutManager", "RolloutWorker", "WeightSnapshot", "best_fit_repack",
    "broadcast_time", "build_system", "make_runtime", "optimal_broadcast_time", "optimal_chunks",
    "run_training", "run_training_async", "train",
]
