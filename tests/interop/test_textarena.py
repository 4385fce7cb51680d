"""`--env textarena:GAME_ID` (issue 53) against the real TextArena package: a single-player game
and a two-player game against the built-in opponents, the env check and a two-step training run
through the CLI, and one line for a missing package, an unknown game or an unknown opponent."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import pytest

import agentrl
from agentrl.interop.textarena import listed_moves
from tests.support.interop import TINY, jsonl, one_error_line, run_cli, without_packages

pytest.importorskip("textarena")  # CI installs .[interop]; AGENTRL_REQUIRE_ALL fails the skip


def test_listed_moves_reads_the_games_move_list() -> None:
    text = ("[GAME] Current Board:\n X | 1 | 2 \nAvailable Moves: '[1]', '[2]', '[8]'\n[Player 1] [0]\n"
            "[GAME] Player 1 placed X.\nAvailable Moves: '[1]', '[2]'")
    assert listed_moves(text) == ["[1]", "[2]"]  # the last list only, no speaker tags
    assert listed_moves("[GAME] guess a number, e.g. [5]") == ["[5]"]


def test_a_single_player_game_is_won_by_playing_it() -> None:
    env = agentrl.make("textarena:GuessTheNumber-v0", num_tasks=3, num_test_tasks=2)
    try:
        assert {t["seed"] for t in env.tasks("train")}.isdisjoint(t["seed"] for t in env.tasks("test"))
        messages, _ = env.reset(options={"task": env.tasks("train")[0]})
        assert "Guess The Number" in messages[1]["content"]
        low, high, steps = 1, 20, 0
        while True:  # binary search on the game's own hints
            guess = (low + high) // 2
            observation, reward, terminated, truncated, info = env.step(f"My guess: [{guess}]")
            steps += 1
            text = observation[0]["content"]
            if terminated or truncated:
                break
            assert not text.startswith("[Player")  # the echo of the model's own move is dropped
            low, high = (guess + 1, high) if "higher" in text else (low, guess - 1)
        assert terminated and reward == 1.0 and steps <= 5
        assert info["reward_components"]["success"] == 1.0 and "game is over" in text
    finally:
        env.close()


def test_a_two_player_game_plays_the_opponent_and_scores_the_model() -> None:
    env = agentrl.make("textarena:TicTacToe-v0", opponent="first", num_tasks=2, num_test_tasks=2)
    try:
        env.reset(seed=0)
        # "first" always takes the lowest free cell: 0, 1, 2 ... so the model's diagonal 4, 8 wins
        # once the opponent's row is blocked at 2.
        outcomes = [env.step(move) for move in ["[4]", "[2]", "[6]"]]
        observation, reward, terminated, _, info = outcomes[-1]
        assert "[Player 1] [0]" in outcomes[0][0][0]["content"]  # the opponent moved after the model
        assert terminated and reward == 1.0, observation
        env.reset(seed=0)
        observation, _, terminated, _, _ = env.step("[9]")  # TextArena forgives one invalid move ...
        assert not terminated and "invalid move" in observation[0]["content"]
        observation, reward, terminated, _, info = env.step("[10]")  # ... and the second one loses
        assert terminated and reward == -1.0 and info["reward_components"]["invalid_move"] == 1.0
    finally:
        env.close()


def test_env_check_passes_for_a_one_and_a_two_player_game() -> None:
    for game in ["GuessTheNumber-v0", "TicTacToe-v0"]:
        out = run_cli("env", "check", f"textarena:{game}")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "OK:" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
def test_train_two_steps_through_the_cli(tmp_path: Path) -> None:
    out = run_cli("train", "--env", "textarena:TicTacToe-v0", "trainer.steps=2", f"run.dir={tmp_path}",
                  "run.name=ttt", "env.kwargs.opponent=random", "env.kwargs.max_turns=2", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "ttt"
    rows = jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[-1]["policy_tokens"] > 0
    trajs = jsonl(run / "trajectories.jsonl")
    assert trajs and all(t["task_id"].startswith("textarena/TicTacToe-v0/train/") for t in trajs)
    assert (run / "report" / "index.html").is_file()


def test_unknown_game_names_close_matches_exit_2(tmp_path: Path) -> None:
    out = run_cli("train", "--env", "textarena:TicTacToe-v9", f"run.dir={tmp_path}")
    assert out.returncode == 2
    line = one_error_line(out)
    assert "unknown game 'TicTacToe-v9'" in line and "TicTacToe-v0" in line


def test_unknown_opponent_names_the_built_in_ones(tmp_path: Path) -> None:
    with pytest.raises(agentrl.config.ConfigError, match="unknown opponent 'randm'; did you mean random"):
        agentrl.make("textarena:TicTacToe-v0", opponent="randm")


def test_missing_package_names_the_extra_exit_1(tmp_path: Path) -> None:
    out = run_cli("train", "--env", "textarena:TicTacToe-v0", f"run.dir={tmp_path / 'runs'}",
                  env=without_packages(tmp_path, "textarena"))
    assert out.returncode == 1
    line = one_error_line(out)
    assert "textarena package" in line and "pip install 'agentrl[textarena]'" in line
    assert not (tmp_path / "runs").exists()


def test_gymnasium_make_builds_the_adapted_game() -> None:
    env = gymnasium.make("agentrl/env-v0", name="textarena:GuessTheNumber-v0", num_tasks=2, num_test_tasks=1)
    try:
        messages, info = env.reset(seed=7)
        assert info["task_id"].startswith("textarena/GuessTheNumber-v0/train/")
        assert messages[0]["role"] == "system" and "[GAME]" in messages[1]["content"]
        assert env.step("[10]")[0][0]["role"] == "user"
    finally:
        env.close()
