"""The prompt pool's order: shuffled, or in turns over a task field (`rollout.balance_key`)."""

import asyncio
from collections import Counter

import pytest

from agentrl.laminar.prompts import PromptPool


def _tasks() -> list[dict[str, str]]:
    # a kind with many tasks beside two small ones, as the search env's subdivision questions
    return ([{"id": f"big/{i}", "kind": "big"} for i in range(20)]
            + [{"id": f"small/{i}", "kind": "small"} for i in range(3)]
            + [{"id": f"tiny/{i}", "kind": "tiny"} for i in range(2)])


def _ids(pool: PromptPool, n: int) -> list[str]:
    return [spec.task["id"] for spec in asyncio.run(pool.take(n, worker_version=0))]


def test_a_balance_key_gives_every_value_its_turn_and_every_task_once_an_epoch() -> None:
    pool = PromptPool(_tasks(), group_size=2, seed=3, balance_key="kind")
    first = _ids(pool, 6)
    # two full rounds of turns: each kind twice, though "big" holds 20 of the 25 tasks
    assert Counter(t.split("/")[0] for t in first) == {"big": 2, "small": 2, "tiny": 2}
    epoch = first + _ids(pool, 19)
    assert sorted(epoch) == sorted(t["id"] for t in _tasks())  # one epoch: every task once
    assert epoch[-15:] == [t for t in epoch[-15:] if t.startswith("big/")]  # the others ran out first


def test_without_a_balance_key_the_order_follows_the_task_counts() -> None:
    pool = PromptPool(_tasks(), group_size=2, seed=3)
    epoch = _ids(pool, 25)
    assert sorted(epoch) == sorted(t["id"] for t in _tasks())
    assert Counter(t.split("/")[0] for t in epoch[:6]) != {"big": 2, "small": 2, "tiny": 2}  # seed 3's shuffle


def test_the_balanced_order_depends_on_the_seed_and_resumes_where_it_stopped() -> None:
    a = PromptPool(_tasks(), group_size=2, seed=1, balance_key="kind")
    b = PromptPool(_tasks(), group_size=2, seed=2, balance_key="kind")
    assert _ids(a, 25) != _ids(b, 25)
    pool = PromptPool(_tasks(), group_size=2, seed=1, balance_key="kind")
    head = _ids(pool, 7)
    resumed = PromptPool(_tasks(), group_size=2, seed=1, balance_key="kind")
    asyncio.run(resumed.load_state_dict(asyncio.run(pool.state_dict())))
    assert head + _ids(resumed, 18) == _ids(PromptPool(_tasks(), group_size=2, seed=1, balance_key="kind"), 25)


def test_a_balance_key_the_tasks_lack_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rollout\.balance_key 'level' is not a field of every task"):
        PromptPool(_tasks(), group_size=2, balance_key="level")
