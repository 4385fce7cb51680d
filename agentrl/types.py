"""The data that flows: env → rollout → buffer → trainer (architecture.md §1, §6).

Everything here is plain data with exact JSON round-trips (`to_dict`/`from_dict`,
`to_json`/`from_json`), so trajectories can be streamed to the partial-response pool,
written to run directories and moved between rollout workers without loss.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, TypedDict


class Message(TypedDict, total=False):
    """One chat message in OpenAI format."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    name: str
    tool_call_id: str


Task = dict[str, Any]
"""One task: a plain JSON-able dict with at least an "id" key; the env gives it meaning."""


@dataclass
class StepResult:
    """What `Env.astep(action)` returns.

    `observation` holds the new messages to append to the conversation (tool results, user
    feedback); it may be empty on the terminal step. `reward` is this step's (ungated) step
    reward; its named components go in `info["step_rewards"]`. On the terminal step `info`
    carries `"outcome_reward": float` and `"reward_components": dict[str, float]`.
    """

    observation: list[Message]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Status(str, Enum):
    """How a trajectory ended. Only `finished` and `truncated` ones train; `error` and
    `aborted` ones are kept for metrics and masked from the loss."""

    RUNNING = "running"
    FINISHED = "finished"  # the env said done (submit, answer, ...)
    TRUNCATED = "truncated"  # max turns, context or token budget reached
    ABORTED = "aborted"  # cancelled: wall-clock budget, shutdown, worker loss
    ERROR = "error"  # env or tool failure

    @property
    def trainable(self) -> bool:
        return self in (Status.FINISHED, Status.TRUNCATED)


@dataclass
class Turn:
    """One policy action and the observation that followed it.

    `action_start:action_end` and `obs_start:obs_end` index the owning segment's token_ids.
    """

    action_text: str
    action_start: int
    action_end: int
    obs_start: int = 0
    obs_end: int = 0
    finish_reason: str = "stop"
    observation: list[Message] = field(default_factory=list)
    step_reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    tool_calls: int = 0
    tool_errors: int = 0
    sandbox_faults: list[str] = field(default_factory=list)  # limits its tool calls ran into (oom, disk_full, ...)
    generate_seconds: float = 0.0
    env_seconds: float = 0.0


@dataclass
class Segment:
    """One contiguous context window of a trajectory (SUPO, algorithms.md §4).

    A trajectory without summaries has exactly one segment. Per-token arrays all have
    `len(token_ids)` entries; prompt and observation tokens have loss_mask 0, logprob 0.0 and
    version -1.
    """

    token_ids: list[int] = field(default_factory=list)
    prompt_len: int = 0
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    summary: str | None = None

    def __post_init__(self) -> None:
        # The weight versions of the policy tokens read so far (not a field: to_dict and equality
        # ignore it). `append` keeps it current, so a trajectory's version costs O(segments), not a
        # scan of every token; lists replaced or shortened some other way are scanned again.
        self._versions_seen: set[int] = set()
        self._seen_upto = 0
        self._seen_lists: tuple[list[int], list[int]] | None = None

    def append(self, token_ids: list[int], *, policy: bool, logprobs: list[float] | None = None,
               version: int = -1) -> None:
        """Append tokens; policy tokens need their behaviour log-probs and weight version."""
        if policy and (logprobs is None or len(logprobs) != len(token_ids)):
            raise ValueError("policy tokens need one behaviour log-prob each")
        seen = self.policy_versions  # (catches up on tokens added any other way)
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([1 if policy else 0] * len(token_ids))
        self.logprobs.extend(logprobs if policy else [0.0] * len(token_ids))  # type: ignore[arg-type]
        self.versions.extend([version if policy else -1] * len(token_ids))
        if policy and token_ids:
            seen.add(version)
        self._seen_upto = len(self.versions)

    def truncate(self, length: int) -> None:
        """Drop every token from `length` on (SUPO discards the last action/observation pair)."""
        for name in ("token_ids", "loss_mask", "logprobs", "versions"):
            del getattr(self, name)[length:]
        self.turns = [t for t in self.turns if t.action_end <= length]
        self._seen_lists = None  # the dropped tokens' versions go too: read them again

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def policy_versions(self) -> set[int]:
        """The weight versions of this segment's policy tokens (the live set: do not modify)."""
        lists = (self.versions, self.loss_mask)
        if (self._seen_lists is None or self._seen_lists[0] is not lists[0] or self._seen_lists[1] is not lists[1]
                or len(self.versions) < self._seen_upto):
            self._versions_seen, self._seen_upto, self._seen_lists = set(), 0, lists
        end = min(len(self.versions), len(self.loss_mask))
        if self._seen_upto < end:
            start = self._seen_upto
            self._versions_seen.update(v for v, m in zip(self.versions[start:end], self.loss_mask[start:end]) if m)
            self._seen_upto = end
        return self._versions_seen

    def check(self) -> None:
        """Raise if the per-token arrays disagree (the bookkeeping invariant)."""
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"segment.{name} has {len(getattr(self, name))} entries, token_ids {n}")
        if any(self.loss_mask[: self.prompt_len]):
            raise ValueError("prompt tokens must have loss_mask 0")


