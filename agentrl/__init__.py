"""agentrl: a gym and trainer for RL of LLM agents acting over many turns with tools in sandboxes.

    import agentrl
    env = agentrl.make("code")                   # or "package.module:Class"
    agentrl.register("my-env", MyEnv)            # also gymnasium.make("agentrl/my-env-v0")

Importing agentrl registers the built-in envs (with gymnasium too) but loads no model code:
torch and the envs' own modules are imported only when used.
"""

import importlib
from typing import Any

from agentrl.agent_env import AgentEnv, EnvAgent
from agentrl.env import Env, EnvError, EpisodeOverError, ToolEnv, list_envs, make, register, registry

__version__ = "0.1.0"


def _episode_runner(rollout: Any) -> Any:
    from agentrl.endpoint.agent import AgentRunner  # the serve extra (fastapi, uvicorn, openai)

    return AgentRunner(rollout)


def _program_facade(env: AgentEnv) -> Any:
    from agentrl.endpoint.agent import ProgramFacade  # the serve extra (fastapi, uvicorn, openai)

    return ProgramFacade(env)


# An agent program runs against the policy endpoint, layers above AgentEnv and the rollout engine:
# the package root, which may import any layer, hands them what drives it (agentrl/agent_env.py).
AgentEnv.runner_factory = _episode_runner
AgentEnv.facade_factory = _program_facade

_LAZY = {
    "tool": "agentrl.tools",
    "Tool": "agentrl.tools",
    "ToolResult": "agentrl.tools",
    "check_env": "agentrl.envcheck",
    "get_parser": "agentrl.parsing",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentrl' has no attribute '{name}'")


__all__ = ["AgentEnv", "Env", "EnvAgent", "EnvError", "EpisodeOverError", "Tool", "ToolEnv", "ToolResult", "check_env", "get_parser",
           "list_envs", "make", "register", "registry", "tool"]
