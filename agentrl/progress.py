"""What a training run is doing right now, for the progress display (issue 14: signs of life).

    from agentrl.progress import status
    status.stage = "validating tasks"      # any code may name the stage it enters
    status.watch(system)                   # laminar/loop.py: the running system's handles
    await status.poll()                    # run.py's display, every second or so
    status.line()  # 'rollout · 3 done, 4 running · ctx +120 tok/s · last step: reward 0.125, 38 policy tok/s'

The counts come from the partial-response pool (in-flight trajectories and the tokens they grew
by), one `stats()` call a poll through the same awaitable handles the loop uses, so they work on
the local and the Ray runtime at any number of workers.
The pool hears a trajectory's length after each generation and each tool observation, so the live
rate ("ctx") is context growth, not policy tokens alone; the exact policy tokens/s of the rollout
comes with each finished step (metrics.jsonl's tokens_per_s).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

STAGES = ("starting", "loading model", "validating tasks", "rollout", "learning", "pushing weights", "evaluating", "warm start", "done")


class RunStatus:
    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s  # the live rate is averaged over this long: turns report their tokens as they end
        self.reset()

    def reset(self) -> None:
        self.stage = "starting"
        self.finished = 0  # trajectories that reached the experience buffer
        self.in_flight = 0
        self.last_reward: float | None = None  # mean reward of the last finished step
        self.last_policy_tps: float | None = None  # that step's policy tokens/s
        self.last_step: int | None = None
        self._system: Any = None
        self._generated = 0  # tokens the watched system's trajectories grew by
        self._samples: deque[tuple[float, int]] = deque()

    def watch(self, system: Any) -> None:
        """Follow a running Laminar system (anything with a `partial` handle)."""
        self._system = system
        self._samples.clear()

    def step_done(self, step: int, reward: float, policy_tokens_per_s: float | None = None) -> None:
        self.last_step, self.last_reward, self.last_policy_tps = step, reward, policy_tokens_per_s

    async def poll(self) -> None:
        """Read the in-flight trajectories and their token counts; never raises (the system may
        be starting or shutting down)."""
        system = self._system
        if system is None:
            return
        try:
            stats = await system.partial.stats()
        except Exception:
            return
        self._generated = int(stats["tokens_grown"])
        self.in_flight, self.finished = int(stats["in_flight"]), int(stats["closed"])
        now = time.monotonic()
        self._samples.append((now, self._generated))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    @property
    def tokens_per_s(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def line(self) -> str:
        parts = [self.stage]
        if self._system is not None:
            parts.append(f"{self.finished} done, {self.in_flight} running")
            rate = self.tokens_per_s
            if rate is not None and self._generated:
                parts.append(f"ctx +{rate:.0f} tok/s")
        if self.last_reward is not None:
            tps = f", {self.last_policy_tps:.0f} policy tok/s" if self.last_policy_tps else ""
            parts.append(f"step {self.last_step}: reward {self.last_reward:.3f}{tps}")
        return " · ".join(parts)


status = RunStatus()  # the process's current run (one `agentrl train` per process)
