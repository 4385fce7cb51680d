"""Index: every hand-computed example of algorithms.md, where it is checked, and its headline number.

One row per example. `check` imports the function that implements the example and re-computes
its headline number (atol 1e-5 unless the doc prints fewer digits); `tests` names the detailed
test(s), and `test_every_example_points_at_existing_tests` makes sure those names resolve.
Pure functions only: the whole file runs in about a second.
"""

from __future__ import annotations

import ast
import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from agentrl.envs.summarize import CONTINUATION_TEMPLATE, continuation_messages, summary_threshold
from agentrl.laminar.buffer import ExperienceBuffer, GroupVersionError
from agentrl.laminar.relay import broadcast_time, optimal_broadcast_time, optimal_chunks
from agentrl.laminar.repack import RolloutLoad, best_fit_repack, repack_candidates
from agentrl.trainer.advantages import (
    broadcast_to_segments,
    drgrpo_advantages,
    grpo_advantages,
    otb_advantages,
    supo_advantages,
)
from agentrl.trainer.batch import build_batch
from agentrl.trainer.logprobs import sum_pi_sq_from_logits
from agentrl.trainer.losses import (
    aggregate_loss,
    behaviour_weights,
    decoupled_ppo_loss,
    exact_kl_from_logits,
    gspo_sequence_ratio,
    gspo_token_loss,
    k2,
    k3,
    ppo_clip_loss,
    trm_sequence_mask,
)
from agentrl.trainer.rewards import DynamicSampler, filter_groups, g_ra, overlong_penalty
from agentrl.types import Segment, Status, Trajectory

ROOT = Path(__file__).resolve().parent.parent
ATOL = 1e-5


def close(x, expected, atol: float = ATOL) -> None:
    x, want = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64)
    assert x.shape == want.shape, f"shape {tuple(x.shape)} != {tuple(want.shape)}"
    diff = (x - want).abs().max().item() if x.numel() else 0.0
    assert diff <= atol, f"{x.tolist()} != {want.tolist()} (max abs diff {diff:.3g} > {atol:g})"


def _traj(tid: str, gid: str, version: int, reward: float = 0.0, segments: int = 1) -> Trajectory:
    segs = []
    for _ in range(segments):
        seg = Segment(prompt_len=1)
        seg.append([1], policy=False)
        seg.append([2, 3], policy=True, logprobs=[-0.5, -0.5], version=version)
        segs.append(seg)
    return Trajectory(id=tid, group_id=gid, task_id=gid, segments=segs, status=Status.FINISHED,
                      reward=reward, outcome_reward=reward)


# -- §1.8 Laminar ------------------------------------------------------------------------------

def laminar_broadcast_latency() -> None:
    close(optimal_chunks(4, 1200, 1, 6), 20)
    close(broadcast_time(4, 20, 1200, 1, 6), 1452)
    close(optimal_broadcast_time(4, 1200, 1, 6), 1452)
    close(broadcast_time(4, 10, 1200, 1, 6), 1512)


def laminar_best_fit() -> None:
    table = [RolloutLoad("r1", 0.10, 0.15, 4), RolloutLoad("r2", 0.30, 0.35, 10),
             RolloutLoad("r3", 0.50, 0.60, 20), RolloutLoad("r4", 0.99, 0.99, 200),
             RolloutLoad("r5", 0.70, 0.65, 30)]
    assert [r.id for r in repack_candidates(table, 0.99, 64)] == ["r1", "r2", "r3"]
    plan = best_fit_repack(table, c_max=0.99, b=64)
    assert plan == [("r1", "r3"), ("r2", "r3")]
    load = {r.id: r for r in table}
    close(sum(load[s].c_used for s, _ in plan) + load["r3"].c_used, 0.90)
    assert sum(load[s].n_reqs for s, _ in plan) + load["r3"].n_reqs == 34


def laminar_staleness() -> None:
    t = _traj("t", "g", version=3)
    t.finished_version = 5
    assert t.staleness == 2


def laminar_group_atomicity() -> None:
    async def run() -> None:
        buf = ExperienceBuffer(group_size=4)
        for i in range(3):
            await buf.write(_traj(f"g-{i}", "g", version=2))
        assert await buf.ready() == 0  # not exposed before all 4 members
        await buf.write(_traj("g-3", "g", version=2))
        assert await buf.ready() == 1 and (await buf.sample(1))[0].version == 2
        for i in range(3):
            await buf.write(_traj(f"h-{i}", "h", version=2))
        with pytest.raises(GroupVersionError):
            await buf.write(_traj("h-3", "h", version=1))

    asyncio.run(run())


