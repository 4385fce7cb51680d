"""The CUDA paths CI cannot run (`make test-gpu`, docs/cluster.md): the learner on a GPU, the
sharded learner's NCCL group, the hf engine on a GPU, and `agentrl train` putting both there by
itself (`trainer.device` / `engine.device` = auto). CI has no GPU, so `make test` does not collect
this folder; here a missing GPU fails every test instead of skipping it.

The model is the embedded model's architecture cut to two decoder layers with random weights (its
real tokenizer and chat template): the checks are about where and how the numbers are computed,
not about what the model knows, and the folder is small enough to build in a second."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.config import Config, LoRAConfig, TrainerConfig, load_config
from agentrl.inference import make_engine
from agentrl.inference.base import GenerateOutput, SamplingParams
from agentrl.trainer.distributed import DistributedLearner, make_learner
from agentrl.trainer.learner import Learner
from tests.trainer.helpers import random_groups

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


@pytest.fixture(autouse=True)
def _needs_a_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.fail("tests_gpu needs a CUDA GPU (torch.cuda.is_available() is False); run `make test` here instead",
                    pytrace=False)


def _random_smollm2(source: str | Path, out: Path, initializer_range: float, layer_output_scale: float = 1.0) -> Path:
    """The embedded model's config cut to two decoder layers, random weights (seed 0) whose layer
    outputs (o_proj, down_proj) are scaled by `layer_output_scale`, saved as an HF folder with
    `source`'s tokenizer files."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source)
    config.num_hidden_layers = 2
    config.initializer_range = initializer_range
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(layer_output_scale)
            layer.mlp.down_proj.weight.mul_(layer_output_scale)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (Path(source) / name).exists():
            shutil.copy(Path(source) / name, out / name)
    return out


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's config with two layers and random weights, saved as an HF folder with
    the real tokenizer (from $AGENTRL_TOKENIZER_DIR, else the embedded model's folder)."""
    source = os.environ.get("AGENTRL_TOKENIZER_DIR")
    if source is None:
        from agentrl.models import resolve_model

        source = str(resolve_model("smollm2-135m"))
    # initializer 0.1: peaked next-token distributions, so that precision shows in log-probs
    return _random_smollm2(source, tmp_path_factory.mktemp("tiny-smollm2"), initializer_range=0.1)


@pytest.fixture(scope="session")
def looping_model_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-layer model made to repeat itself, so that prompt-lookup drafts exist and are mostly
    kept: small embeddings (initializer 0.02) tied to the head make the last token the likeliest
    next one (p ~ 0.7 at T = 1, a point mass greedy), and the layers' outputs scaled by 0.03 keep
    the context in the log-probs without drowning that."""
    return _random_smollm2(model_dir, tmp_path_factory.mktemp("looping-smollm2"), initializer_range=0.02,
                           layer_output_scale=0.03)


def _max_param_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pb = dict(b.named_parameters())
    return max((p.detach().float().cpu() - pb[n].detach().float().cpu()).abs().max().item()
               for n, p in a.named_parameters())


def _trainer_cfg(**overrides: object) -> TrainerConfig:
    cfg = TrainerConfig(lr=1e-4, micro_batch_size=2, activation_checkpointing=True, dtype="float32",
                        decoupled=False, tis_cap=None)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def test_auto_puts_the_learner_on_the_gpu(model_dir: Path) -> None:
    learner = make_learner(model_dir, _trainer_cfg())
    assert isinstance(learner, Learner) and learner.device == "cuda"
    assert next(learner.model.parameters()).is_cuda
    assert make_learner(model_dir, _trainer_cfg(device="cpu")).device == "cpu"


def test_gpu_learner_step_matches_the_cpu_one(model_dir: Path) -> None:
    """One fp32 step on the GPU computes the CPU's loss and update (TF32 off: torch's default for
    matmuls). Adam's first step moves each weight by about ±lr whatever the gradient's size, so a
    gradient that rounds to the other sign moves it 2·lr the other way: the bound is 2.5·lr."""
    cfg = _trainer_cfg()
    groups = random_groups(2, 2, vocab=49152, max_resp=12)
    gpu, cpu = Learner(model_dir, cfg, device="cuda"), Learner(model_dir, cfg, device="cpu")
    m_gpu, m_cpu = gpu.step(groups), cpu.step(groups)
    assert m_gpu["loss"] == pytest.approx(m_cpu["loss"], rel=1e-4, abs=1e-6)
    assert _max_param_diff(gpu.model, cpu.model) <= 2.5 * cfg.lr
    moved = _max_param_diff(gpu.model, Learner(model_dir, cfg, device="cpu").model)
    assert moved > 0.5 * cfg.lr  # the step did train


def test_bf16_learner_on_the_gpu_trains(model_dir: Path) -> None:
    learner = Learner(model_dir, _trainer_cfg(dtype="auto"), device="cuda")
    assert learner.dtype == "bfloat16"  # an H100 multiplies bf16 natively
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    metrics = learner.step(random_groups(2, 2, vocab=49152, max_resp=12))
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert all(p.dtype == torch.float32 for p in learner.model.parameters())  # fp32 master weights
    assert any((p.detach() - before[n]).abs().max() > 0 for n, p in learner.model.named_parameters())


def test_sharded_learner_over_nccl_matches_the_in_process_one(model_dir: Path) -> None:
    """`DistributedLearner` on a GPU: its rank joins an NCCL group and FSDP2-shards on cuda:0; one
    step equals the in-process GPU learner's, and the weights it gathers for the engines are the
    updated ones. (One GPU here: NCCL refuses two ranks on one device, so this is world size 1.)"""
    cfg = _trainer_cfg()
    groups = random_groups(2, 2, vocab=49152, max_resp=12)
    sharded = DistributedLearner(str(model_dir), cfg, num_learners=1)
    try:
        assert sharded.device == "cuda"
        m_sharded = sharded.step(groups)
        weights = sharded.state_dict_for_inference()
        streamed = {k: v for part in sharded.iter_weight_chunks(4 << 20) for k, v in part.items()}  # a push's parts
        state = sharded.training_state()
    finally:
        sharded.close()
    single = Learner(model_dir, cfg, device="cuda")
    m_single = single.step(groups)
    assert m_sharded["loss"] == pytest.approx(m_single["loss"], rel=1e-5, abs=1e-7)
    expected = dict(single.weight_items())
    assert set(weights) == set(expected) == set(streamed)
    assert all(torch.equal(streamed[k], weights[k]) for k in weights)
    assert max((weights[k] - expected[k]).abs().max().item() for k in expected) <= 1e-5
    assert state["global_step"] == 1 and state["optimizer"]["state"]  # Adam moments came back


def test_sharded_lora_with_kl_over_nccl_matches_the_in_process_one(model_dir: Path) -> None:
    """LoRA adapters and the k3 KL's frozen reference on an NCCL rank (both FSDP2-sharded on
    cuda:0): two steps give the in-process GPU learner's KL and merged weights; the reference
    then resets to the policy (as after a warm start) alike, and the next step's KL is ~0."""
    cfg = _trainer_cfg(kl_coef=0.5, lora=LoRAConfig(rank=4, alpha=8))
    batches = [random_groups(2, 2, vocab=49152, max_resp=12, seed=s) for s in (1, 2)]
    sharded = DistributedLearner(str(model_dir), cfg, num_learners=1)
    try:
        m_sharded = [sharded.step(b) for b in batches]
        merged = sharded.state_dict_for_inference()
        sharded.reset_reference()
        reference = sharded.training_state()["reference"]
        kl_after_reset = sharded.step(batches[0])["kl_ref"]
    finally:
        sharded.close()
    single = Learner(model_dir, cfg, device="cuda")
    m_single = [single.step(b) for b in batches]
    single.reset_reference()
    expected_reference = single.training_state()["reference"]
    assert set(reference) == set(expected_reference) and kl_after_reset < 1e-6
    assert max((reference[k].cpu() - expected_reference[k].cpu()).abs().max().item() for k in reference) <= 1e-5
    expected = dict(single.weight_items())
    assert m_single[1]["kl_ref"] > 0
    for a, b in zip(m_sharded, m_single):
        assert a["kl_ref"] == pytest.approx(b["kl_ref"], rel=1e-4, abs=1e-7)
    assert set(merged) == set(expected)
    assert max((merged[k] - expected[k]).abs().max().item() for k in expected) <= 1e-5


