"""How a learner step shares this process's CPU with the in-process engines: the one interface the
training loop asks (`LearnerStepPolicy`), so the loop and the learner hold no thread or allocator
rules of their own.

On a GPU run the engines are elsewhere (vLLM, Ray) and the policy is the plain one: every core,
glibc's own heap. On a CPU run with the `hf` engine in the process, the learner step and the
engine's decode compete for the same cores and the same heap, and three rules keep them apart:

- threads: the step takes the cores the engines leave (`learner_threads`), and every core while a
  lone engine idles (`LearnerStepPolicy.elastic`, re-read at each layer);
- memory: the step's large tensors are mmapped so that what it frees goes back to the OS
  (`learner_mmap_threshold`), and the heap is trimmed after it;
- the engine decodes on every core between steps (`engine_on_idle_cores`) and on its own share
  during one (`learner_beside_engine`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.inference.base import all_cores, own_cores
from agentrl.inference.cpu.memory import LEARNER_MMAP_THRESHOLD, mapped_tensors, trim_heap
from agentrl.inference.cpu.threads import threads_per_block, torch_threads


def learner_mmap_threshold(backend: str, engines_in_process: bool, configured_mb: float | None) -> int | None:
    """glibc's mmap threshold for the RL learner step, in bytes (None: glibc's own, unmapped).
    `trainer.mmap_threshold_mb` when set; else 128 KiB where no in-process engine decodes beside the
    step (`sync`, or no local engines) and unmapped where one does: the threshold is process-wide,
    and at 128 KiB the engine's per-step tensors would be mapped and faulted in fresh as well (the
    kernel time of page faults then dominates a step). A threshold of a few MiB maps the step's
    activations and gradients but not a decode step's small tensors."""
    if configured_mb is not None:
        return int(configured_mb * 2**20)
    return LEARNER_MMAP_THRESHOLD if backend == "sync" or not engines_in_process else None


def learner_threads(backend: str, engine_threads: int, cores: int) -> int:
    """Intra-op threads for the learner step: every core where no in-process engine decodes beside
    it (`sync` takes turns; Ray's engines are elsewhere), else the cores the engines leave, at least
    one: an oversubscribed OpenMP pool spin-waits. Always set explicitly, because a worker thread's
    default is not the event loop's (torch.set_num_threads on a thread outside an OpenMP region
    moves libgomp's default for threads started later)."""
    if backend == "sync" or engine_threads <= 0:
        return cores
    return max(1, cores - engine_threads)


def engine_threads(engines: Sequence[Any]) -> int:
    """The intra-op threads the in-process engines decode on beside a learner step, their own
    share (`HFEngine.own_threads`; 0 for engines that do not say)."""
    counts = (getattr(e, "own_threads", getattr(e, "num_threads", 0)) for e in engines)
    return sum(t for t in counts if isinstance(t, int))


@dataclass(frozen=True)
class LearnerStepPolicy:
    """The CPU rules one learner step runs under (`applied`)."""

    threads: int
    mmap_threshold: int | None = None  # None: glibc's own threshold
    elastic: Callable[[], int] | None = None  # the thread count re-read at each layer, or fixed

    @classmethod
    def for_run(cls, backend: str, engines: Sequence[Any], model: Any,
                configured_mmap_mb: float | None = None) -> LearnerStepPolicy:
        """The policy for a run on `backend` with these in-process `engines` and the learner's
        `model` (None or not an nn.Module: the learner is elsewhere)."""
        cores = os.cpu_count() or 1
        threads = learner_threads(backend, engine_threads(engines), cores)
        elastic = None
        lone = engines[0] if len(engines) == 1 else None
        if backend != "sync" and isinstance(model, torch.nn.Module) and hasattr(lone, "decoding"):
            # while the lone engine idles (under one-step-off it finishes the next batch partway
            # through a long update) the step takes its cores back
            elastic = lambda: threads if lone.decoding else max(threads, cores)  # noqa: E731
        return cls(threads, learner_mmap_threshold(backend, bool(engines), configured_mmap_mb), elastic)

    @contextlib.contextmanager
    def applied(self, model: Any) -> Iterator[None]:
        """Run the step inside: its threads (this worker thread's own, restored after), its large
        tensors mapped, and the heap trimmed after it, so the pages its gradients and activations
        held go back before the weight push."""
        with (torch_threads(self.threads),
              mapped_tensors(self.mmap_threshold) if self.mmap_threshold is not None else contextlib.nullcontext(),
              threads_per_block(model, self.elastic) if self.elastic is not None else contextlib.nullcontext()):
            yield
        trim_heap()


def engine_on_idle_cores(engines: Sequence[Any]) -> contextlib.AbstractContextManager[Any]:
    """For the whole run: a lone in-process engine that can (`HFEngine.all_cores`) decodes on every
    core, except while a learner step computes beside it (`learner_beside_engine`). Several engines
    share the cores with each other and keep their own share."""
    return all_cores(engines[0]) if len(engines) == 1 else contextlib.nullcontext()


def learner_beside_engine(backend: str, engines: Sequence[Any]) -> contextlib.AbstractContextManager[Any]:
    """While a learner step runs: a lone in-process engine that decodes meanwhile (every backend but
    `sync`) goes back to its own share of the cores, and the learner takes the rest."""
    if backend != "sync" and len(engines) == 1:
        return own_cores(engines[0])
    return contextlib.nullcontext()