@dataclass
class Trajectory:
    """One rollout of one task: the tokens the trainer trusts plus what a human reads."""

    id: str
    group_id: str
    task_id: str
    env: str = ""
    task: dict[str, Any] = field(default_factory=dict)
    segments: list[Segment] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    outcome_reward: float = 0.0
    reward: float = 0.0  # the scalar the advantage uses, after gating/shaping
    reward_components: dict[str, float] = field(default_factory=dict)
    status: Status = Status.RUNNING
    error: str | None = None
    overlong: bool = False  # SUPO/DAPO: mask from the loss, keep in group stats
    num_summaries: int = 0
    consumed_version: int | None = None  # trainer version when it was sampled from the buffer
    finished_version: int | None = None  # trainer version when it finished (staleness, §1.3)
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    # How the token rows were built: "append" when every turn's prompt extended the previous prompt
    # and completion token for token (one segment per context window); "stepwise" when a chat
    # template rewrote earlier turns, so each policy request is its own segment (its prompt and its
    # sample) sharing the episode's reward and advantage.
    mode: str = "append"

    @property
    def num_turns(self) -> int:
        return sum(len(s.turns) for s in self.segments)

    @property
    def demonstrated(self) -> bool:
        """An expert's trajectory played by a teacher (agentrl/demos.py), not sampled by the policy:
        its behaviour log-probs are placeholders, and on-policy statistics leave it out."""
        return bool(self.metrics.get("demonstration"))

    @property
    def num_policy_tokens(self) -> int:
        return sum(s.num_policy_tokens for s in self.segments)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    @property
    def policy_versions(self) -> set[int]:
        return set().union(*(s.policy_versions for s in self.segments))

    @property
    def version(self) -> int | None:
        """The single weight version that generated this trajectory (None if no policy token).

        Raises if tokens of several versions were mixed (Laminar forbids it, §1.2)."""
        versions = self.policy_versions
        if len(versions) > 1:
            raise ValueError(f"trajectory {self.id} mixes weight versions {sorted(versions)}")
        return next(iter(versions), None)

    @property
    def staleness(self) -> int | None:
        """Inherent staleness M − K (algorithms.md §1.3)."""
        if self.finished_version is None or self.version is None:
            return None
        return self.finished_version - self.version

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["status"] = Status(d["status"])
        d["segments"] = [
            Segment(**{**s, "turns": [Turn(**t) for t in s["turns"]]}) for s in d["segments"]
        ]
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.from_dict(json.loads(line))


@dataclass
class Group:
    """The G trajectories sampled for one task; the unit the buffer stores and the trainer
    samples (group atomicity, algorithms.md §1.3)."""

    id: str
    task_id: str
    trajectories: list[Trajectory] = field(default_factory=list)

    @property
    def version(self) -> int | None:
        versions = {t.version for t in self.trajectories if t.version is not None}
        if len(versions) > 1:
            raise ValueError(f"group {self.id} mixes weight versions {sorted(versions)}")
        return next(iter(versions), None)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "task_id": self.task_id,
                "trajectories": [t.to_dict() for t in self.trajectories]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Group:
        return cls(id=d["id"], task_id=d["task_id"],
                   trajectories=[Trajectory.from_dict(t) for t in d["trajectories"]])

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Group:
        return cls.from_dict(json.loads(line))
