"""segments_from_samples: the append/step-wise rule both the rollout engine and the endpoint use."""

from agentrl.rollout.stepwise import APPEND, STEPWISE, Sample, segments_from_samples


def _sample(prompt, completion, version=3):
    return Sample(prompt_ids=prompt, completion_ids=completion, logprobs=[-0.5] * len(completion),
                  version=version, text="x")


def test_requests_that_extend_each_other_make_one_masked_row():
    first = _sample([1, 2, 3], [4, 5])
    second = _sample([1, 2, 3, 4, 5, 9, 9], [6])
    segments, mode = segments_from_samples([first, second])
    assert mode == APPEND and len(segments) == 1
    seg = segments[0]
    assert seg.token_ids == [1, 2, 3, 4, 5, 9, 9, 6]
    assert seg.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert seg.logprobs == [0, 0, 0, -0.5, -0.5, 0, 0, -0.5]
    assert [(t.action_start, t.action_end, t.obs_start, t.obs_end) for t in seg.turns] == [(3, 5, 5, 7), (7, 8, 0, 0)]
    seg.check()


def test_a_rewritten_history_makes_one_row_per_request_with_only_its_own_samples():
    first = _sample([1, 2, 3], [7, 4, 5])  # 7: a <think> token the template drops later
    second = _sample([1, 2, 3, 4, 5, 9], [6])
    segments, mode = segments_from_samples([first, second])
    assert mode == STEPWISE and len(segments) == 2
    assert segments[0].token_ids == [1, 2, 3, 7, 4, 5] and segments[0].loss_mask == [0, 0, 0, 1, 1, 1]
    assert segments[1].token_ids == [1, 2, 3, 4, 5, 9, 6] and segments[1].loss_mask == [0] * 6 + [1]
    assert all(s.prompt_len == len(p.prompt_ids) for s, p in zip(segments, [first, second]))
