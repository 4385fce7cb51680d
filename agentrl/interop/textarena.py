"""TextArena games as an agentrl env: `--env textarena:GAME_ID`.

    agentrl train --env textarena:GuessTheNumber-v0
    agentrl train --env textarena:TicTacToe-v0 env.kwargs.opponent=random

A task is a game seed (train seeds 0.., held-out seeds from 1000003 on). An episode is one game:
`ta.make(GAME_ID)`, `reset(num_players, seed)`, and each model reply is one move passed to
`step` as it stands (TextArena reads the move from the text, e.g. "[5]"). The model's first
message is the game's opening observation; after each move it reads what the game said since
(its own move's echo dropped). In a two-player game the model is player 0 and the other
player's moves come from an opponent policy (`opponent`): "random" (a move drawn from those the
game lists, seeded by the task), "first" (the first listed move) or "package.module:function"
(a function of the opponent's observation text that returns its move). When the game ends,
`close()` gives each player's reward; the model's is the outcome reward, and a reward >= 1
(a win, or a solved puzzle) is a success. A game still running after `max_turns` model moves
is truncated with reward 0.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from typing import Any

from agentrl.config import ConfigError
from agentrl.env import Env, EpisodeOverError, load_entry_point
from agentrl.interop.packages import check_known, require
from agentrl.types import Message, StepResult, Task

SPLITS = ("train", "test")
_TEST_SEED_OFFSET = 1_000_003
_SYSTEM = ("You are playing a text game. Read the game's messages and reply with your move exactly in the "
           "format the game asks for (usually in square brackets, e.g. [5]).")
# A move the game offers: a short bracketed token, not a speaker tag such as [GAME] or [Player 1].
_MOVE = re.compile(r"\[(?!GAME\]|Player)[^\[\]\n]{1,24}\]")
_MOVE_LISTS = ("Available Moves", "Valid moves", "Valid Moves", "available moves", "valid moves")


def listed_moves(observation: str) -> list[str]:
    """The moves a game lists in its latest observation (after its last "Available Moves" line
    when it has one), in order, without repeats."""
    at = max((observation.rfind(k) for k in _MOVE_LISTS), default=-1)
    text = observation[at:] if at >= 0 else observation[-600:]
    return list(dict.fromkeys(_MOVE.findall(text)))


def random_opponent(observation: str, rng: random.Random) -> str:
    moves = listed_moves(observation)
    return rng.choice(moves) if moves else "[0]"


def first_opponent(observation: str, rng: random.Random) -> str:
    moves = listed_moves(observation)
    return moves[0] if moves else "[0]"


OPPONENTS: dict[str, Callable[[str, random.Random], str]] = {"random": random_opponent, "first": first_opponent}


def _load_opponent(name: str) -> Callable[[str, random.Random], str]:
    if name in OPPONENTS:
        return OPPONENTS[name]
    if ":" not in name:
        check_known("opponent", name, OPPONENTS, scheme="textarena")
    try:
        user_fn = load_entry_point(name)
    except ImportError as e:
        raise ConfigError(f"textarena: opponent '{name}' does not load: {e}") from None
    return lambda observation, rng: str(user_fn(observation))


@functools.cache
def num_players(game: str) -> int:
    """1 or 2: what the game's `reset` accepts (TextArena asserts the count)."""
    ta = require("textarena", scheme="textarena")
    for n in (1, 2):
        try:
            ta.make(game).reset(num_players=n, seed=0)
            return n
        except AssertionError:
            continue
    raise ConfigError(f"textarena: game '{game}' takes neither 1 nor 2 players; games of more players are "
                      "not supported")