# -- §2.6 / §2.7 TRM ---------------------------------------------------------------------------

LOG_RHO = torch.tensor([[0.01, -0.02, 0.05, 0.00], [0.00, 0.40, -0.01, 0.02]])


def trm_sample_based() -> None:
    close(k2(LOG_RHO).amax(-1), [0.00125, 0.08])
    close(k3(LOG_RHO).mean(-1), [3.79984e-4, 0.0230190])
    mask = torch.ones(2, 4)
    for mode, d, d_avg in [("max", 0.05, 1.0), ("avg", 1.0, 0.001), ("both", 0.1, 0.002)]:
        assert trm_sequence_mask(mask, mode, d, d_avg, log_ratio=LOG_RHO).tolist() == [True, False]
    accept = trm_sequence_mask(mask, "max", 0.05, 0.0, log_ratio=LOG_RHO)
    kept = mask * accept.unsqueeze(-1)
    close(aggregate_loss(torch.ones(2, 4), kept, "seq-mean-token-sum", norm_mask=mask), 4 / 2)  # ÷ N=2
    close(aggregate_loss(torch.ones(2, 4), kept, "token-mean", norm_mask=mask), 4 / 8)  # "total"
    close(aggregate_loss(torch.ones(2, 4), kept, "token-mean"), 4 / 4)  # "accepted"


def trm_exact_kl() -> None:
    roll = torch.tensor([0.7, 0.2, 0.1]).log()
    close(exact_kl_from_logits(roll, torch.tensor([0.6, 0.3, 0.1]).log()), 0.0268125)
    close(exact_kl_from_logits(roll, torch.tensor([0.7, 0.29, 0.01]).log()), 0.155946)


def trm_ppo_leak() -> None:
    loss, clipped = ppo_clip_loss(torch.tensor(900.0), torch.tensor(-1.0), 0.2, 0.2)
    close(-loss, -900.0)
    assert not clipped
    close(k2(torch.tensor(math.log(900))), 23.1363, atol=1e-4)  # the doc prints 23.13 (truncated)
    assert not trm_sequence_mask(torch.ones(1, 1), "max", 0.1, 1.0, log_ratio=torch.tensor([[math.log(900)]]))


# -- §3.5 G-RA ---------------------------------------------------------------------------------

def gra() -> None:
    cases = [(-0.5, [0.1] * 3, -0.5, -0.2), (0.0, [0.1] * 2, 0.2, 0.2), (1.0, [0.1], 1.1, 1.1),
             (-1.0, [0.1] * 30, -1.0, 2.0)]
    for outcome, steps, gated, direct in cases:
        close(g_ra(outcome, steps, gate=0.0), gated)
        close(g_ra(outcome, steps, gate=None), direct)


# -- §4 SUPO -----------------------------------------------------------------------------------

def supo_broadcast() -> None:
    adv = supo_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]),
                          overlong=torch.zeros(4, dtype=torch.bool))
    close(broadcast_to_segments(adv, torch.tensor([0, 0, 0, 1, 2, 3])),
          [0.707106, 0.707106, 0.707106, -0.707106, 0, 0])


def supo_grpo_equivalence() -> None:
    close(grpo_advantages(torch.tensor([1.0, 0, 0]), torch.zeros(3, dtype=torch.long)),
          [1.154699, -0.577350, -0.577350])


def supo_trigger() -> None:
    L = summary_threshold(4096, 0.95)
    assert L == 3891 and 3880 < L <= 3880 + 30
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    assert continuation_messages(prompt, "S")[1]["content"] == "task" + CONTINUATION_TEMPLATE.format(summary="S")
    assert CONTINUATION_TEMPLATE.format(summary="S") == "\n\nWe are in the following stage of solving the problem:\nS"


def supo_overlong() -> None:
    adv = supo_advantages(torch.tensor([1.0, 0.0, 0.0]), torch.zeros(3, dtype=torch.long),
                          overlong=torch.tensor([False, False, True]))
    close(adv, [1.154699, -0.577350, 0.0])  # the overlong 0 still counts in mean/std


def supo_padding() -> None:
    trajs = [_traj(f"t{i}", "A", version=0, reward=float(i % 2)) for i in range(13)]
    b = build_batch(trajs, torch.ones(13), torch.zeros(13, dtype=torch.long), pad_to_multiple=8)
    assert len(b) == 16 and b.loss_mask[13:].sum() == 0


