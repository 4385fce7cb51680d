"""The data that flows must survive JSON lines exactly and keep its bookkeeping invariants."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.types import Group, Segment, Status, Trajectory, Turn

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


def make_traj(tid: str = "t0", version: int = 3) -> Trajectory:
    seg = Segment(prompt_len=0)
    seg.append([1, 2, 3], policy=False)
    seg.prompt_len = 3
    seg.append([10, 11], policy=True, logprobs=[-0.5, -1.25], version=version)
    seg.append([4, 5], policy=False)
    seg.turns.append(Turn(action_text="hi", action_start=3, action_end=5, obs_start=5, obs_end=7,
                          observation=[{"role": "tool", "content": "ok"}], step_reward=0.1,
                          reward_components={"valid_call": 0.1}, tool_calls=1))
    return Trajectory(id=tid, group_id="g", task_id="task-1", env="code", task={"id": "task-1"},
                      segments=[seg], messages=[{"role": "user", "content": "é ✓"}],
                      step_rewards=[0.1], outcome_reward=1.0, reward=1.1, status=Status.FINISHED,
                      finished_version=version + 2, timings={"total_s": 1.5})


def test_trajectory_round_trips_through_json_line() -> None:
    t = make_traj()
    line = t.to_json()
    assert "\n" not in line
    back = Trajectory.from_json(line)
    assert back == t
    assert back.status is Status.FINISHED
    assert isinstance(back.segments[0].turns[0], Turn)


@given(logprobs=st.lists(finite, min_size=1, max_size=20), version=st.integers(0, 10**6),
       reward=finite, text=st.text())
def test_round_trip_is_exact_for_arbitrary_values(logprobs: list[float], version: int, reward: float,
                                                  text: str) -> None:
    seg = Segment()
    seg.append(list(range(len(logprobs))), policy=True, logprobs=logprobs, version=version)
    t = Trajectory(id="x", group_id="g", task_id=text, segments=[seg], reward=reward,
                   messages=[{"role": "assistant", "content": text}])
    assert Trajectory.from_json(t.to_json()) == t


def test_group_round_trip_and_version() -> None:
    g = Group(id="g", task_id="task-1", trajectories=[make_traj("a"), make_traj("b")])
    assert Group.from_json(g.to_json()) == g
    assert g.version == 3
    assert g.rewards == [1.1, 1.1]


def test_mixed_versions_are_detected() -> None:
    t = make_traj()
    t.segments[0].append([12], policy=True, logprobs=[-0.1], version=4)
    with pytest.raises(ValueError, match="mixes weight versions"):
        _ = t.version
    g = Group(id="g", task_id="x", trajectories=[make_traj("a", 1), make_traj("b", 2)])
    with pytest.raises(ValueError, match="mixes"):
        _ = g.version


def test_staleness_is_finished_minus_generated_version() -> None:
    t = make_traj(version=3)  # finished when the trainer was at 5 (algorithms.md §1.8 test 3)
    assert t.staleness == 2


def test_segment_bookkeeping() -> None:
    seg = make_traj().segments[0]
    seg.check()
    assert seg.num_policy_tokens == 2
    assert seg.versions == [-1, -1, -1, 3, 3, -1, -1]
    with pytest.raises(ValueError, match="log-prob"):
        seg.append([1, 2], policy=True, logprobs=[0.0])
    seg.truncate(5)
    assert seg.token_ids == [1, 2, 3, 10, 11] and len(seg.turns) == 1
    seg.truncate(4)
    assert seg.turns == []
    seg.loss_mask.append(1)
    with pytest.raises(ValueError, match="loss_mask"):
        seg.check()


def test_status_trainable() -> None:
    assert Status.FINISHED.trainable and Status.TRUNCATED.trainable
    assert not Status.ERROR.trainable and not Status.ABORTED.trainable
