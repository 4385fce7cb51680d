"""The `swe` environment: fix a bug in a real repository with bash and an editor (architecture.md §3).

Per episode the task's buggy repository is put at the sandbox work dir and committed as git's
base. The agent explores and edits with `bash` and `str_replace_editor` and ends with `submit`.
The reward takes the agent's work as `git diff` against the base and grades it in a FRESH
sandbox (grade.py): test files restored, FAIL_TO_PASS + PASS_TO_PASS run.

Outcome levels (G-RA, algorithms.md §3.2; configurable): no submit −1.0, empty patch −0.5, patch
fails the tests 0.0, patch passes +1.0. Immediate signals per step, in `info["step_rewards"]`,
each worth `step_alpha` (default 0.1 / max_turns, so their sum cannot bridge the outcome gap):
`valid_call` (every call well-formed, known tool, valid arguments), `edit_applied` (an editor
edit succeeded), `tests_run` (a bash call ran pytest and did not time out). The trainer gates them
by the outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import inspect
import json
from dataclasses import replace
from typing import Any

from agentrl.config import SandboxConfig
from agentrl.env import CallOutcome, ToolEnv
from agentrl.errors import UserError
from agentrl.parsing import ParseResult
from agentrl.sandboxes import Limits, LocalSandbox, ProcessSandbox, SandboxPool, make_pool, make_sandbox
from agentrl.tools import bash, state_get, str_replace_editor, submit
from agentrl.types import Task

from . import runtime as rt
from .datasets import requirements
from .demos import swe_demonstration
from .grade import GIT, ValidationCache, grade, hunk_texts, prepare_repo, split_patch, validate_tasks
from .images import ensure_task_image
from .schema import resolve_tasks, task_split

OUTCOME_REWARDS = {"no_submit": -1.0, "empty": -0.5, "fail": 0.0, "pass": 1.0}
SPLITS = ("train", "dev", "test", "all")
EDIT_COMMANDS = ("create", "str_replace", "insert")
TEST_RUNNERS = ("pytest", "unittest", "tox")

_SYSTEM = """You are a software engineer fixing a bug in a Python repository.
The repository is your current directory. Explore it with bash (ls, grep, cat), read and edit files
with str_replace_editor, run the tests with `python3 -m pytest -q <test file>`. Change the library
code, not the tests. When the failing tests pass, call submit."""


class SWEEnv(ToolEnv):
    """SWE-bench-style bug fixing, graded by the task's tests in a fresh sandbox.

    Args (also `env.kwargs` in configs/swe.yaml):
        task_file: a task file (.jsonl[.gz]/.json/.parquet; agentrl's, SWE-bench, SWE-Gym or SWE-smith
            records) or a shipped set: core (default, 16 tasks), suite (many packages), all
        validate: check gold patch = pass and empty patch = fail for every task before use
            (cached per task and backend), and drop the tasks that fail with the reason logged
        validation_cache: path of the validation cache (default ~/.cache/agentrl/swe/validation.json)
        outcome_rewards: override any of no_submit / empty / fail / pass
        step_alpha: value of each G-RA step signal (default 0.1 / max_turns)
        test_timeout_s: wall clock for grading's test run
    and every `ToolEnv` option (sandbox_pool, sandbox_config, max_turns, parser, ...).
    """

    tools = (bash, str_replace_editor, submit)
    max_turns = 10
    needs_sandbox = True
    tool_timeout_s = 60.0
    max_output_chars = 4000

    def __init__(self, task_file: str | None = None, validate: bool = True, validation_cache: str | None = None,
                 outcome_rewards: dict[str, float] | None = None, step_alpha: float | None = None,
                 test_timeout_s: float = 120.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        unknown = set(outcome_rewards or {}) - set(OUTCOME_REWARDS)
        if unknown:
            raise ValueError(f"outcome_rewards has unknown level(s) {sorted(unknown)}; "
                             f"levels: {list(OUTCOME_REWARDS)}")
        self.outcome_rewards = {**OUTCOME_REWARDS, **(outcome_rewards or {})}
        levels = [self.outcome_rewards[k] for k in OUTCOME_REWARDS]
        if levels != sorted(levels):
            raise ValueError(f"outcome_rewards must increase no_submit <= empty <= fail <= pass, got {levels}")
        self.step_alpha = 0.1 / self.max_turns if step_alpha is None else float(step_alpha)
        if not test_timeout_s > 0:
            raise ValueError(f"test_timeout_s must be > 0, got {test_timeout_s!r}")
        self.test_timeout_s = float(test_timeout_s)
        self.task_file = task_file
        self.validate = validate
        self.validation_cache = validation_cache
        problems: list[str] = []  # bad records: one line each, the other tasks still load
        self._all: list[Task] = resolve_tasks(task_file, problems)
        for line in problems:
            print(f"[agentrl] swe: skipped {line}", flush=True)
        if not self._all:
            raise ValueError(f"no SWE tasks found in {task_file or 'envs/swe/data/'}")
        self._valid: list[Task] | None = None
        self.rejected: list[tuple[str, str]] = []
        self._pools: dict[str, Any] = {}
        self._router: _TaskPools | None = None
        self._template_cache: tuple[type, Any] | bool | None = False  # False: not looked up yet

    # -- tasks ------------------------------------------------------------------------------------

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
        if self._valid is None:
            self._valid = self._validated(self._all) if self.validate else list(self._all)
            for instance_id, reason in self.rejected:
                print(f"[agentrl] swe: task {instance_id} rejected: {_one_line(reason)}", flush=True)
            if not self._valid:
                first = "; ".join(f"{tid}: {why}" for tid, why in self.rejected[:2])
                raise UserError(f"all {len(self.rejected)} SWE tasks were rejected by validation ({first})",
                                fix="`agentrl swe validate [TASK_FILE]` shows why each task fails")
        return [t for t in self._valid if split == "all" or task_split(t) == split]

    def _validated(self, tasks: list[Task]) -> list[Task]:
        """Run validation on a private loop in a worker thread (tasks() is sync and may be
        called from inside a running event loop)."""
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, self._validate_all(tasks)).result()

    async def _validate_all(self, tasks: list[Task]) -> list[Task]:
        cache = ValidationCache(self.validation_cache)
        valid: list[Task] = []
        local = await self._template() is not None
        unrunnable = {t["instance_id"]: why for t in tasks if (why := requirements(t, "local" if local else "docker"))}
        self.rejected += sorted(unrunnable.items())
        tasks = [t for t in tasks if t["instance_id"] not in unrunnable]
        if local:
            await asyncio.to_thread(self.prepare_runtimes, tasks)
        for key in sorted({self._sandbox_key(t) for t in tasks}):
            group = [t for t in tasks if self._sandbox_key(t) == key]
            try:
                sandbox = await self._new_sandbox(group[0])
            except RuntimeError as e:  # e.g. a docker image that cannot be built
                self.rejected += [(t["instance_id"], str(e)) for t in group]
                continue
            try:
                ok, bad = await validate_tasks(group, [sandbox], type(sandbox).__name__, cache)
            finally:
                await sandbox.close()
            valid += ok
            self.rejected += bad
        return sorted(valid, key=lambda t: t["instance_id"])

    def prepare_runtimes(self, tasks: list[Task], log: Any = print) -> None:
        """Build the task runtimes (runtime.py) that are missing, saying so: on a fresh machine
        this is what `train --env swe` does before the first rollout."""
        missing = [s for s in rt.task_specs(tasks) if rt.find_runtime(s) is None]
        if not missing:
            return
        log(f"[agentrl] swe: building {len(missing)} task runtime(s) (pytest + each package's dependencies; "
            f"once, cached in {rt.runtime_root()})", flush=True)
        report = rt.ensure_runtimes(tasks)
        failed = "; ".join(f"{k}: {v}" for k, v in report.failed.items())
        log(f"[agentrl] swe: {len(report.built)} task runtime(s) built in {report.seconds:.0f}s"
            + (f"; failed (their tasks are rejected): {failed}" if failed else ""), flush=True)

    # -- sandboxes: local backends mount the task's runtime; docker uses the task's image ---------

    async def _template(self) -> tuple[type, Any] | None:
        """(class, limits) of the bubblewrap/process sandboxes this env makes with a task runtime
        mounted: those of the shared pool's sandboxes, else of `sandbox_config`. None on docker."""
        if self._template_cache is False:
            factory = getattr(self.sandbox_pool, "factory", None)
            if callable(factory):
                probe = factory()
                probe = await probe if inspect.isawaitable(probe) else probe
                cls, limits = type(probe), getattr(probe, "limits", None)
                await probe.close()  # never started: only its temp dir to remove
            else:
                cfg = self._sandbox_cfg()
                cls = {"local": LocalSandbox, "process": ProcessSandbox}.get(cfg.backend, type(None))
                limits = Limits.from_config(cfg)
            self._template_cache = (cls, limits) if issubclass(cls, LocalSandbox) and limits else None
        return self._template_cache or None

    def _sandbox_key(self, task: Task) -> str:
        """Tasks with the same key can share a sandbox: same image (docker), same runtime (local)."""
        return f"{self._image(task)}|{rt.spec_of(task).name}"


    def _sandbox_cfg(self) -> Any:
        return self.sandbox_config or SandboxConfig()

    def _image(self, task: Task) -> str:
        cfg = self._sandbox_cfg()
        return (task.get("image") or cfg.image) if cfg.backend == "docker" else cfg.image

    async def get_pool(self) -> Any:
        """A shared `sandbox_pool` if one was given (the task runtime is then uploaded into its
        sandboxes), else this env's pools, one per task image (docker) or runtime (local), picked by
        the current task when a sandbox is taken."""
        if self.sandbox_pool is not None:
            return self.sandbox_pool
        if self._router is None:
            self._router = _TaskPools(self)
        return self._router

    async def _pool_for(self, task: Task) -> Any:
        key = self._sandbox_key(task)
        if key not in self._pools:
            template = await self._template()
            if template is not None:
                cls, limits = template
                runtime = await asyncio.to_thread(rt.task_runtime, task, print)
                self._pools[key] = SandboxPool(lambda: rt.sandbox_with_runtime(cls, limits, runtime), 1,
                                               name=f"swe-{_short_hash(key)}")
            else:
                if self._sandbox_cfg().backend == "docker":
                    await asyncio.to_thread(ensure_task_image, task, self._sandbox_cfg().image)
                cfg = replace(self._sandbox_cfg(), image=self._image(task))
                self._pools[key] = make_pool(cfg, size=1, name=f"swe-{_short_hash(key)}")
        return self._pools[key]

    async def _new_sandbox(self, task: Task) -> Any:
        """A sandbox the agent never touched (grading, validation): from the shared pool's
        factory when the env was given a pool, else of the configured backend and the task's image
        (built first if a docker engine lacks it)."""
        template = await self._template()
        if template is not None:  # bubblewrap/process: a fresh sandbox with the task runtime mounted
            cls, limits = template
            runtime = await asyncio.to_thread(rt.task_runtime, task, print)
            limits = replace(limits, timeout_s=max(limits.timeout_s, self.test_timeout_s))
            return rt.sandbox_with_runtime(cls, limits, runtime)
        factory = getattr(self.sandbox_pool, "factory", None)
        if callable(factory):
            return factory()
        cfg = self._sandbox_cfg()
        if cfg.backend == "docker":
            await asyncio.to_thread(ensure_task_image, task, cfg.image)
        return make_sandbox(replace(cfg, image=self._image(task), timeout_s=max(cfg.timeout_s, self.test_timeout_s)))

    async def aclose(self) -> None:
        await super().aclose()
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            await pool.close()

    # -- the episode ------------------------------------------------------------------------------

    async def setup(self, task: Task) -> None:
        await prepare_repo(self.sandbox, task, commit=True)

    def system_prompt(self, task: Task) -> str:
        return _SYSTEM

    def user_prompt(self, task: Task) -> str:
        return f"Repository: {task.get('repo') or task['instance_id']}\n\n{task['problem_statement']}"

    def step_rewards(self, parsed: ParseResult, outcomes: list[CallOutcome]) -> dict[str, float]:
        """G-RA immediate signals of one turn (algorithms.md §3.2), each worth `step_alpha`."""
        valid = bool(outcomes) and not parsed.errors and all(o.valid for o in outcomes)
        edited = any(o.call.name == "str_replace_editor" and o.result.ok
                     and o.call.arguments.get("command") in EDIT_COMMANDS for o in outcomes)
        tested = any(o.call.name == "bash" and o.result.ok
                     and any(r in str(o.call.arguments.get("command", "")) for r in TEST_RUNNERS) for o in outcomes)
        a = self.step_alpha
        return {"valid_call": a * valid, "edit_applied": a * edited, "tests_run": a * tested}

    async def demonstrate(self, task: Task, seed: int = 0) -> list[str]:
        """Failing test → view → gold hunks via the editor → tests → submit (envs/swe/demos.py)."""
        return swe_demonstration(task, self.tool_parser.format_call, self.max_turns, seed)

    async def submission(self) -> str:
        """The agent's work as a diff against the base commit (new files included)."""
        r = await self.sandbox.exec(f"{GIT} add -A && {GIT} -c core.quotepath=off diff --cached --binary HEAD",
                                    timeout=60)
        return r.stdout if r.ok else ""

    async def reward(self, task: Task, state: Any) -> dict[str, float]:
        submitted = bool(state_get(state, "submitted", False))
        patch = await self.submission() if submitted else None
        sandbox = await self._new_sandbox(task)
        try:
            result = await grade(sandbox, task, patch, self.test_timeout_s)
        finally:
            await sandbox.close()
        ev = result.evaluation
        return {
            "reward": self.outcome_rewards[result.outcome],
            "submitted": float(submitted),  # CR, algorithms.md §3.2
            "modified": float(result.outcome in ("fail", "pass")),  # MR
            "resolved": float(result.outcome == "pass"),  # RR
            "patch_applied": float(ev.applied) if ev else 0.0,
            "test_edits_dropped": float(len(ev.dropped)) if ev else 0.0,
        }


