"""Signs of life: the run status reads in-flight trajectories from the partial-response pool, and
off a terminal the run prints it as a log line at a steady interval (issue 14)."""

import asyncio
from types import SimpleNamespace

import pytest

from agentrl.laminar.partial import PartialEntry, PartialResponsePool
from agentrl.progress import RunStatus
from agentrl.run import _Progress, _StagedLearner


def entry(tid: str, worker: str = "worker0") -> PartialEntry:
    return PartialEntry(tid, "g0", 2, {"id": "t"}, worker, 0)


async def test_status_counts_trajectories_and_policy_tokens_per_second() -> None:
    partial = PartialResponsePool()
    status = RunStatus(window_s=60.0)
    status.stage = "rollout"
    status.watch(SimpleNamespace(partial=partial, workers={"worker0": None, "worker1": None}))
    await partial.open([entry("a"), entry("b", "worker1"), entry("c")])
    await partial.progress("a", 500)  # the prompt: a baseline, not generation
    await partial.progress("b", 300)
    await status.poll()
    await partial.progress("a", 540)
    await partial.progress("b", 360)
    await partial.close("c")
    await asyncio.sleep(0.05)
    await status.poll()
    assert (status.finished, status.in_flight) == (1, 2)
    rate = status.tokens_per_s
    assert rate is not None and 100 / 0.2 < rate < 100 / 0.04  # 100 tokens in ~0.05 s
    status.step_done(3, 0.25, 41.2)
    assert status.line().startswith("rollout · 1 done, 2 running · ctx +")
    assert status.line().endswith("tok/s · step 3: reward 0.250, 41 policy tok/s")


async def test_status_poll_survives_a_system_going_away() -> None:
    class Gone:
        async def stats(self) -> dict[str, int]:
            raise ConnectionError("actor died")

    status = RunStatus()
    status.watch(SimpleNamespace(partial=Gone(), workers={}))
    await status.poll()  # does not raise
    assert status.line() == "starting · 0 done, 0 running"


async def test_off_a_terminal_the_status_is_logged_at_a_steady_interval(capsys: pytest.CaptureFixture[str]) -> None:
    progress = _Progress(total=2, start=0, quiet=False, log_every_s=0.05)  # pytest's stderr is no TTY
    assert progress.bar is None
    from agentrl.progress import status

    status.stage = "validating tasks"
    ticker = asyncio.ensure_future(progress.run(tick_s=0.01))
    await asyncio.sleep(0.3)
    ticker.cancel()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "validating tasks" in ln]
    assert 3 <= len(lines) <= 8, lines  # every ~0.05 s, not every tick


def test_staged_learner_names_the_stage() -> None:
    from agentrl.progress import status

    inner = SimpleNamespace(version=3, step=lambda groups: {"loss": 1.0},
                            state_dict_for_inference=lambda: {"w": 1})
    learner = _StagedLearner(inner)
    assert learner.version == 3
    status.stage = "rollout"
    assert learner.state_dict_views() == {"w": 1} and status.stage == "rollout"  # the v0 push
    assert learner.step([]) == {"loss": 1.0} and status.stage == "learning"
    assert learner.state_dict_views() == {"w": 1} and status.stage == "pushing weights"
    inner.state_dict_views = lambda: {"view": 1}  # a learner with views pushes them, not a clone
    assert learner.state_dict_views() == {"view": 1}
