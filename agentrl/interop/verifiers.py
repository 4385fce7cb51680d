"""`verifiers:MODULE`: a verifiers (v1) environment trained through the policy endpoint (issue 54).

    agentrl train --env verifiers:my_env        # my_env: an importable verifiers taskset package

The module is what verifiers itself loads for `--env.taskset.id MODULE`: it exports a `Taskset`
(and, optionally, a `Harness` and an `Env`). agentrl builds the environment with verifiers' own
loader and runs each episode with verifiers' `Env.run_episode`, so its harness (the program that
calls the model), interception and scoring run as they do under verifiers; the model it calls is
the episode's base URL on agentrl's endpoint. The episode's reward is the sum of its traces'
weighted rubric rewards (`Trace.reward`); an episode verifiers records errors for ends `error`.

Tasks are the taskset's; splits as the taskset declares them: a taskset config with a `split` (or
`dataset_split`) field is loaded once per agentrl split with that field set, any other gives
the same tasks to every split. The single-agent seat runs in verifiers' local `subprocess` runtime
(its default is Prime's remote sandboxes); verifiers' built-in harnesses install their programs
with `uv` (network), so offline the environment brings its own harness.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentrl.agent_env import AgentEnv
from agentrl.config import ConfigError
from agentrl.errors import UserError
from agentrl.types import Task

SPLIT_FIELDS = ("split", "dataset_split")


def _vf() -> Any:
    try:
        return importlib.import_module("verifiers.v1")
    except ImportError as e:
        raise UserError(f"verifiers is not installed ({e})", fix="pip install 'agentrl[verifiers]'") from None


class VerifiersEnv(AgentEnv):
    """A verifiers environment as an agentrl `AgentEnv` (see the module docstring)."""

    @classmethod
    def check_spec(cls, spec: str) -> None:
        """Before any work: verifiers installed and MODULE a taskset it can load."""
        if not spec:
            raise ConfigError("verifiers: name the environment's module, e.g. --env verifiers:my_env")
        _vf()
        from verifiers.v1.utils.loaders import taskset_class  # the package checked just above

        try:
            taskset_class(spec)
        except Exception as e:
            raise ConfigError(f"verifiers:{spec} is not a verifiers taskset: {type(e).__name__}: {e}") from None

    def __init__(self, spec: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check_spec(spec)
        from verifiers.v1.utils.loaders import load_environment, resolve_env_config  # the optional extra

        self.spec = spec
        self.name = f"verifiers:{spec}"
        config: dict[str, Any] = {"taskset": {"id": spec}}
        if "agent" in type(resolve_env_config(config)).model_fields:  # the single-agent seat: run it on this machine
            config["agent"] = {"runtime": {"type": "subprocess"}}
        self.vf_env = load_environment(resolve_env_config(config))
        self._tasks: dict[str, list[Any]] = {}

    def _split_tasks(self, split: str) -> list[Any]:
        if split not in self._tasks:
            taskset = self.vf_env.taskset
            field = next((f for f in SPLIT_FIELDS if f in type(taskset.config).model_fields), None)
            if field is not None and getattr(taskset.config, field) != split:
                taskset = type(taskset)(taskset.config.model_copy(update={field: split}))
            self._tasks[split] = list(taskset)
        return self._tasks[split]

    def tasks(self, split: str = "train") -> list[Task]:
        return [{"id": f"{split}-{i}-{str(t.key)[:12]}", "split": split, "index": i}
                for i, t in enumerate(self._split_tasks(split))]

    async def run(self, task: Task, client: Any) -> float:
        vf = _vf()
        vf_task = self._split_tasks(task["split"])[task["index"]]
        # The episode's base URL names it (its key is in the path): no API key to pass along.
        ctx = vf.ModelContext(model="policy", client=vf.EvalClientConfig(base_url=str(client.base_url),
                                                                         api_key_var="AGENTRL_NO_API_KEY"))
        episode = await self.vf_env.run_episode(vf_task, ctx)
        errors = list(episode.errors) + [e for t in episode.traces for e in getattr(t, "errors", [])]
        if errors:
            first = errors[0]
            raise RuntimeError(f"verifiers episode failed: {first.type}: {first.message}")
        return float(sum(t.reward for t in episode.traces))
