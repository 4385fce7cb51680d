"""trainer.num_learners=2: two FSDP2-sharded learner processes (gloo, loopback) train the same
global batch to the same parameters as one learner, holding half the weights and Adam state each."""

from __future__ import annotations

import copy

import torch

from agentrl.config import TrainerConfig
from agentrl.trainer.distributed import DistributedLearner
from agentrl.trainer.learner import Learner

from .conftest import VOCAB, tiny_llama
from .helpers import random_groups
from .test_learner import set_behaviour_logprobs


def test_two_sharded_learners_equal_one(tmp_path):
    path = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(path)
    groups = random_groups(2, 3, VOCAB, seed=5)
    set_behaviour_logprobs(tiny_llama(0), groups)
    cfg = TrainerConfig(lr=1e-3, micro_batch_size=1)
    single = Learner(tiny_llama(0), cfg)
    m1 = single.step(copy.deepcopy(groups))
    one = single.state_dict_for_inference()
    dl = DistributedLearner(path, cfg, num_learners=2)
    try:
        m2 = dl.step(copy.deepcopy(groups))
        two = dl.state_dict_for_inference()
        shards = dl.shard_bytes()
        state = dl.training_state()
    finally:
        dl.close()
    assert dl.version == 1 and dl.global_step == 1
    assert set(one) == set(two)
    moved = max((one[k] - tiny_llama(0).state_dict()[k]).abs().max().item() for k in one)
    assert moved > 1e-4  # the step did something
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=1e-5, rtol=0, msg=k)
    for k in ("loss", "pg_loss", "grad_norm", "kl_k3_old_roll", "entropy"):
        assert abs(m1[k] - m2[k]) < 1e-5, k
    full_w = sum(p.numel() * 4 for p in single.model.parameters())
    full_opt = 2 * full_w
    for rank in shards:  # each rank holds about half (shards round up per tensor)
        assert rank["weights"] <= 0.6 * full_w and rank["optimizer"] <= 0.6 * full_opt
    torch.testing.assert_close(state["model"]["model.norm.weight"], one["model.norm.weight"])
    assert set(state["model"]) >= set(single.model.state_dict()) - {"lm_head.weight"}