class TextArenaEnv(Env):
    """One TextArena game per episode; the model is player 0.

    Args (`env.kwargs`):
        spec: the game id (the part after `textarena:`), e.g. GuessTheNumber-v0
        opponent: "random", "first" or "package.module:function" (two-player games)
        num_tasks / num_test_tasks: game seeds of the train / held-out split
        max_turns: model moves before the game is cut short (truncated, reward 0)
        game_kwargs: keyword arguments for `ta.make` (the game's own options)
    """

    def __init__(self, spec: str, opponent: str = "random", num_tasks: int = 1000, num_test_tasks: int = 100,
                 max_turns: int = 12, game_kwargs: dict[str, Any] | None = None, split: str = "train") -> None:
        super().__init__(split=split)
        self.check_spec(spec)
        if num_tasks < 1 or num_test_tasks < 1 or max_turns < 1:
            raise ConfigError(f"textarena: num_tasks, num_test_tasks and max_turns must be >= 1, got "
                              f"{num_tasks}, {num_test_tasks}, {max_turns}")
        self.game, self.max_turns = spec, int(max_turns)
        self.players = num_players(spec)
        self.opponent_name = opponent
        self.opponent = _load_opponent(opponent)
        self.sizes = {"train": int(num_tasks), "test": int(num_test_tasks)}
        self.game_kwargs = dict(game_kwargs or {})
        self._ta = require("textarena", scheme="textarena")
        self._game: Any = None
        self._seen = ""  # the model's observation text so far (TextArena's observations accumulate)
        self._rng = random.Random(0)
        self.task: Task | None = None
        self.turn = 0
        self.done = True

    @classmethod
    def check_spec(cls, spec: str) -> None:
        """Before any work: the package imports and the game id is registered."""
        require("textarena", scheme="textarena")
        from textarena.envs.registration import ENV_REGISTRY  # the package imports lazily (an optional extra)

        check_known("game", spec, ENV_REGISTRY, scheme="textarena")

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        base = 0 if split == "train" else _TEST_SEED_OFFSET
        return [{"id": f"textarena/{self.game}/{split}/{base + i}", "game": self.game, "seed": base + i}
                for i in range(self.sizes[split])]

    def _observe(self) -> str:
        """What the game said to the model since it last looked."""
        _, text = self._game.get_observation()
        text = str(text)
        new = text[len(self._seen):] if text.startswith(self._seen) else text
        self._seen = text
        return new

    def _play_opponents(self) -> bool:
        """Let the other player move until it is the model's turn or the game ends; returns done."""
        for _ in range(1000):  # a game that never hands the turn back is a broken game
            pid, observation = self._game.get_observation()
            if pid == 0:
                return False
            done, _ = self._game.step(self.opponent(str(observation), self._rng))
            if done:
                return True
        raise RuntimeError(f"textarena game {self.game} never returned the turn to player 0")

    async def areset(self, task: Task) -> list[Message]:
        if not isinstance(task, dict) or "seed" not in task:
            raise ValueError(f"a textarena task must be a dict with a 'seed', got {task!r:.120}")
        self.task, self.turn, self.done, self._seen = task, 0, False, ""
        self._rng = random.Random(f"textarena/{self.game}/{task['seed']}")
        self._game = self._ta.make(self.game, **self.game_kwargs)
        self._game.reset(num_players=self.players, seed=int(task["seed"]))
        return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": self._observe().strip("\n")}]

    async def astep(self, action: str) -> StepResult:
        if self.task is None or self.done:
            raise EpisodeOverError(f"{type(self).__name__}: " + ("call reset() before step()" if self.task is None
                                   else "the episode is over; call reset() to start a new one"))
        if not isinstance(action, str):
            raise TypeError(f"an action must be the assistant's text (str), got {type(action).__name__}")
        self.turn += 1
        done, _ = self._game.step(action)
        if not done:
            done = self._play_opponents()
        info: dict[str, Any] = {"turn": self.turn, "step_rewards": {}}
        truncated = not done and self.turn >= self.max_turns
        text = self._own_echo_dropped(self._observe()) if not done else ""
        if done or truncated:
            self.done = True
            outcome, components, reason = self._outcome(finished=done)
            info.update(outcome_reward=outcome, reward_components=components)
            text = text if not done else f"The game is over: {reason or 'no reason given'}"
        return StepResult([{"role": "user", "content": text.strip("\n") or "(no message from the game)"}],
                          0.0, done, truncated, info)

    @staticmethod
    def _own_echo_dropped(text: str) -> str:
        """The game repeats the mover's own text ("[Player 0] ..." up to the game's answer): the
        model already has it as its own message."""
        stripped = text.lstrip("\n")
        if stripped.startswith("[Player") and "[GAME]" in stripped:
            return stripped[stripped.index("[GAME]"):]
        return text

    def _outcome(self, finished: bool) -> tuple[float, dict[str, float], str]:
        """(the model's reward, its components, the game's reason for ending)."""
        if not finished:
            return 0.0, {"reward": 0.0, "success": 0.0, "truncated": 1.0}, "the turn limit"
        rewards, game_info = self._game.close()
        reward = float((rewards or {}).get(0, 0.0))
        mine = (game_info or {}).get(0) or {}
        invalid = float(bool(mine.get("invalid_move", False)))
        components = {"reward": reward, "success": float(reward >= 1.0), "invalid_move": invalid}
        return reward, components, str(mine.get("reason", ""))

    async def afinalize(self) -> tuple[float, dict[str, float]] | None:
        if self.done or self.task is None:
            return None
        self.done = True
        outcome, components, _ = self._outcome(finished=False)
        return outcome, components

    async def aclose(self) -> None:
        self._game = None
        self.done = True
