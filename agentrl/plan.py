"""What `agentrl train`, `sft`, `eval` and `serve` resolve and check before any work: the config,
the env's name, the warm start's data, the run directory and its checkpoint. Light on purpose: a
mistake in any of them is one line within a second or two, before torch, transformers or the
training loop is imported.

    plan = prepare_run(env="swe", overrides=["trainer.steps=4"])   # validates; starts nothing
    agentrl.run.train(plan)                                         # run dir, model, pools, loop
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl.checkpoint_files import latest_checkpoint
from agentrl.config import Config, ConfigError, load_config
from agentrl.demos import check_warm_start
from agentrl.env_builder import check_env_name
from agentrl.guidance import check_demo_guidance


@dataclass
class RunPlan:
    config: Config
    run_dir: Path
    resume_from: Path | None = None  # a checkpoint file


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "run"


def prepare_run(env: str | None, config_file: str | None = None, overrides: list[str] | None = None,
                resume: str | None = None) -> RunPlan:
    """Resolve and validate everything a run needs; raises ConfigError before any work."""
    overrides = list(overrides or [])
    if resume:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"--resume {resume}: no config.yaml there; is it an agentrl run directory?")
        cfg = load_config(config_file=run_dir / "config.yaml", overrides=overrides)
        if env is not None and env != cfg.env.name:
            raise ConfigError(f"--env {env} differs from the resumed run's env '{cfg.env.name}'")
        ckpt = latest_checkpoint(run_dir / "checkpoints")
        if ckpt is None:
            raise ConfigError(f"--resume {resume}: no checkpoint in {run_dir / 'checkpoints'}")
        check_env_name(cfg.env.name)
        return RunPlan(cfg, run_dir, ckpt)
    if not env:
        raise ConfigError("--env is required (e.g. --env code); `agentrl envs` lists them")
    cfg = load_config(env=env, config_file=config_file, overrides=overrides)
    check_env_name(cfg.env.name)
    check_warm_start(cfg)  # a data file that exists, or an env with demonstrations
    check_demo_guidance(cfg)
    name = cfg.run.name or "-".join([_slug(cfg.env.name.split(":")[-1]), _slug(Path(cfg.model.name).name),
                                     time.strftime("%Y%m%d-%H%M%S")])
    return RunPlan(cfg, Path(cfg.run.dir) / name)


def prepare_sft(env: str | None, config_file: str | None = None, overrides: list[str] | None = None,
                data: str | None = None) -> RunPlan:
    """A RunPlan for an SFT-only run (`runs/sft-<env>-<model>-<time>/`); ConfigError before any work."""
    overrides = [*(overrides or []), "trainer.warm_start.enabled=true"]
    if data is not None:
        overrides.append(f"trainer.warm_start.data={data}")
    plan = prepare_run(env, config_file, overrides)
    if plan.config.run.name is None:
        plan.run_dir = plan.run_dir.with_name(f"sft-{plan.run_dir.name}")
    return plan


@dataclass
class ModelPlan:
    """What `agentrl eval` and `agentrl serve` run: a config, and the checkpoint whose weights
    replace the model's when the target was a run directory."""

    config: Config
    checkpoint: Path | None


def resolve_target(target: str | None, env: str | None, config_file: str | None = None,
                   overrides: list[str] | None = None) -> ModelPlan:
    """A model name or path, or a run directory whose latest checkpoint is used (its model, and a
    LoRA run's adapter shape, from the run's own config.yaml)."""
    overrides = list(overrides or [])
    checkpoint = None
    if target and (Path(target) / "config.yaml").is_file():
        run_cfg = load_config(config_file=Path(target) / "config.yaml")
        lora = run_cfg.trainer.lora  # a LoRA checkpoint holds the adapter: merged into the base when loaded
        overrides[:0] = [f"model.name={run_cfg.model.name}", f"trainer.lora.rank={lora.rank}",
                         f"trainer.lora.alpha={lora.alpha}", f"trainer.lora.targets=[{','.join(lora.targets)}]"]
        checkpoint = latest_checkpoint(Path(target) / "checkpoints")
        if checkpoint is None:
            raise ConfigError(f"run directory {target} has no checkpoint in checkpoints/ yet; pass a run "
                              "that has saved one, or a model name")
    elif target:
        overrides.insert(0, f"model.name={target}")
    return ModelPlan(load_config(env=env, config_file=config_file, overrides=overrides), checkpoint)


def prepare_eval(env: str, model: str | None, n: int, config_file: str | None = None,
                 overrides: list[str] | None = None) -> ModelPlan:
    if n < 1:
        raise ConfigError(f"--n must be >= 1, got {n}")
    plan = resolve_target(model, env, config_file, overrides)
    check_env_name(plan.config.env.name)
    return plan
