"""What `agentrl train` does around the RL loop (issue 13): the supervised warm start and the
held-out evaluations (step 0, after the warm start, every `eval.every` RL steps, the end).

    stages = await Stages.start(cfg, run_dir, learner, env_factory, train_tasks, resumed_extra)
    await stages.before_rl(checkpoint)         # base eval, warm start, eval after it
    line.update(await stages.after_step(step_done))
    summary.update(await stages.finish())

Files: `warm_start.jsonl` (one line per SFT optimizer step), `eval.jsonl` (one line per held-out
evaluation); the held-out figures of an evaluation made at an RL step also go into that step's
metrics.jsonl line (heldout_*), and every record into summary.json.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.config import Config
from agentrl.demos import warm_start_data
from agentrl.evaluate import (
    HeldOutEvaluator,
    gain_line,
    group_changes,
    heldout_line,
    rl_gain,
    rl_span,
    verdict_line,
)
from agentrl.inference import make_engine
from agentrl.inference.cpu.memory import trim_heap
from agentrl.metrics import jsonable
from agentrl.models import load_tokenizer, resolve_configured, use_chat_template
from agentrl.phases import phase as phase_mark
from agentrl.progress import status
from agentrl.rft import rft_trajectories
from agentrl.trainer.sft import sft_batch, sft_train
from agentrl.types import Task, Trajectory


class StopTraining(Exception):
    """Ends a run after a checkpoint (Ctrl-C): raised from the step callback, or by the warm start
    stopped early."""


def _say(cfg: Config, text: str) -> None:
    if not cfg.run.quiet:
        print(f"[agentrl] {text}", flush=True)


@dataclass
class Stages:
    cfg: Config
    run_dir: Path
    learner: Any
    env_factory: Callable[[], Any]
    train_tasks: list[Task]
    tokenizer: Any
    evaluator: Any = None
    warm_done: bool = False
    fresh: bool = True  # no RL step done yet (not a resumed run)
    warm_data: list[Trajectory] = field(default_factory=list)
    warm_rows: list[dict[str, Any]] = field(default_factory=list)
    eval_engine: Any = None
    collect_s: float = 0.0  # playing the demonstrations / reading the data file
    warm_task_ids: list[str] = field(default_factory=list)
    sft_file: str = "warm_start.jsonl"  # `agentrl sft` runs write their SFT lines to metrics.jsonl

    @classmethod
    async def start(cls, cfg: Config, run_dir: Path, learner: Any, env_factory: Callable[[], Any],
                    train_tasks: list[Task], resumed_extra: dict[str, Any] | None = None) -> Stages:
        """Load what the stages need and the warm-start data (so bad data stops the run before
        any training: DemonstrationError)."""
        extra = resumed_extra or {}
        stages = cls(cfg, run_dir, learner, env_factory, train_tasks,
                     use_chat_template(load_tokenizer(resolve_configured(cfg.model)), cfg.model),
                     warm_done=bool(extra.get("warm_start_done")), fresh=int(extra.get("step", 0)) == 0)
        heldout_ids: set[str] = set()
        if cfg.eval.enabled:
            probe = env_factory()
            try:
                tasks = list(probe.tasks(cfg.eval.split))
            finally:
                await probe.aclose()
            stages.eval_engine = make_engine(cfg)
            stages.evaluator = HeldOutEvaluator(cfg, env_factory, tasks, stages.tokenizer, stages.eval_engine,
                                                run_dir)
            heldout_ids = stages.evaluator.task_ids
        replay = cfg.trainer.warm_start.replay_coef > 0  # a resumed run past its warm start replays it too
        if cfg.trainer.warm_start.enabled and (not stages.warm_done or replay):
            rft = cfg.trainer.warm_start.source == "rft"
            _say(cfg, "warm start: collecting " + (f"trajectories from {cfg.trainer.warm_start.data}"
                                                   if cfg.trainer.warm_start.data else
                                                   "the policy's best episodes (rft)" if rft else "demonstrations"))
            t0 = time.perf_counter()
            if rft:
                stages.warm_data = await rft_trajectories(cfg, env_factory, train_tasks, stages.tokenizer, learner,
                                                          heldout_ids, engine=stages.eval_engine)
            else:
                stages.warm_data = await warm_start_data(cfg, env_factory, train_tasks, stages.tokenizer,
                                                         heldout_ids)
            stages.collect_s = time.perf_counter() - t0
            stages.warm_task_ids = sorted({t.task_id for t in stages.warm_data})
            leaked = heldout_ids & {t.task_id for t in stages.warm_data}
            assert not leaked, f"held-out tasks in the warm-start data: {sorted(leaked)[:3]}"
        return stages

    async def evaluate(self, phase: str, step: int) -> dict[str, Any] | None:
        if self.evaluator is None:
            return None
        with phase_mark("eval"):
            # Only an evaluation between RL steps may share the cores with rollouts still running.
            rec = await self.evaluator.run(self.learner, phase, step, alone=phase != "step")
            # Its kept KV, and the weights it holds of its own (bf16 casts of the learner's), would
            # sit idle until the next evaluation, through the learner's steps.
            freed = 0
            for name in ("drop_prefixes", "release_weights"):
                free = getattr(self.eval_engine, name, None)
                freed += await free() if free is not None else 0
            if freed:
                trim_heap()
        _say(self.cfg, f"{phase} (step {step}): {heldout_line(rec)}")
        return rec

    async def before_rl(self, checkpoint: Callable[[dict[str, Any]], Any],
                        should_stop: Callable[[], bool] | None = None) -> None:
        """Base evaluation, then the warm start (checkpointed, so --resume skips it) and the
        evaluation after it. `should_stop` (Ctrl-C) ends the warm start early with
        StopTraining; it is not marked done, so a resumed run does it again."""
        if self.fresh and not self.warm_done:
            await self.evaluate("base", 0)
        if self.warm_data and self.warm_done:  # resumed past the warm start: its data is for replay only
            self._keep_for_replay()
        elif self.warm_data:
            status.stage = "warm start"
            ws = self.cfg.trainer.warm_start
            n_tok = sum(t.num_policy_tokens for t in self.warm_data)
            _say(self.cfg, f"warm start: {len(self.warm_data)} trajectories, {n_tok} policy tokens, "
                           f"{ws.epochs} epoch(s) at lr {ws.lr:g}")
            with open(self.run_dir / "sft_sequences.jsonl", "w") as f:  # for comparisons (bench/learning.py)
                for t in self.warm_data:
                    for s in t.segments:
                        f.write(json.dumps({"input_ids": s.token_ids, "completion_mask": s.loss_mask}) + "\n")
            total = ws.epochs * -(-len(self.warm_data) // ws.batch_size)
            with open(self.run_dir / self.sft_file, "a") as f:
                def write(row: dict[str, Any]) -> None:
                    f.write(json.dumps(jsonable(row)) + "\n")
                    f.flush()
                    if row["step"] % max(1, total // 10) == 0 or row["step"] == total - 1:
                        _say(self.cfg, f"warm start step {row['step'] + 1}/{total}: loss {row['loss']:.3f} "
                                       f"({row['tokens_per_s'] or 0:.0f} tokens/s)")

                with phase_mark("warm_start"):
                    self.warm_rows = await asyncio.to_thread(sft_train, self.learner, self.warm_data, ws,
                                                             on_step=write, should_stop=should_stop)
            if should_stop is not None and should_stop():
                raise StopTraining
            self.warm_done = True
            self.learner.reset_reference()  # the KL's reference (kl_coef > 0): the warm-started policy
            self._keep_for_replay()
            trim_heap()  # the warm start's Adam moments and data are freed: RL starts from a lean process
            last = self.warm_rows[-1]
            _say(self.cfg, f"warm start done: {len(self.warm_rows)} steps, loss {last['loss']:.3f}")
            checkpoint({"warm_start_done": True})
            await self.evaluate("warm_start", 0)

    def _keep_for_replay(self) -> None:
        """Hand the warm-start sequences to the learner where RL replays them
        (trainer.warm_start.replay_coef > 0), then drop the trajectories."""
        if self.cfg.trainer.warm_start.replay_coef > 0:
            self.learner.set_replay(sft_batch(self.warm_data))
        self.warm_data = []

    async def after_step(self, step_done: int, total: int) -> dict[str, Any]:
        """The held-out figures to merge into this RL step's metrics line (empty when no
        evaluation is due; the final one runs in `finish`)."""
        every = self.cfg.eval.every
        if every > 0 and step_done % every == 0 and step_done < total:
            rec = await self.evaluate("step", step_done)
            return {k: v for k, v in (rec or {}).items() if k.startswith("heldout_")}
        return {}

    async def finish(self, step_done: int, final_eval: bool = True) -> dict[str, Any]:
        """The final evaluation (unless told not to: Ctrl-C, or an SFT-only run whose last
        evaluation was the one after the warm start) and the summary.json additions."""
        if self.evaluator is not None and final_eval:
            await self.evaluate("final", step_done)
        out: dict[str, Any] = {}
        if self.evaluator is not None:
            out["heldout"] = self.evaluator.records
            by_phase = {r["phase"]: r for r in self.evaluator.records}
            for phase in ("base", "warm_start", "final"):
                if phase in by_phase:
                    r = by_phase[phase]
                    out[f"heldout_{phase}"] = {k: r[k] for k in ("heldout_success", "heldout_ci_low",
                                                                   "heldout_ci_high", "heldout_n")}
            _say(self.cfg, "held-out success on " + self.cfg.eval.split + ": " + "  →  ".join(
                f"{p} {r['heldout_success']:.3f} [{r['heldout_ci_low']:.3f}, {r['heldout_ci_high']:.3f}]"
                for p, r in by_phase.items() if p != "step"))
            out["heldout_task_ids"] = sorted(self.evaluator.task_ids)
            out["heldout_verdict"] = verdict_line(self.evaluator.records)  # the run's last line (run.py)
            gain = rl_gain(self.evaluator.records)
            if gain is not None:
                out["heldout_gain"] = gain
                _say(self.cfg, gain_line(gain))
                if changes := group_changes(*rl_span(self.evaluator.records)):
                    _say(self.cfg, f"held-out by {self.cfg.eval.group_by}, {gain['from']} → {gain['to']}: "
                         + ", ".join(changes))
        if self.warm_rows:
            tokens = sum(r["num_tokens"] for r in self.warm_rows)
            train_s = sum(r["sft_step_s"] for r in self.warm_rows)
            out["warm_start"] = {"steps": len(self.warm_rows), "first_loss": self.warm_rows[0]["loss"],
                                 "final_loss": self.warm_rows[-1]["loss"], "collect_s": self.collect_s,
                                 "train_s": train_s, "tokens_per_s": tokens / train_s if train_s else None,
                                 "task_ids": self.warm_task_ids}
        return out

    async def close(self) -> None:
        if self.eval_engine is not None:
            await self.eval_engine.close()
