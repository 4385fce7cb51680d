"""Typed configuration: dataclasses, YAML files and dotted overrides (architecture.md §10).

    cfg = load_config(env="code", overrides=["trainer.lr=1e-6"])

Every key is checked before any work starts: an unknown key names the allowed keys, an
ill-typed value names the expected type (and the allowed values for a choice), and a key that
moved names its new place (`MOVED`).

The user surface is what `configs/base.yaml` lists, one line of meaning per key; every other field
is an advanced setting, listed in docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
if not CONFIG_DIR.is_dir():  # editable install / source checkout: configs/ beside the package
    CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A bad config; the message names the key and what is allowed."""


# Keys that moved or merged: a file or override that still uses one stops with a line naming the new key
# (not mapped silently: a merged key's meaning changed with it).
MOVED = {
    "trainer.seed": "run.seed (the run's one seed)",
    "model.dtype": "engine.dtype (the engine's one precision; auto follows trainer.dtype)",
}
# Keys that no longer mean anything: a config that sets one (a run directory's config.yaml from an
# older version, which `--resume` reads) loads with a one-line note instead of stopping.
RETIRED = {
    "laminar.heartbeat_s": "a worker's death reaches the manager as it happens and loads are read at each "
                           "repack (laminar.repack_interval_s)",
}


# ---------------------------------------------------------------------------------------------
# Sections. Defaults fit a 2-core CPU with the embedded model; algorithms.md gives the rest.
# ---------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"  # embedded default, a local HF folder, or a hub id
    cache_dir: str = "~/.cache/agentrl/models"
    # A Jinja chat template file used instead of the model's own (null: the model's). One that rewrites
    # earlier turns (Qwen3's drops past <think> blocks) makes its episodes step-wise: a row per request
    chat_template: str | None = None


@dataclass
class EngineConfig:
    kind: Literal["hf", "vllm", "openai"] = "hf"
    max_batch_size: int = 16
    base_url: str = "http://127.0.0.1:8000/v1"  # openai engine
    api_key: str = "EMPTY"
    gpu_memory_utilization: float = 0.5  # vllm
    # openai: a folder the vLLM server also reads, for weight pushes (None: a temp folder, for a
    # server on this machine)
    weights_dir: str | None = None
    max_model_len: int = 4096
    prefix_cache_mb: float = 1024  # hf: finished turns' KV kept for the next turn's prompt; 0 = off
    # hf: prompt-lookup speculation, drafts per decode step from the row's own context (exact: the
    # output distribution and log-probs are plain decoding's); 0 = off
    speculative_tokens: int = 4
    # The engine's one precision (hf: autocast, the linear weights kept in it; vllm: the model's dtype).
    # auto: the trainer's (trainer.dtype resolved), so the engine samples in the precision the trainer scores in
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"  # hf: where it generates; auto = a GPU when torch sees one
    # hf under bf16 on CPU: keep each linear weight packed in oneDNN's blocked layout between steps
    # (a decode step 1.0-1.12x faster, outputs bit-equal) for one packed copy of those weights
    pack_weights: bool = True


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256  # per turn


@dataclass
class EnvConfig:
    name: str = "code"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # None keeps the env class's own setting (ToolEnv attributes of the same names).
    max_turns: int | None = None
    tool_parser: str | None = None
    max_output_chars: int | None = None
    tool_timeout_s: float | None = None
    mcp_servers: list[str] = field(default_factory=list)  # a ToolEnv also gets these MCP servers' tools


@dataclass
class SandboxConfig:
    backend: Literal["local", "docker", "process"] = "local"
    image: str = "agentrl-base:bookworm"
    pool_size: int | None = None  # warm sandboxes per pool; None: one per trajectory in flight (the larger of
                                  # rollout.concurrency and eval.concurrency)
    timeout_s: float = 10.0
    memory_mb: int = 1024
    cpus: float = 1.0
    pids: int = 64
    max_output_bytes: int = 1_000_000
    file_size_mb: int = 512  # RLIMIT_FSIZE / ulimit fsize inside the sandbox
    disk_mb: int = 1024  # size cap of /work (a tmpfs: ENOSPC when full; docker adds it to the memory cgroup)
    read_only_root: bool = True  # docker: False for images whose task files live outside /work (reset recreates)