def _engine_cfg(model_dir: Path, *overrides: str) -> Config:
    return load_config(None, None, [f"model.name={model_dir}", "engine.prefix_cache_mb=64", *overrides])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_engine_logprobs_agree_with_the_gpu_learner(model_dir: Path, dtype: str) -> None:
    """make_engine puts the hf engine on the GPU by itself; the log-probs it samples with agree
    with the learner's recompute on the same GPU and precision (engine.dtype follows trainer.dtype)."""
    cfg = _engine_cfg(model_dir, f"trainer.dtype={dtype}")
    engine = make_engine(cfg)
    assert engine.device.type == "cuda"
    # oneDNN packing is for CPU weights: on the GPU at most the tied head keeps a cast, unpacked
    assert not any(layer.pack for layer in engine._linears) and len(engine._linears) <= 1
    prompt = engine.tokenizer.encode("Name a country in Europe.")

    async def sample() -> list[GenerateOutput]:
        try:
            return await asyncio.gather(*(engine.generate(list(prompt), SamplingParams(max_tokens=48, seed=seed))
                                          for seed in range(4)))
        finally:
            await engine.close()

    outputs = asyncio.run(sample())
    learner = Learner(model_dir, _trainer_cfg(dtype=dtype), device="cuda")
    worst, total, count = 0.0, 0.0, 0
    for out in outputs:
        ids = torch.tensor([list(prompt) + out.token_ids])
        with learner._autocast(), torch.no_grad():
            logits = learner.model(input_ids=ids.cuda()).logits.float()
        ref = torch.log_softmax(logits[0, len(prompt) - 1:-1], -1)
        ref = ref.gather(-1, torch.tensor(out.token_ids, device="cuda")[:, None])[:, 0].cpu()
        diff = (ref - torch.tensor(out.logprobs)).abs()
        worst, total, count = max(worst, diff.max().item()), total + diff.sum().item(), count + diff.numel()
    print(f"\n{dtype}: engine vs learner log-probs on cuda over {count} sampled tokens: max |diff| {worst:.2e}, "
          f"mean {total / count:.2e}")
    assert count > 4 * 8  # decode steps were compared, not only each prompt's prefill
    # fp32: the real-model CPU tests' bound; bf16: rounding noise of incremental vs full forwards
    assert worst <= (1e-4 if dtype == "float32" else 0.25) and total / count <= (1e-5 if dtype == "float32" else 0.05)


