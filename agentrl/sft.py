"""`agentrl sft`: a run that only warm-starts (supervised, on the env's demonstrations or recorded
trajectories), with held-out evaluations before and after. The step itself is agentrl/trainer/sft.py,
its data agentrl/demos.py.

    plan = prepare_sft(env="search", overrides=["trainer.warm_start.epochs=1"])   # agentrl.plan
    run_sft(plan)
"""

from __future__ import annotations

import asyncio
import json
import logging

from agentrl.config import dump_config
from agentrl.env_builder import make_env
from agentrl.metrics import jsonable
from agentrl.models import resolve_configured
from agentrl.plan import RunPlan
from agentrl.report import write_report
from agentrl.sandboxes import make_pool
from agentrl.stages import Stages
from agentrl.trainer.checkpoint import save_checkpoint
from agentrl.trainer.distributed import make_learner


def run_sft(plan: RunPlan) -> int:
    """SFT on the env's demonstrations (or the data file), with held-out evaluations before and
    after when `eval.enabled`. The run directory has the layout of a training run; its checkpoint
    records the warm start as done, so `agentrl train --resume RUN_DIR` continues with RL."""
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=plan.run_dir / "train.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    (plan.run_dir / "config.yaml").write_text(dump_config(plan.config))
    return asyncio.run(_run_sft(plan))


async def _run_sft(plan: RunPlan) -> int:
    cfg, run_dir = plan.config, plan.run_dir
    learner = make_learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature,
                           reward_cfg=cfg.reward)
    pool = make_pool(cfg.sandbox, run_id=run_dir.name, name=f"{cfg.env.name}-sft")
    await pool.start()
    stages = None
    try:
        probe = make_env(cfg, pool)
        tasks = list(probe.tasks("train"))
        await probe.aclose()
        stages = await Stages.start(cfg, run_dir, learner, lambda: make_env(cfg, pool), tasks)
        stages.sft_file = "metrics.jsonl"
        await stages.before_rl(lambda more: save_checkpoint(run_dir / "checkpoints", learner,
                                                            extra={"step": 0, **more}))
        summary = await stages.finish(0, final_eval=False)
        (run_dir / "summary.json").write_text(json.dumps(jsonable(summary), indent=1))
    finally:
        if stages is not None:
            await stages.close()
        await pool.close()
        if hasattr(learner, "close"):  # trainer.num_learners > 1: the rank processes
            learner.close()
    report = write_report(run_dir)
    print(f"[agentrl] run directory: {run_dir}  report: {report / 'index.html'}")
    return 0