# -- §5.4 DAPO ---------------------------------------------------------------------------------

def dapo_clip_higher() -> None:
    for adv, ratio, objective in [(1, 1.35, 1.28), (1, 1.25, 1.25), (-1, 0.7, -0.8), (-1, 1.5, -1.5)]:
        loss, _ = ppo_clip_loss(torch.tensor(ratio), torch.tensor(float(adv)), 0.2, 0.28)
        close(-loss, objective)


def dapo_overlong() -> None:
    for length, value in [(10000, 0.0), (16384, 0.0), (16385, -0.000244141), (18432, -0.5), (20480, -1.0)]:
        close(overlong_penalty(length, 20480, 4096), value)
    assert overlong_penalty(20481, 20480, 4096) == -1.0
    assert overlong_penalty(100, 20480, 4096, truncated=True) == -1.0


def dapo_aggregation() -> None:
    per_token = torch.tensor([[2.0, 2, 0, 0, 0, 0], [1.0, 1, 1, 1, 1, 1]])
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    for mode, value in [("token-mean", 1.25), ("seq-mean-token-mean", 1.5), ("seq-mean-token-sum", 5.0)]:
        close(aggregate_loss(per_token, mask, mode), value)


def dapo_dynamic_sampling() -> None:
    batch = [[1, 1, 1, 1], [-1, -1, -1, -1], [1, -1, -1, 1]]
    assert filter_groups(batch, lambda g: g) == [[1, -1, -1, 1]]
    sampler = DynamicSampler(target=2, rewards_of=lambda g: g)
    assert not sampler.add(batch) and sampler.add(batch) and len(sampler.take()) == 2
    with pytest.raises(RuntimeError):
        DynamicSampler(target=2, rewards_of=lambda g: g, max_num_gen_batches=1).add(batch)


# -- §6.5 OTB ----------------------------------------------------------------------------------

def otb_proxy() -> None:
    z = torch.tensor([2.0, 1.0, 0.0])
    close(torch.softmax(z, -1), [0.665241, 0.244728, 0.090031])
    close(sum_pi_sq_from_logits(z), 0.510543)
    close(1 - 2 * torch.softmax(z, -1)[0] + sum_pi_sq_from_logits(z), 0.180061)


