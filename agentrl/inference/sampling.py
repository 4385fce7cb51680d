"""Token sampling with the log-probs of the distribution actually sampled from.

The behaviour policy π_roll of algorithms.md §0 (notation table) and §7.2 is the *processed*
distribution: logits / temperature, then nucleus (top-p) filtering and renormalisation. These
are the log-probs vLLM returns with `logprobs_mode="processed_logprobs"`; the hf engine returns
the same, so importance ratios against the trainer are taken against what was really sampled.
"""

from __future__ import annotations

import torch


def processed_logprobs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Log-probs of the processed distribution, one row per sequence.

    logits (B, V); temperature (B,), 0 meaning greedy (the row is left at temperature 1, its
    log-probs are then those of the unscaled model); top_p (B,) in (0, 1].
    Nucleus rule as in vLLM (Holtzman et al. 2020, "The Curious Case of Neural Text
    Degeneration"): keep a token when the mass of strictly more probable tokens is < p, so the
    most probable token always survives; the kept set is renormalised (algorithms.md §7.2,
    π̃ = π·1[v∈V]/Σ_{u∈V}π(u)). Removed tokens get -inf.
    """
    logits = logits.float()
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    logp = torch.log_softmax(logits / temp[:, None], dim=-1)
    if bool((top_p >= 1).all()):
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()
    drop_sorted = mass_before >= top_p.float()[:, None]
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def sample_tokens(logp: torch.Tensor, greedy: list[bool],
                  generators: list[torch.Generator]) -> tuple[list[int], list[float]]:
    """Draw one token per row from processed log-probs `logp` (B, V) with that row's generator
    (so a seeded request is reproducible whatever else shares its batch); greedy rows take the
    argmax. Returns the tokens and their log-probs under `logp`."""
    if logp.device.type != "cpu":
        logp = logp.cpu()  # the rows' generators are CPU ones, seeded per request (one B x V copy a step)
    tokens: list[int] = []
    for row, is_greedy, gen in zip(logp, greedy, generators):
        if is_greedy:
            tokens.append(int(row.argmax()))
        else:
            tokens.append(int(torch.multinomial(row.exp(), 1, generator=gen)))
    picked = logp[torch.arange(len(tokens)), torch.tensor(tokens)]
    return tokens, picked.tolist()