def test_agentrl_train_uses_the_gpu(model_dir: Path, tmp_path: Path) -> None:
    """The user's door: `agentrl train` with no device setting puts the learner and the hf engine
    on the GPU, runs the warm start and an RL step there, and says so in summary.json."""
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "--env", "search", f"model.name={model_dir}",
         f"run.dir={tmp_path}", "trainer.steps=1", "trainer.batch_groups=1", "rollout.group_size=2",
         "rollout.concurrency=2", "sampling.max_tokens=24", "eval.enabled=false",
         "trainer.warm_start.tasks=2", "trainer.warm_start.epochs=1", "trainer.dynamic_sampling=false",
         "trainer.checkpoint_every=1"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert summary["learners"]["device"] == "cuda"
    assert summary["engine_device"].startswith("cuda")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_engine_speculation_emits_the_plain_engines_tokens(looping_model_dir: Path, dtype: str) -> None:
    """Prompt-lookup speculation (engine.speculative_tokens, on by default) on the GPU: fp32 emits
    the plain engine's tokens and log-probs and the learner's log-probs, greedy (every draft kept)
    and seeded at T = 1 (some rejected); bf16 (the prefill's cast LM head, the verification pass)
    runs and keeps drafts too."""
    from agentrl.trainer.logprobs import token_logprobs

    asks = ["Count from 1 to 20, separated by commas.", "Say hello.", "Repeat: a b c a b c a b c"]
    temperatures = [0.0, 1.0, 1.0]

    async def run(*overrides: str) -> tuple[list[GenerateOutput], dict]:
        engine = make_engine(_engine_cfg(looping_model_dir, f"trainer.dtype={dtype}", *overrides))
        assert engine.device.type == "cuda"
        prompts = [engine.tokenizer.encode(a) for a in asks]
        try:
            outs = await asyncio.gather(*(engine.generate(list(p), SamplingParams(
                max_tokens=48, temperature=t, seed=i)) for i, (p, t) in enumerate(zip(prompts, temperatures))))
            return list(outs), dict(engine.metrics) | {"prompts": prompts, "engine": engine}
        finally:
            await engine.close()

    spec, m = asyncio.run(run())
    plain, m0 = asyncio.run(run("engine.speculative_tokens=0"))
    print(f"\n{dtype} on cuda: drafts fed {m['draft_tokens']}, kept {m['accepted_tokens']}; "
          f"row-steps {m['batch_size_sum']} vs {m0['batch_size_sum']} plain")
    assert m["accepted_tokens"] > 0 and m["batch_size_sum"] < m0["batch_size_sum"]
    assert all(math.isfinite(lp) for o in spec for lp in o.logprobs)
    if dtype == "bfloat16":  # a verification pass rounds differently from a one-token step
        return
    assert m["draft_tokens"] > m["accepted_tokens"]  # rejections were verified too
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    model = m["engine"].model
    for prompt, out, ref, t in zip(m["prompts"], spec, plain, temperatures):
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref.logprobs)) < 1e-4
        with torch.no_grad():
            trainer = token_logprobs(model, torch.tensor([prompt + out.token_ids], device=model.device),
                                     temperature=t or 1.0)[0][len(prompt):].cpu()
        assert float((trainer - torch.tensor(out.logprobs)).abs().max()) < 1e-4