def otb_toy_group() -> None:
    pi = torch.tensor([[0.9, 0.5, 0.8], [0.4, 0.5, 1.0]])
    sq = torch.tensor([[0.82, 0.38, 0.68], [0.52, 0.5, 1.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    rewards = torch.tensor([[0, 0, 1.0], [0, 0, 0]])
    group = torch.zeros(2, dtype=torch.long)
    adv, _ = otb_advantages(rewards, mask, group, pi.log(), sq)
    close(adv[0], [0.972973, 0.753086, 0.0])
    close(adv[1, :2], [-0.0270270, -0.246914])
    adv_zt, _ = otb_advantages(rewards, mask, group, pi.log(), sq, zero_tail=True)
    close(adv_zt[0], [0.972973, 0.753086, 1.0])
    close(drgrpo_advantages(torch.tensor([1.0, 0.0]), group), [0.5, -0.5])  # the GRPO-without-std contrast


# -- §8 related methods ------------------------------------------------------------------------

def grpo_drgrpo() -> None:
    r, g = torch.tensor([1.0, 0, 0, 1]), torch.zeros(4, dtype=torch.long)
    close(grpo_advantages(r, g), [0.866024, -0.866024, -0.866024, 0.866024])
    close(drgrpo_advantages(r, g), [0.5, -0.5, -0.5, 0.5])
    close(grpo_advantages(torch.ones(4), g), [0.0] * 4)
    close(grpo_advantages(torch.tensor([0.7]), torch.tensor([0])), [0.7])  # G=1: verl's A = R


def areal_decoupled() -> None:
    for adv, objective in [(1.0, 1.44), (-1.0, -1.8)]:
        loss, _ = decoupled_ppo_loss(torch.tensor(math.log(0.9)), torch.tensor(math.log(0.6)),
                                     torch.tensor(math.log(0.5)), torch.tensor(adv), 0.2, 0.2)
        close(-loss, objective)


def tis() -> None:
    close(behaviour_weights(torch.tensor(math.log(0.3)), torch.tensor(math.log(0.1)), cap=None), 3.0)
    close(behaviour_weights(torch.tensor(math.log(0.3)), torch.tensor(math.log(0.1)), cap=2.0), 2.0)


def gspo() -> None:
    lr = torch.tensor([[0.01, -0.01, 0.3]])
    close(gspo_sequence_ratio(lr, torch.ones(1, 3)), [1.105171])
    loss, clipped = gspo_token_loss(lr, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3))
    close(-loss, [[1.0004] * 3])
    assert clipped.all()


@dataclass(frozen=True)
class Example:
    section: str
    what: str
    check: Callable[[], None] | None  # None: behavioural or not applicable (see `note`)
    tests: tuple[str, ...]  # "path::test_function" of the detailed test(s)
    note: str = ""


EXAMPLES = [
    Example("1.8.1", "relay chain broadcast latency 1452", laminar_broadcast_latency,
            ("tests/laminar/test_relay.py::test_latency_model_worked_example",)),
    Example("1.8.2", "Best-Fit repack plan, r3 ends at 0.90 / 34", laminar_best_fit,
            ("tests/laminar/test_repack.py::test_candidates_of_the_worked_example",
             "tests/laminar/test_repack.py::test_worked_example_plan")),
    Example("1.8.3", "inherent staleness 5 − 3 = 2", laminar_staleness,
            ("tests/laminar/test_buffer.py::test_staleness_tags",)),
    Example("1.8.4", "group atomicity G=4, one version tag", laminar_group_atomicity,
            ("tests/laminar/test_buffer.py::test_group_visible_only_when_complete",
             "tests/laminar/test_buffer.py::test_mixed_versions_are_rejected")),
    Example("1.8.5", "chain m→a→b→c, kill b → m→a→c, equal checksums", None,
            ("tests/laminar/test_relay.py::test_chain_rebuild_when_a_relay_dies_mid_broadcast",),
            "behavioural: needs live relays and a kill; no number to re-check"),
    Example("2.6a", "k2/k3 toy batch, TRM-Max/Avg/combined masks, divisor 2 and 8/4", trm_sample_based,
            ("tests/trainer/test_losses.py::test_k2_k3_values_26a", "tests/trainer/test_losses.py::test_trm_masks_26a",
             "tests/trainer/test_losses.py::test_trm_divisor_rule_26a")),
    Example("2.6b", "exact KL 0.0268125 accepted, 0.155946 rejected", trm_exact_kl,
            ("tests/trainer/test_losses.py::test_trm_exact_kl_26b",)),
    Example("2.6c", "bound calculator table (1677.31 … 79.91, 113.838)", None, (),
            "not applicable: the bound calculators (trainer/bounds.py) were used by no training path and were "
            "removed (issue 55); trust-region masking itself is 2.6a/2.6b"),
    Example("2.6d", "PPO leak ρ=900: objective −900, k2 = 23.13", trm_ppo_leak,
            ("tests/trainer/test_losses.py::test_ppo_leak_and_dual_clip_26d",)),
    Example("2.7", "unified bound ≤ 4.1, 409× tighter than 1677", None, (),
            "not applicable: a theoretical bound, computed by trainer/bounds.py, which no training path used "
            "(removed, issue 55)"),
    Example("3.5", "G-RA −0.5 / 0.2 / 1.1 / −1.0 vs D-RA −0.2 / 2.0", gra,
            ("tests/trainer/test_rewards.py::test_gra_35",)),
    Example("4.5.1", "SUPO advantage broadcast ±0.707106 over rollouts", supo_broadcast,
            ("tests/trainer/test_advantages.py::test_supo_broadcast_stats_over_rollouts_45_test1",
             "tests/trainer/test_batch.py::test_segments_become_rows_sharing_the_rollout_advantage_45")),
    Example("4.5.2", "GRPO equivalence [1.154699, −0.577350, −0.577350]", supo_grpo_equivalence,
            ("tests/trainer/test_advantages.py::test_supo_grpo_equivalence_45_test2",)),
    Example("4.5.3", "trigger L=3891, 3880+30 fires, continuation prompt", supo_trigger,
            ("tests/rollout/test_summarize.py::test_threshold_matches_spec",
             "tests/rollout/test_summarize.py::test_supo_trigger_drops_last_pair_and_restarts")),
    Example("4.5.4", "overlong: mask 0, reward still in group stats", supo_overlong,
            ("tests/trainer/test_advantages.py::test_supo_overlong_masked_but_counted_45_test4",
             "tests/rollout/test_summarize.py::test_overlong_after_max_summaries_masks_but_counts_in_group")),
    Example("4.5.5", "padding 13 rows → 16, 3 dummy rows masked", supo_padding,
            ("tests/trainer/test_batch.py::test_padding_rows_45_test5",)),
    Example("5.4.1", "clip-higher 1.28 / 1.25 / −0.8 / −1.5", dapo_clip_higher,
            ("tests/trainer/test_losses.py::test_clip_higher_54",)),
    Example("5.4.2", "soft overlong punishment 0 … −0.5 … −1", dapo_overlong,
            ("tests/trainer/test_rewards.py::test_overlong_shaping_54",)),
    Example("5.4.3", "aggregation 1.25 / 1.5 / 5", dapo_aggregation,
            ("tests/trainer/test_losses.py::test_aggregation_modes_54",)),
    Example("5.4.4", "dynamic sampling: keep [1,−1,−1,1], 2 generations, error at max 1", dapo_dynamic_sampling,
            ("tests/trainer/test_rewards.py::test_dynamic_sampling_filter_54",
             "tests/trainer/test_rewards.py::test_dynamic_sampler_refill_and_error_54")),
    Example("6.5.1", "logit-gradient proxy 0.180061, Σπ² 0.510543", otb_proxy,
            ("tests/trainer/test_logprobs.py::test_otb_proxy_example",)),
    Example("6.5.2", "OTB toy group [0.972973, 0.753086, 0(1)], [−0.027027, −0.246914]", otb_toy_group,
            ("tests/trainer/test_advantages.py::test_otb_toy_group_65",)),
    Example("7.3", "DVP safe set {0,1}, mass 0.0368032, log π̃, (1−p) bound", None, (),
            "not applicable: DVP (trainer/dvp.py, inferred from an abstract) was used by no training path and "
            "was removed (issue 55)"),
    Example("8.1", "GRPO ±0.866024, Dr.GRPO ±0.5, all-equal 0, G=1 → A=R", grpo_drgrpo,
            ("tests/trainer/test_advantages.py::test_grpo_unbiased_std_81", "tests/trainer/test_advantages.py::test_drgrpo_81",
             "tests/trainer/test_advantages.py::test_all_equal_group_is_zero_and_groups_are_independent",
             "tests/trainer/test_advantages.py::test_singleton_convention_flagged_81")),
    Example("8.2a", "AReaL decoupled objective 1.44 / −1.8", areal_decoupled,
            ("tests/trainer/test_losses.py::test_areal_decoupled_82",)),
    Example("8.2b", "AReaL staleness admission B=4, η=1 → 8, 12", None, (),
            "not applicable: agentrl follows Laminar, which bounds no staleness (§1.3); the admission rule "
            "(trainer/staleness.py) was used by no training path and was removed (issue 55)"),
    Example("8.3", "TIS weight 3.0 truncated to 2.0, detached", tis,
            ("tests/trainer/test_losses.py::test_tis_weight_truncated_and_detached_83",)),
    Example("8.4", "GSPO s = e^0.1 = 1.105171, clipped to 1.0004", gspo,
            ("tests/trainer/test_losses.py::test_gspo_sequence_ratio_and_clip_84",)),
    Example("8.5", "APRIL over-provision, abort, resume with two version tags", None, (),
            "not applicable: agentrl follows Laminar, where a trajectory never mixes weight versions "
            "(Trajectory.version and ExperienceBuffer reject mixed versions, §1.2); there is no "
            "over-provision/abort/resume-with-new-weights code to test"),
]


def _ids(examples: list[Example]) -> list[str]:
    return [e.section for e in examples]


CHECKED = [e for e in EXAMPLES if e.check is not None]


@pytest.mark.parametrize("example", CHECKED, ids=_ids(CHECKED))
def test_headline_number(example: Example) -> None:
    example.check()


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids(EXAMPLES))
def test_every_example_points_at_existing_tests(example: Example) -> None:
    if not example.tests:
        assert example.check is None and example.note.startswith("not applicable"), example.section
    for ref in example.tests:
        path, name = ref.split("::")
        tree = ast.parse((ROOT / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert name in names, f"§{example.section}: {ref} does not exist"


def test_sections_are_unique_and_cover_every_unit_test_section() -> None:
    sections = [e.section for e in EXAMPLES]
    assert len(sections) == len(set(sections))
    for prefix in ("1.8", "2.6", "2.7", "3.5", "4.5", "5.4", "6.5", "7.3", "8.1", "8.2", "8.3", "8.4", "8.5"):
        assert any(s.startswith(prefix) for s in sections), prefix
