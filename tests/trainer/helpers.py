"""Build real `agentrl.types` trajectories for trainer tests."""

from __future__ import annotations

import torch

from agentrl.types import Group, Segment, Status, Trajectory


def segment(prompt: list[int], response: list[int], logprobs: list[float] | None = None,
            version: int = 0, obs: list[int] | None = None, response2: list[int] | None = None) -> Segment:
    seg = Segment(prompt_len=len(prompt))
    seg.append(prompt, policy=False)
    seg.append(response, policy=True, logprobs=logprobs or [-1.0] * len(response), version=version)
    if obs is not None:
        seg.append(obs, policy=False)
        seg.append(response2 or [], policy=True, logprobs=[-1.0] * len(response2 or []), version=version)
    return seg


def trajectory(tid: str, gid: str, reward: float, segments: list[Segment], status: Status = Status.FINISHED,
               overlong: bool = False) -> Trajectory:
    return Trajectory(id=tid, group_id=gid, task_id=gid, segments=segments, reward=reward,
                      outcome_reward=reward, status=status, overlong=overlong)


def random_groups(n_groups: int, group_size: int, vocab: int, seed: int = 0, prompt_len: int = 4,
                  max_resp: int = 6) -> list[Group]:
    """Groups of random token sequences with rewards in {0, 1} and behaviour log-probs near −log V."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for i in range(n_groups):
        prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        trajs = []
        for j in range(group_size):
            n = int(torch.randint(2, max_resp + 1, (1,), generator=g))
            resp = torch.randint(0, vocab, (n,), generator=g).tolist()
            lp = (-4.2 + 0.05 * torch.randn(n, generator=g)).tolist()
            trajs.append(trajectory(f"t{i}-{j}", f"g{i}", float((i + j) % 2), [segment(prompt, resp, lp)]))
        groups.append(Group(id=f"g{i}", task_id=f"g{i}", trajectories=trajs))
    return groups
