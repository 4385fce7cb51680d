"""Config: YAML + dotted overrides, strict keys and types, clear messages."""

from pathlib import Path

import pytest

from agentrl.config import ConfigError, dump_config, load_config, parse_override


def test_defaults_and_env_file_and_overrides() -> None:
    cfg = load_config("code", overrides=["trainer.lr=1e-6", "trainer.trm.mode=both", "reward.gate=null",
                                         "trainer.betas=[0.9, 0.99]"])
    assert cfg.env.name == "code"
    assert cfg.trainer.lr == pytest.approx(1e-6)
    assert cfg.trainer.trm.mode == "both"
    assert cfg.reward.gate is None
    assert cfg.trainer.betas == (0.9, 0.99)


def test_sandbox_pool_defaults_to_one_sandbox_per_trajectory_in_flight() -> None:
    # fewer would make the rest wait for a sandbox, on their wall-clock budget (half the code
    # trajectories were aborted at 300 s with pool_size 4 under concurrency 8)
    for env in ("code", "swe"):
        cfg = load_config(env)
        assert cfg.sandbox.pool_size == cfg.rollout.concurrency
    assert load_config("code", overrides=["rollout.concurrency=3"]).sandbox.pool_size == 3
    assert load_config("code", overrides=["sandbox.pool_size=2"]).sandbox.pool_size == 2  # a user's choice stays
    wide_eval = load_config("code", overrides=["rollout.concurrency=3", "eval.concurrency=5"])
    assert wide_eval.sandbox.pool_size == 5  # the held-out evaluation's episodes get a sandbox each too
    assert load_config("code", overrides=["rollout.concurrency=3"]).eval.concurrency == 3


def test_algorithm_defaults_match_algorithms_md() -> None:
    cfg = load_config()
    assert (cfg.trainer.clip_low, cfg.trainer.clip_high) == (0.2, 0.28)  # DAPO §5.3
    assert (cfg.trainer.trm.delta, cfg.trainer.trm.delta_avg) == (0.1, 0.002)  # TRM §2.5 combined
    assert cfg.trainer.trm.normalize == "total"  # §2.4
    assert cfg.laminar.repack_interval_s == 5.0 and cfg.laminar.max_staleness is None  # §1.7
    assert cfg.summarize.ratio == 0.95  # SUPO §4.1


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.lr=abc", "'trainer.lr': got 'abc', expected float"),
    ("trainer.lrr=1", "unknown config key 'trainer.lrr'; allowed keys in trainer: steps"),
    ("trainer.loss=foo", "expected one of 'ppo', 'gspo', 'reinforce'"),
    ("trainer.steps=1.5", "'trainer.steps': got 1.5, expected int"),
    ("nosuch.key=1", "unknown config key 'nosuch'"),
    ("trainer.lr=-1", "trainer.lr must be > 0"),
    ("sandbox.pool_size=0", "sandbox.pool_size must be >= 1"),
    ("eval.concurrency=0", "eval.concurrency must be >= 1"),
    ("engine.speculative_tokens=-1", "engine.speculative_tokens must be >= 0"),
    ("trainer.warm_start.mmap_threshold_mb=0", "trainer.warm_start.mmap_threshold_mb must be > 0"),
    ("trainer.mmap_threshold_mb=-1", "trainer.mmap_threshold_mb must be > 0 (MiB) or null"),
    ("trainer.warm_start.replay_coef=-0.1", "trainer.warm_start.replay_coef must be >= 0"),
    ("trainer", "not of the form key.path=value"),
])
def test_bad_values_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("code", overrides=[override])
    assert message in str(err.value)


@pytest.mark.parametrize("override, message", [
    ("trainer.warm_start.enabled=false", "set trainer.warm_start.enabled=true or replay_coef=0"),
    ("trainer.num_learners=2", "set trainer.num_learners=1 or replay_coef=0"),
])
def test_replay_needs_a_warm_start_and_one_learner(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("code", overrides=["trainer.warm_start.replay_coef=0.1", override])
    assert message in str(err.value)
    assert load_config("code", overrides=["trainer.warm_start.replay_coef=0.1"]).trainer.warm_start.replay_rows == 4


def test_config_file_layer_and_dump_round_trip(tmp_path: Path) -> None:
    f = tmp_path / "my.yaml"
    f.write_text("trainer:\n  steps: 3\n  trm: {mode: max, delta: 0.05}\n")
    cfg = load_config("search", config_file=f)
    assert cfg.trainer.steps == 3 and cfg.trainer.trm.delta == 0.05
    again = tmp_path / "dump.yaml"
    again.write_text(dump_config(cfg))
    assert load_config(config_file=again) == cfg


def test_bad_file() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(config_file="/nonexistent.yaml")


def test_parse_override_nesting() -> None:
    assert parse_override("a.b.c=3") == {"a": {"b": {"c": 3}}}
    assert parse_override("a=x=y") == {"a": "x=y"}
