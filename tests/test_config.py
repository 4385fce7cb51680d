"""Config: YAML + dotted overrides, strict keys and types, clear messages."""

import re
from pathlib import Path

import pytest
import yaml

from agentrl.config import MOVED, ConfigError, dump_config, load_config, parse_override


def test_defaults_and_env_file_and_overrides() -> None:
    cfg = load_config("code", overrides=["trainer.lr=1e-6", "trainer.trm.mode=both", "reward.gate=null",
                                         "trainer.betas=[0.9, 0.99]"])
    assert cfg.env.name == "code"
    assert cfg.trainer.lr == pytest.approx(1e-6)
    assert cfg.trainer.trm.mode == "both"
    assert cfg.reward.gate is None
    assert cfg.trainer.betas == (0.9, 0.99)


def test_a_foreign_env_family_has_its_own_defaults_and_a_users_module_does_not() -> None:
    games = load_config(env="textarena:GuessTheNumber-v0")
    assert games.trainer.warm_start.source == "rft" and games.sampling.max_tokens == 16  # configs/schemes/
    assert load_config(env="reasoning_gym:chain_sum").sampling.max_tokens == 64
    # overrides still win, and "module:Class" (no scheme file of its name) keeps base.yaml's values
    assert load_config(env="textarena:X", overrides=["sampling.max_tokens=9"]).sampling.max_tokens == 9
    assert load_config(env="my_env:AddEnv").sampling.max_tokens == load_config().sampling.max_tokens


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


BASE = Path(__file__).resolve().parent.parent / "configs" / "base.yaml"
CONFIGURATION_MD = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_base_yaml_is_the_user_surface_each_key_with_its_meaning() -> None:
    from agentrl.config import flatten

    surface = flatten(yaml.safe_load(BASE.read_text()))
    assert 20 <= len(surface) <= 40, f"{len(surface)} user keys: the surface a user reads must stay <= 40"
    for line in BASE.read_text().splitlines():
        if ":" in line and not line.lstrip().startswith("#") and not line.rstrip().endswith(":"):
            assert "#" in line, f"configs/base.yaml: '{line.strip()}' has no one-line meaning"
    resolved = flatten(load_config().to_dict())
    for key, value in surface.items():
        assert resolved[key] == value, key  # base.yaml's values are the defaults a run gets


def test_every_other_key_is_listed_in_docs_configuration() -> None:
    """The advanced keys are not in base.yaml: docs/configuration.md lists each with its meaning."""
    from agentrl.config import flatten

    surface = set(flatten(yaml.safe_load(BASE.read_text())))
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", CONFIGURATION_MD.read_text(), flags=re.M))
    advanced = set(flatten(load_config().to_dict())) - surface
    assert not advanced - documented, f"advanced keys missing from docs/configuration.md: {sorted(advanced - documented)}"
    unknown = documented - advanced - surface - set(MOVED)
    assert not unknown, f"docs/configuration.md lists keys that do not exist: {sorted(unknown)}"


@pytest.mark.parametrize(("override", "new_key"), [("trainer.seed=3", "run.seed"),
                                                   ("model.dtype=bfloat16", "engine.dtype")])
def test_a_moved_key_names_its_new_place(override: str, new_key: str) -> None:
    with pytest.raises(ConfigError, match=f"has moved: use {new_key}"):
        load_config("code", overrides=[override])


def test_a_retired_key_loads_with_one_line_saying_it_is_ignored(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run directory written by an older version still resumes: its retired keys are dropped."""
    old = tmp_path / "config.yaml"
    old.write_text(dump_config(load_config("code")))
    data = yaml.safe_load(old.read_text())
    data["laminar"]["heartbeat_s"] = 2.0
    old.write_text(yaml.safe_dump(data))
    cfg = load_config(config_file=old)
    assert cfg.env.name == "code" and not hasattr(cfg.laminar, "heartbeat_s")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agentrl: config key 'laminar.heartbeat_s' is ignored: ")


def test_one_seed_reaches_the_learner() -> None:
    cfg = load_config("code", overrides=["run.seed=7"])
    assert cfg.trainer.seed == 7  # LoRA init and mini-batch order follow run.seed
    assert "seed" not in cfg.to_dict()["trainer"]  # not a key of its own: a dumped config reloads
