"""TRL's GRPOTrainer on the learning benchmark's task; run by bench/learning.py under .venv-trl.

    .venv-trl/bin/python bench/_trl_runner.py --model DIR --data tasks.jsonl --out result.json \
        --work DIR --settings '{...Settings...}' --grader '["python", "bench/learning.py", "--grade-server", ...]'

Single-turn GRPO: each dataset row is the same two chat messages agentrl's env sends; the reward
function hands the completions to the grade server (agentrl's venv), which runs the code env's
hidden tests in a fresh bubblewrap sandbox, exactly as for agentrl. Training stops at the
wall-clock budget, measured from the start of training (after the model is loaded, as for agentrl).
Writes {"points": [[t_s, reward_mean, n], ...], "wall_s", "setup", "trl_version", ...} to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


class Grader:
    """The grade server subprocess: one JSON line of (task_id, completion) pairs per batch."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, task_ids: list[str], completions: list[str]) -> list[float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"items": [list(p) for p in zip(task_ids, completions)]}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"grade server exited (code {self.proc.poll()})")
        return [float(r) for r in json.loads(line)["rewards"]]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _mean(xs: list[float], digits: int) -> float | None:
    return round(sum(xs) / len(xs), digits) if xs else None


def grpo_config_kwargs(s: dict[str, Any], work: Path) -> dict[str, Any]:
    """GRPOConfig's arguments from bench/learning.py's Settings (as a dict): the shared settings in
    TRL's names, and the precision agentrl's learner gets (bf16 autocast over fp32 weights, or fp32)."""
    batch = s["group_size"] * s["prompts_per_step"]
    return dict(
        output_dir=str(work / "trl"), max_steps=100000, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, num_generations=s["group_size"], steps_per_generation=1, num_iterations=1,
        max_completion_length=s["max_tokens"], temperature=s["temperature"], top_p=1.0,
        learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.95, max_grad_norm=s["grad_clip"],
        beta=0.0, epsilon=s["clip_low"], epsilon_high=s["clip_high"], loss_type="dapo", scale_rewards="group",
        gradient_checkpointing=False,  # TRL's default is on; bench/learning.py turns agentrl's off too
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=s["dtype"] == "bfloat16", fp16=False,
        seed=s["seed"], data_seed=s["seed"], disable_tqdm=True, dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32"},  # master weights fp32, as agentrl's; bf16 is autocast
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--model", "--data", "--out", "--work", "--settings", "--grader"):
        ap.add_argument(name, required=True)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (bench/learning.py --trl-threads)")
    args = ap.parse_args()
    s: dict[str, Any] = json.loads(args.settings)

    import torch
    import transformers
    import trl
    from datasets import load_dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    grader = Grader(json.loads(args.grader))
    points: list[list[float]] = []
    step_times: list[float] = []  # TRL's own step_time: generation + grading + update
    length_points: list[list[float]] = []  # per step: [t, TRL's completions/mean_length, completions]
    # Steps whose batch carries an advantage (some group's rewards differ: TRL's frac_reward_zero_std
    # < 1). TRL runs its update on every batch, but on the others the policy gradient is zero.
    signal_times: list[float] = []
    start = {"t": 0.0}
    facts = {"setup": "single-turn GRPOTrainer (TRL's tool/environment_factory mode refuses SmolLM2's chat template)",
             "trl_version": trl.__version__, "transformers_version": transformers.__version__,
             "torch_threads": torch.get_num_threads()}

    def write_result(done: bool) -> None:
        """Written after every step, so a run killed mid-step still leaves its curve."""
        Path(args.out).write_text(json.dumps({"points": points, "length_points": length_points,
                                              "signal_times": signal_times, "done": done,
                                              "step_s_mean": _mean(step_times, 3),
                                              "completion_tokens_mean": _mean([p[1] for p in length_points], 2),
                                              "wall_s": round(time.perf_counter() - start["t"], 1), **facts}))

    def code_reward(prompts: list[Any], completions: list[Any], task_id: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        return grader(task_id, texts)

    class Budget(TrainerCallback):
        """Clock from the first step; record each logged reward; stop at the budget."""

        def on_train_begin(self, args_: Any, state: Any, control: Any, **kw: Any) -> None:
            start["t"] = time.perf_counter()

        def on_log(self, args_: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                t = time.perf_counter() - start["t"]
                points.append([round(t, 2), float(logs["reward"]), s["group_size"] * s["prompts_per_step"]])
                if float(logs.get("frac_reward_zero_std", 0.0)) < 1.0:
                    signal_times.append(round(t, 2))
                if "step_time" in logs:
                    step_times.append(float(logs["step_time"]))
                if "completions/mean_length" in logs:
                    length_points.append([round(t, 2), float(logs["completions/mean_length"]),
                                          s["group_size"] * s["prompts_per_step"]])
                write_result(False)
                print(f"[trl] step {state.global_step} t={t:.0f}s reward={logs['reward']:.3f}", file=sys.stderr,
                      flush=True)

        def on_step_end(self, args_: Any, state: Any, control: Any, **kw: Any) -> None:
            if time.perf_counter() - start["t"] >= s["budget_s"]:
                control.should_training_stop = True

    config = GRPOConfig(**grpo_config_kwargs(s, Path(args.work)))
    dataset = load_dataset("json", data_files=args.data, split="train")
    trainer = GRPOTrainer(model=args.model, reward_funcs=code_reward, args=config, train_dataset=dataset,
                          callbacks=[Budget()])
    try:
        trainer.train()
    finally:
        grader.close()
    write_result(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
