"""Generated single- and multi-hop questions over the ISO records, with exact answers.

Every question is answerable from the corpus (`corpus.py`): single-hop ones from one document,
multi-hop ones by chaining two (subdivision → country → currency). Questions whose subject
name is ambiguous (two subdivisions called "Georgia", a subdivision named like a country) are
left out, so every gold answer is the only right one.

The split is a hash of the subject record, so all questions about one country (or subdivision,
currency, language) land in the same split and the test split asks about unseen records.
Within a split the order is a seeded shuffle per question kind, interleaved round-robin so any
prefix mixes all kinds.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections import Counter
from collections.abc import Iterator

from agentrl.envs.search.corpus import Country, Records, load_records
from agentrl.types import Task

SPLITS = ("train", "test")
TEST_PERCENT = 10
_RESERVED_CURRENCIES = {"XTS", "XXX"}  # ISO 4217 testing / "no currency" codes


def _split_of(subject: str) -> str:
    bucket = int(hashlib.sha256(subject.encode()).hexdigest(), 16) % 100
    return "test" if bucket < TEST_PERCENT else "train"


def _numeric_answers(code: str) -> list[str]:
    return list(dict.fromkeys([code, str(int(code))]))  # "068" and "68"


def _q(kind: str, subject: str, question: str, answers: list[str], hops: int) -> Task:
    return {"id": f"search/{kind}/{subject}", "kind": kind, "question": question,
            "answers": answers, "hops": hops, "split": _split_of(subject)}


def _country_questions(c: Country, r: Records) -> Iterator[Task]:
    subject = f"country/{c.alpha_2}"
    yield _q("country_alpha3", subject, f"What is the ISO 3166-1 alpha-3 code of {c.name}?",
             [c.alpha_3], 1)
    yield _q("country_alpha2", subject, f"What is the ISO 3166-1 alpha-2 code of {c.name}?",
             [c.alpha_2], 1)
    yield _q("country_numeric", subject, f"What is the ISO 3166-1 numeric code of {c.name}?",
             _numeric_answers(c.numeric), 1)
    yield _q("country_by_alpha3", subject,
             f"Which country has the ISO 3166-1 alpha-3 code {c.alpha_3}?", list(c.names), 1)
    if c.currency:
        cur = r.currencies[c.currency]
        yield _q("currency_of_alpha3", subject,
                 f"What is the ISO 4217 currency code of the country whose alpha-3 code is {c.alpha_3}?",
                 [cur.code], 2)
        yield _q("currency_numeric_of_country", subject,
                 f"What is the ISO 4217 numeric code of the currency of {c.name}?",
                 _numeric_answers(cur.numeric), 2)


def iter_questions(r: Records) -> Iterator[Task]:
    """Every question the records support, in record order."""
    for c in r.countries.values():
        yield from _country_questions(c, r)

    sub_names = Counter(s.name for s in r.subdivisions.values())
    country_names = {n for c in r.countries.values() for n in c.names}
    for s in r.subdivisions.values():
        if sub_names[s.name] > 1 or s.name in country_names:
            continue
        c = r.countries[s.country]
        subject = f"subdivision/{s.code}"
        yield _q("country_of_subdivision", subject,
                 f"Which country has the subdivision {s.name}?", list(c.names), 1)
        yield _q("alpha3_of_subdivision_country", subject,
                 f"What is the ISO 3166-1 alpha-3 code of the country that has the subdivision {s.name}?",
                 [c.alpha_3], 2)
        if c.currency:
            yield _q("currency_of_subdivision_country", subject,
                     f"What is the ISO 4217 code of the currency of the country that has the "
                     f"subdivision {s.name}?", [c.currency], 2)

    cur_names = Counter(c.name for c in r.currencies.values())
    for cur in r.currencies.values():
        if cur_names[cur.name] == 1 and cur.code not in _RESERVED_CURRENCIES:
            yield _q("currency_code", f"currency/{cur.code}",
                     f"What is the ISO 4217 code of the currency {cur.name}?", [cur.code], 1)

    for lang in r.languages.values():
        yield _q("language_code", f"language/{lang.alpha_3}",
                 f"What is the ISO 639-1 code of the {lang.name} language?", [lang.alpha_2], 1)


def generate_questions(split: str = "train", seed: int = 0, kinds: list[str] | None = None,
                       max_hops: int | None = None) -> list[Task]:
    """The questions of one split in a seeded, deterministic order.

    `kinds` keeps only those question kinds; `max_hops=1` keeps single-hop questions only.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    found = _questions(split, seed, None if kinds is None else tuple(kinds), max_hops)
    return [{**q, "answers": list(q["answers"])} for q in found]  # copies: callers may mutate tasks


@functools.lru_cache(maxsize=16)
def _questions(split: str, seed: int, kinds: tuple[str, ...] | None, max_hops: int | None) -> tuple[Task, ...]:
    by_kind: dict[str, list[Task]] = {}
    for q in iter_questions(load_records()):
        if q["split"] == split and (max_hops is None or q["hops"] <= max_hops):
            by_kind.setdefault(q["kind"], []).append(q)
    if kinds is not None:
        unknown = sorted(set(kinds) - set(by_kind))
        if unknown:
            raise ValueError(f"unknown question kinds {unknown}; known: {', '.join(sorted(by_kind))}")
        by_kind = {k: by_kind[k] for k in kinds}
    rng = random.Random(seed)
    for kind in sorted(by_kind):
        rng.shuffle(by_kind[kind])
    rounds = itertools.zip_longest(*(by_kind[k] for k in sorted(by_kind)))
    return tuple(q for row in rounds for q in row if q is not None)