@dataclass
class RolloutConfig:
    group_size: int = 4  # G samples per task
    concurrency: int = 8  # trajectories in flight per worker
    trajectory_timeout_s: float = 300.0
    max_context_tokens: int = 2048
    # A task field (e.g. "kind") whose values RL's prompts take turns over (laminar/prompts.py):
    # each value as often as the others, not in proportion to its number of tasks. None: shuffled.
    balance_key: str | None = None


@dataclass
class TRMConfig:
    """Trust Region Masking, algorithms.md §2.5 (combined sample-based defaults)."""

    mode: Literal["off", "max", "avg", "both"] = "off"
    delta: float = 0.1  # max_t k2(ρ_t) bound
    delta_avg: float = 0.002  # mean_t k3(ρ_t) bound
    normalize: Literal["total", "accepted"] = "total"


@dataclass
class OverlongConfig:
    """DAPO soft overlong punishment, algorithms.md §5.2(4)."""

    enabled: bool = False
    max_len: int = 1024
    cache_len: int = 256
    penalty_factor: float = 1.0


@dataclass
class WarmStartConfig:
    """Supervised warm start before RL (issue 13): cross-entropy on the policy tokens of the
    env's demonstrations (train split), or of recorded trajectories (`data`, filtered by reward)."""

    enabled: bool = False
    data: str | None = None  # a JSONL of trajectories (a run's trajectories.jsonl); None: env demonstrations
    # "demonstrations" (the env's demonstrate(), or `data`) or "rft": the current policy's own episodes
    # that reach the env's best reward, rft_samples per train task (agentrl/rft.py), for any env
    source: str = "demonstrations"
    rft_samples: int = 4
    min_reward: float | None = 1.0  # data: keep trajectories with reward >= this (None: all)
    tasks: int = 32  # train tasks demonstrated
    per_task: int = 2  # demonstration variants per task (seeds 0..per_task-1)
    epochs: int = 2
    lr: float = 5.0e-5
    batch_size: int = 8  # sequences per optimizer step
    # glibc's mmap threshold during the steps (heap.mapped_tensors): tensors this large get their own
    # mapping, freed at once (a lower peak) but faulted in fresh (slower); lower trades speed for memory
    mmap_threshold_mb: float = 0.125
    # Replay during RL (InstructGPT's PPO-ptx, with the demonstrations as the "pretraining" data): each
    # RL update also descends replay_coef x the SFT loss of replay_rows warm-start sequences, so RL's
    # few noisy groups do not unlearn what the warm start taught on the tasks they do not visit. 0: off.
    replay_coef: float = 0.0
    replay_rows: int = 4


