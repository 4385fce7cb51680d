"""The configured env: its name checked before any work, then built with the run's settings.

    check_env_name(cfg.env.name)      # ConfigError / UserError in one line, nothing started
    env = make_env(cfg, sandbox_pool)

A registered name, a foreign env "SCHEME:SPEC" (agentrl/interop adapters) or an importable
module:Class. A ToolEnv gets the shared sandbox pool and the ToolEnv settings the config sets;
`summarize.enabled` wraps the env in SUPO's SummarizeEnv.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.config import Config, ConfigError
from agentrl.env import ToolEnv, env_class, list_envs, load_entry_point, make, registry, split_scheme
from agentrl.envs.summarize import SummarizeEnv
from agentrl.errors import UserError, where


def check_env_name(name: str) -> None:
    """Fail before any work if `name` is neither registered, nor a foreign env "SCHEME:SPEC" whose
    adapter accepts SPEC, nor an importable module:Class."""
    if name in registry():
        return
    if (found := split_scheme(name)) is not None:
        # An adapter may check its spec before any work (the package installed, the game known):
        # it raises UserError/ConfigError with the fix.
        check_spec = getattr(env_class(name), "check_spec", None)
        if check_spec is not None:
            check_spec(found[1])
        return
    if ":" not in name:
        raise ConfigError(f"unknown env '{name}'; registered: {', '.join(list_envs())} "
                          "(or pass package.module:Class)")
    try:
        load_entry_point(name)
    except Exception as e:
        if _names_nothing(name, e):  # a typo in --env: usage (exit 2)
            raise ConfigError(f"env '{name}' cannot be loaded: {e}") from None
        # The module is there but fails while importing (its own error or a missing dependency).
        raise UserError(f"env '{name}' does not import: {type(e.__cause__ or e).__name__}: {e}{where(e)}",
                        fix=f"fix the module or install what it imports; `agentrl env check {name}` "
                            "checks it") from e


def _names_nothing(name: str, exc: Exception) -> bool:
    """Whether loading `name` failed because the module, file or attribute it names does not exist."""
    module = name.rsplit(":", 1)[0]
    if isinstance(exc, ValueError) or "has no attribute" in str(exc):
        return True
    if module.endswith(".py"):
        return not Path(module).is_file()
    missing = getattr(exc.__cause__, "name", None)  # ModuleNotFoundError.name: which module was absent
    return isinstance(exc.__cause__, ModuleNotFoundError) and (module == missing or module.startswith(f"{missing}."))


def make_env(cfg: Config, pool: Any) -> Any:
    """Build the configured env. A ToolEnv gets the shared sandbox pool and the ToolEnv settings
    the config sets (None keeps the class's own; env.kwargs win); summarize wraps it in SUPO."""
    kwargs: dict[str, Any] = {}
    if _is_tool_env(cfg.env.name):
        settings = {"parser": cfg.env.tool_parser, "max_turns": cfg.env.max_turns,
                    "max_output_chars": cfg.env.max_output_chars, "tool_timeout_s": cfg.env.tool_timeout_s,
                    "step_reward_alpha": cfg.reward.step_reward_alpha, "sandbox_pool": pool,
                    "mcp_servers": cfg.env.mcp_servers or None}
        kwargs = {k: v for k, v in settings.items() if v is not None}
    env = make(cfg.env.name, **{**kwargs, **cfg.env.kwargs})
    if cfg.summarize.enabled:
        s = cfg.summarize
        env = SummarizeEnv(env, working_context=s.working_context, ratio=s.ratio,
                           max_summaries=s.max_summaries, max_steps=s.max_steps)
    return env


def _is_tool_env(name: str) -> bool:
    cls = env_class(name)
    return isinstance(cls, type) and issubclass(cls, ToolEnv)
