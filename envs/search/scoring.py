"""Answer scoring for the search env: exact match and token F1.

Normalisation and both metrics follow the SQuAD v1.1 evaluation script (Rajpurkar et al. 2016,
"SQuAD: 100,000+ Questions for Machine Comprehension of Text"), which Search-R1 also uses for
its outcome reward: lower-case, drop punctuation, drop the articles a/an/the, squeeze spaces.
With several gold answers the best score counts.

`score` adds one guard the SQuAD script has no need for (it scores humans, not a policy that
optimises it): an answer far longer than every gold answer is a list of guesses, and token F1
would pay it for the gold tokens it happens to contain, so it scores 0 ("as short as possible").
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces.

    An answer that is nothing but an article keeps it: "an" is Aragonese's ISO 639-1 code,
    and an empty prediction must not match it."""
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split()) or " ".join(text.split())


def exact_match(prediction: str, golds: list[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golds: list[str]) -> float:
    """Max over golds of the harmonic mean of token precision and recall (SQuAD F1)."""
    pred = normalize_answer(prediction).split()
    return max((_f1(pred, normalize_answer(g).split()) for g in golds), default=0.0)


MAX_EXTRA_TOKENS = 8  # an answer may be this many normalised tokens longer than ...
MAX_LENGTH_RATIO = 3  # ... this many times the longest gold answer, and no longer


def is_guess_list(prediction: str, golds: list[str]) -> bool:
    """Whether `prediction` is too long to be one answer (see the module docstring)."""
    longest = max((len(normalize_answer(g).split()) for g in golds), default=1)
    return len(normalize_answer(prediction).split()) > MAX_LENGTH_RATIO * longest + MAX_EXTRA_TOKENS


def score(prediction: str, golds: list[str]) -> tuple[float, float]:
    """(exact match, token F1) of a policy's answer; both 0 for a list of guesses."""
    if is_guess_list(prediction, golds):
        return 0.0, 0.0
    return exact_match(prediction, golds), token_f1(prediction, golds)