@dataclass
class LoRAConfig:
    """LoRA adapters through peft (issue 16); rank 0 = full fine-tune."""

    rank: int = 0
    alpha: float = 16.0
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class TrainerConfig:
    steps: int = 10
    batch_groups: int = 2  # groups per global batch
    minibatches: int = 1  # optimizer steps per global batch
    micro_batch_size: int = 4  # sequences per forward pass (gradient accumulation)
    micro_batch_tokens: int = 4096  # and at most this many padded tokens per pass (activation memory); 0 = no cap
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    # adamw: fp32 moments, 8 bytes per parameter; adamw8bit: bitsandbytes' block-wise 8-bit moments,
    # about 2 bytes (1.0 -> 0.27 GB for the 135M model), one learner process only; auto: adamw8bit
    # with one learner process, adamw when num_learners > 1 shards it (trainer/learner.make_optimizer)
    optimizer: Literal["adamw", "adamw8bit", "auto"] = "adamw"
    grad_clip: float = 1.0
    warmup_steps: int = 0
    advantage: Literal["grpo", "drgrpo", "rloo", "otb"] = "grpo"
    loss: Literal["ppo", "gspo", "reinforce"] = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO clip-higher
    dual_clip: float | None = None  # e.g. 3.0
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = "token-mean"
    loss_scale_factor: float | None = None  # Dr.GRPO constant divisor
    decoupled: bool = True  # AReaL decoupled objective, π_prox recomputed per batch (§8.2)
    tis_cap: float | None = 2.0  # truncated IS on π_old/π_roll (§8.3); None disables
    kl_coef: float = 0.0  # k3 KL to the reference policy (after a warm start: the warm-started one)
    gspo_clip_low: float = 3e-4  # GSPO sequence-ratio clip (§8.4), used when loss=gspo
    gspo_clip_high: float = 4e-4
    otb_zero_tail: bool = True  # OTB handle_zero_tail (§6.2; True for multi-turn)
    dynamic_sampling: bool = False  # DAPO: drop zero-variance groups and refill
    max_gen_batches: int = 10
    # LUFFY-style off-policy guidance (agentrl/guidance.py): a group none of whose trajectories succeeded
    # gets the env's demonstration of its task, so it has a reward spread to learn from
    demo_guidance: bool = False
    trm: TRMConfig = field(default_factory=TRMConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    checkpoint_every: int = 5
    # Derived, not a key: load_config copies run.seed here, the one seed of a run (LoRA init, mini-batch order)
    seed: int = field(default=0, metadata={"derived": "run.seed"})
    num_learners: int = 1  # data-parallel learner processes, FSDP2-sharded (gloo on CPU, NCCL on GPUs)
    learner_num_gpus: float = 0.0  # on Ray (--ray): each learner rank's GPUs (1: NCCL), placed by Ray
    learner_num_cpus: float = 1.0  # on Ray: each learner rank's CPUs (its torch threads)
    # Where a local learner runs: auto = a GPU when torch sees one (one per rank with num_learners > 1,
    # NCCL), else the CPU (gloo). On Ray, learner_num_gpus decides.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    activation_checkpointing: bool = True  # recompute each decoder layer in backward (less memory)
    # glibc's mmap threshold during an RL learner step (heap.mapped_tensors): tensors this large get
    # their own mapping, given back when freed. null: 0.125 MiB where no in-process engine decodes
    # beside the step (sync), else unmapped (inference/cpu/policy.py learner_mmap_threshold)
    mmap_threshold_mb: float | None = None
    # Forward autocast dtype; weights and Adam stay fp32. auto: bfloat16 where the device multiplies it
    # natively (CUDA with bf16, a CPU with AVX512-BF16 or AMX), else float32 (models.autocast_dtype)
    dtype: Literal["auto", "float32", "bfloat16"] = "float32"
    entropy_every: int = 1  # the entropy metric every N global batches (0: never); costs a V-wide pass
    lora: LoRAConfig = field(default_factory=LoRAConfig)


@dataclass
class RewardConfig:
    """G-RA, algorithms.md §3: step rewards count only when the outcome passes the gate."""

    # Step rewards count only when the outcome reaches the gate (1: a full success). With a 0/1 outcome a
    # gate of 0 passes every wrong answer, and GRPO's std normalisation turns their small step-reward
    # differences into large advantages. None = D-RA (ungated).
    gate: float | None = 1.0
    step_reward_alpha: float = 0.01


@dataclass
class SummarizeConfig:
    """SUPO, algorithms.md §4."""

    enabled: bool = False
    working_context: int = 2048  # W
    ratio: float = 0.95  # L = ratio * W
    max_summaries: int = 2  # S
    max_steps: int = 32  # H


@dataclass
class LaminarConfig:
    # auto: laminar with several rollout workers or on Ray; global-async with one local worker, where
    # fully async generation outruns the learner and piles up a stale backlog (see resolve_backend)
    backend: Literal["auto", "laminar", "sync", "global-async"] = "auto"
    num_workers: int = 1
    num_relays: int = 1
    repack_interval_s: float = 5.0
    fetch_policy: Literal["wait_inflight", "local"] = "wait_inflight"
    max_staleness: int | None = None
    buffer_capacity: int = 256
    chunk_bytes: int = 16 * 1024 * 1024
    ray_address: str | None = None
    wait_timeout_s: float = 1800.0  # the trainer's wait for one batch; then it names the dead workers
    worker_num_gpus: float = 0.0  # Ray resources of each rollout worker actor (vllm on GPUs: 1)
    worker_num_cpus: float = 1.0
    pool_num_cpus: float = 1.0  # Ray CPUs of each node's sandbox pool actor


@dataclass
class EvalConfig:
    """Held-out evaluation inside training (issue 13): at step 0, after the warm start, every
    `every` RL steps (0: never in between) and at the end, on `n` tasks of `split`."""

    enabled: bool = False
    every: int = 0
    n: int = 32
    split: str = "test"
    temperature: float = 0.0  # 0: greedy, so repeated evaluations of the same weights agree
    samples: int = 1  # episodes per task (> 1 needs temperature > 0): success is then the mean over tasks
                      # of each task's rate, the policy as RL samples it, with CIs over tasks (avg@k)
    concurrency: int | None = None  # episodes in flight; None: rollout.concurrency. Nothing trains
                                    # meanwhile, so wider decode batches are cheaper per task
    group_by: str | None = None  # a task field (search: kind): each evaluation also counts successes per
                                 # value of it, and the run says which values RL moved


@dataclass
class RunConfig:
    dir: str = "runs"
    name: str | None = None
    quiet: bool = False
    tensorboard: bool = False
    wandb: bool = False
    save_trajectories: int = 4  # trajectories per step written to trajectories.jsonl
    seed: int = 0  # the run's one seed: sampling, prompt order, buffer, LoRA init, mini-batch order


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    summarize: SummarizeConfig = field(default_factory=SummarizeConfig)
    laminar: LaminarConfig = field(default_factory=LaminarConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)


# ---------------------------------------------------------------------------------------------
# Strict construction from plain data
# ---------------------------------------------------------------------------------------------


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if "derived" not in f.metadata}
    if isinstance(obj, tuple):
        return list(obj)
    return obj


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return `value` as type `tp`, or raise ConfigError naming `key`."""
    origin = get_origin(tp)
    bad = ConfigError(f"config key '{key}': got {value!r}, expected {_type_name(tp)}")
    if tp is Any:
        return value
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise bad
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise bad
    if tp is type(None):
        if value is None:
            return None
        raise bad
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):  # YAML 1.1 reads 1e-6 as str
            return float(value)
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise bad
        (arg,) = get_args(tp)
        return [_coerce(v, arg, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    raise bad


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else key
        if full in MOVED:
            raise ConfigError(f"config key '{full}' has moved: use {MOVED[full]}")
        if full in RETIRED:
            print(f"agentrl: config key '{full}' is ignored: {RETIRED[full]}", file=sys.stderr)
            continue
        if key not in hints:
            raise ConfigError(f"unknown config key '{full}'; allowed keys{' in ' + prefix if prefix else ''}: "
                              + ", ".join(names))
        kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_override(text: str) -> dict[str, Any]:
    """`trainer.trm.delta=0.05` → {"trainer": {"trm": {"delta": 0.05}}} (value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key.path=value")
    path, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    if path.strip() == "":
        raise ConfigError(f"override '{text}' has an empty key")
    node: dict[str, Any] = {}
    root = node
    parts = path.strip().split(".")
    for part in parts[:-1]:
        node[part] = {}
        node = node[part]
    node[parts[-1]] = value
    return root


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def load_config(env: str | None = None, config_file: str | Path | None = None,
                overrides: list[str] | None = None) -> Config:
    """base.yaml ← configs/<env>.yaml, or for a foreign env "SCHEME:SPEC" configs/schemes/<SCHEME>.yaml
    (if any) ← config_file ← dotted overrides."""
    data = _read_yaml(CONFIG_DIR / "base.yaml") if (CONFIG_DIR / "base.yaml").exists() else {}
    if env is not None:
        env_file = CONFIG_DIR / f"{env}.yaml"
        if ":" in env:  # a scheme's defaults (a module's own "module:Class" has no file there)
            env_file = CONFIG_DIR / "schemes" / f"{env.partition(':')[0]}.yaml"
        if env_file.exists():
            data = _merge(data, _read_yaml(env_file))
        data = _merge(data, {"env": {"name": env}})
    if config_file is not None:
        data = _merge(data, _read_yaml(Path(config_file)))
    for text in overrides or []:
        data = _merge(data, parse_override(text))
    cfg = _build(Config, data)
    cfg.trainer.seed = cfg.run.seed
    if cfg.eval.concurrency is None:
        cfg.eval.concurrency = cfg.rollout.concurrency
    if cfg.sandbox.pool_size is None:  # fewer sandboxes than trajectories in flight makes the rest wait,
        # and the wait counts against their wall-clock budget
        cfg.sandbox.pool_size = max(cfg.rollout.concurrency, cfg.eval.concurrency)
    validate(cfg)
    return cfg


def _cuda_devices(load: bool = False) -> int:
    """GPUs torch sees, without importing torch when nothing else has (unless `load`)."""
    torch = sys.modules.get("torch")
    if torch is None and load:
        import torch  # heavy lazy load, and only when asked
    return torch.cuda.device_count() if torch is not None else 0


def validate(cfg: Config) -> None:
    """Cross-field checks that types alone cannot express."""
    checks = [
        (cfg.rollout.group_size >= 1, "rollout.group_size must be >= 1"),
        (cfg.sandbox.pool_size is None or cfg.sandbox.pool_size >= 1,
         "sandbox.pool_size must be >= 1 (or null: one sandbox per trajectory in flight, rollout.concurrency)"),
        (cfg.trainer.batch_groups >= 1, "trainer.batch_groups must be >= 1"),
        (cfg.trainer.micro_batch_size >= 1 and cfg.trainer.micro_batch_tokens >= 0,
         "trainer.micro_batch_size must be >= 1 and trainer.micro_batch_tokens >= 0 (0: no token cap)"),
        (cfg.trainer.lr > 0, "trainer.lr must be > 0"),
        (0 <= cfg.trainer.clip_low < 1, "trainer.clip_low must be in [0, 1)"),
        (cfg.trainer.clip_high >= 0, "trainer.clip_high must be >= 0"),
        (cfg.sampling.temperature > 0, "sampling.temperature must be > 0"),
        (0 < cfg.sampling.top_p <= 1, "sampling.top_p must be in (0, 1]"),
        (cfg.sampling.max_tokens >= 1, "sampling.max_tokens must be >= 1"),
        (0 < cfg.summarize.ratio <= 1, "summarize.ratio must be in (0, 1]"),
        (cfg.laminar.num_workers >= 1, "laminar.num_workers must be >= 1"),
        (cfg.trainer.dual_clip is None or cfg.trainer.dual_clip > 1, "trainer.dual_clip must be > 1"),
        (cfg.trainer.warm_start.epochs >= 1 and cfg.trainer.warm_start.batch_size >= 1
         and cfg.trainer.warm_start.tasks >= 1 and cfg.trainer.warm_start.per_task >= 1,
         "trainer.warm_start.epochs, batch_size, tasks and per_task must be >= 1"),
        (cfg.trainer.warm_start.lr > 0, "trainer.warm_start.lr must be > 0"),
        (cfg.trainer.warm_start.mmap_threshold_mb > 0, "trainer.warm_start.mmap_threshold_mb must be > 0 (MiB)"),
        (cfg.trainer.mmap_threshold_mb is None or cfg.trainer.mmap_threshold_mb > 0,
         "trainer.mmap_threshold_mb must be > 0 (MiB) or null (automatic)"),
        (cfg.trainer.warm_start.replay_coef >= 0 and cfg.trainer.warm_start.replay_rows >= 1,
         "trainer.warm_start.replay_coef must be >= 0 (0: no replay) and replay_rows >= 1"),
        (cfg.trainer.warm_start.replay_coef == 0 or cfg.trainer.warm_start.enabled,
         "trainer.warm_start.replay_coef replays the warm start's data: set trainer.warm_start.enabled=true "
         "or replay_coef=0"),
        (cfg.trainer.warm_start.source in ("demonstrations", "rft"),
         f"trainer.warm_start.source must be demonstrations or rft, got {cfg.trainer.warm_start.source!r}"),
        (cfg.trainer.warm_start.source != "rft" or cfg.trainer.warm_start.data is None,
         "trainer.warm_start.source=rft samples its own episodes: unset trainer.warm_start.data"),
        (cfg.trainer.warm_start.rft_samples >= 1, "trainer.warm_start.rft_samples must be >= 1"),
        (cfg.trainer.warm_start.replay_coef == 0 or cfg.trainer.num_learners == 1,
         "trainer.warm_start.replay_coef runs on one learner process: set trainer.num_learners=1 or replay_coef=0"),
        (cfg.eval.every >= 0 and cfg.eval.n >= 1, "eval.every must be >= 0 and eval.n >= 1"),
        (cfg.eval.concurrency is None or cfg.eval.concurrency >= 1,
         "eval.concurrency must be >= 1 (or null: rollout.concurrency)"),
        (cfg.eval.temperature >= 0, "eval.temperature must be >= 0 (0 = greedy)"),
        (cfg.eval.samples >= 1, "eval.samples must be >= 1"),
        (cfg.eval.samples == 1 or cfg.eval.temperature > 0,
         f"eval.samples={cfg.eval.samples} would repeat the same greedy episode: set eval.temperature > 0 "
         "(e.g. the sampling temperature) or eval.samples=1"),
        (cfg.trainer.num_learners >= 1, "trainer.num_learners must be >= 1"),
        # on Ray the cluster's resources decide (the learners' placement group says when they do not fit)
        (cfg.laminar.ray_address is not None or cfg.trainer.num_learners <= (os.cpu_count() or 1)
         or _cuda_devices() >= cfg.trainer.num_learners,
         f"trainer.num_learners={cfg.trainer.num_learners} exceeds the devices here ({os.cpu_count()} CPU cores, "
         f"{_cuda_devices()} GPUs); lower it"),
        (cfg.trainer.device != "cuda" or cfg.laminar.ray_address is not None
         or _cuda_devices(load=True) >= cfg.trainer.num_learners,
         f"trainer.device=cuda needs a GPU per learner (trainer.num_learners={cfg.trainer.num_learners}) but torch "
         f"sees {_cuda_devices()} here; set trainer.device=auto or cpu"),
        (cfg.engine.device != "cuda" or cfg.engine.kind != "hf" or _cuda_devices(load=True) >= 1,
         "engine.device=cuda but torch sees no GPU here; set engine.device=auto or cpu"),
        (cfg.trainer.learner_num_gpus >= 0 and cfg.trainer.learner_num_cpus > 0,
         "trainer.learner_num_gpus must be >= 0 and trainer.learner_num_cpus > 0"),
        (cfg.trainer.num_learners == 1 or cfg.trainer.optimizer != "adamw8bit",
         "trainer.optimizer=adamw8bit keeps whole-tensor 8-bit state, which FSDP2's sharded parameters cannot "
         "hold; set trainer.optimizer=adamw (or auto) with trainer.num_learners > 1"),
        (cfg.trainer.lora.rank >= 0 and cfg.trainer.lora.alpha > 0 and bool(cfg.trainer.lora.targets),
         "trainer.lora.rank must be >= 0, trainer.lora.alpha > 0 and trainer.lora.targets non-empty"),
        (cfg.trainer.entropy_every >= 0, "trainer.entropy_every must be >= 0"),
        (cfg.engine.speculative_tokens >= 0,
         "engine.speculative_tokens must be >= 0 (0 turns the hf engine's prompt-lookup speculation off)"),
        (cfg.trainer.lora.rank == 0 or cfg.engine.kind != "openai",
         "trainer.lora needs an engine that takes weights (engine.kind=hf or vllm); the openai engine cannot"),
        (cfg.model.chat_template is None or Path(cfg.model.chat_template).expanduser().is_file(),
         f"model.chat_template: no file {cfg.model.chat_template!r}; give the path of a Jinja chat template "
         "(or null for the model's own)"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"trainer": {"lr": 1e-5}} → {"trainer.lr": 1e-5}; a dict-typed field (env.kwargs) is one leaf."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and full not in _DICT_FIELDS:
            out.update(flatten(value, full))
        else:
            out[full] = value
    return out


def _dict_fields(cls: type, prefix: str = "") -> set[str]:
    out = set()
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        full = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(tp):
            out |= _dict_fields(tp, full)
        elif get_origin(tp) is dict or (get_origin(tp) in (Union, types.UnionType)
                                        and any(get_origin(a) is dict for a in get_args(tp))):
            out.add(full)
    return out


_DICT_FIELDS = _dict_fields(Config)


def explain_config(cfg: Config, default: Config) -> str:
    """The resolved config as YAML, a value that differs from `default` marked `# set (default: X)`.
    Still valid YAML: it loads back as --config."""
    values, defaults = flatten(cfg.to_dict()), flatten(default.to_dict())
    lines = ["# agentrl: the resolved config; '# set' marks a value that differs from the default "
             "(configs/base.yaml: the user surface; docs/configuration.md: every key)"]
    _emit(lines, values, defaults)
    return "\n".join(lines) + "\n"


def _inline(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).removesuffix("\n...\n").strip()


def _emit(lines: list[str], values: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Append flat `values` as nested YAML (a section opened when the path changes), marking the
    non-default ones."""
    section: list[str] = []
    for key, value in values.items():
        *path, name = key.split(".")
        common = 0
        while common < min(len(path), len(section)) and path[common] == section[common]:
            common += 1
        lines.extend("  " * depth + f"{path[depth]}:" for depth in range(common, len(path)))
        section = path
        mark = f"  # set (default: {_inline(defaults.get(key))})" if value != defaults.get(key) else ""
        lines.append("  " * len(path) + f"{name}: {_inline(value)}{mark}")