class _TaskPools:
    """What an env without a shared pool hands out as its pool: each `get` takes a sandbox from
    the pool of the env's current task (its image or runtime), and `put` returns it there."""

    def __init__(self, env: SWEEnv) -> None:
        self.env = env
        self._owner: dict[int, Any] = {}

    async def get(self, timeout: float | None = None) -> Any:
        if self.env.task is None:
            raise RuntimeError("SWEEnv: a sandbox is taken for the current task; call reset() first")
        pool = await self.env._pool_for(self.env.task)
        lease = await pool.get(timeout)
        self._owner[id(lease)] = pool
        return lease

    async def put(self, lease: Any) -> None:
        await self._owner.pop(id(lease)).put(lease)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + " ..."


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def gold_actions(task: Task) -> list[str]:
    """Hermes-format actions that apply the task's gold patch through the editor, then submit:
    what a perfect agent would do (used by tests and `env check`)."""
    actions = []
    for path, text in split_patch(task["patch"]):
        old, new = hunk_texts(text)
        for o, n in zip(old, new):
            call = {"name": "str_replace_editor",
                    "arguments": {"command": "str_replace", "path": path, "old_str": o, "new_str": n}}
            actions.append(f"<tool_call>{json.dumps(call)}</tool_call>")
    actions.append('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
    return actions


__all__ = ["OUTCOME_REWARDS", "SWEEnv", "gold_actions"]
