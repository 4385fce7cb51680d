"""Demonstrations of the `search` env (issue 13): the retrieval path a careful agent takes for a
question — search for the subject, open the linked record on multi-hop questions (or, in some
variants, the subject's own record to confirm), then answer. Queries are paraphrased per seed."""

from __future__ import annotations

import random
from collections.abc import Callable

from agentrl.envs.search.corpus import Records, load_records
from agentrl.parsing import ToolCall
from agentrl.types import Task


def _subject(task: Task) -> tuple[str, str]:
    """("country", "NO") from the id search/<kind>/country/NO."""
    _, _, rest = task["id"].split("/", 2)
    kind, _, key = rest.partition("/")
    return kind, key


def _queries(name: str, what: str) -> list[str]:
    return [name, f"{name} {what}", f"{what} {name}", f"{name} ISO record"]


def search_path(task: Task, records: Records, rng: random.Random) -> tuple[list[str], list[str]]:
    """(queries, doc ids to open) for one question."""
    kind, key = _subject(task)
    q = task["kind"]
    if kind == "country":
        c = records.countries[key]
        if q == "country_by_alpha3":
            return [rng.choice([c.alpha_3, f"alpha-3 code {c.alpha_3}", f"{c.alpha_3} country"])], []
        if q == "currency_of_alpha3":
            return [rng.choice([c.alpha_3, f"alpha-3 code {c.alpha_3}"])], [f"country/{key}"]
        if q == "currency_numeric_of_country":
            return [rng.choice(_queries(c.name, "currency"))], [f"currency/{c.currency}"]
        opened = [f"country/{key}"] if rng.random() < 0.3 else []
        return [rng.choice(_queries(c.name, "country code"))], opened
    if kind == "subdivision":
        s = records.subdivisions[key]
        if q == "country_of_subdivision":
            return [rng.choice(_queries(s.name, "subdivision"))], [f"subdivision/{key}"]
        return [rng.choice(_queries(s.name, "subdivision"))], [f"country/{s.country}"]
    if kind == "currency":
        cur = records.currencies[key]
        return [rng.choice(_queries(cur.name, "currency code"))], []
    lang = records.languages[key]
    return [rng.choice(_queries(lang.name, "language"))], []


def search_demonstration(task: Task, format_call: Callable[[ToolCall], str], seed: int = 0) -> list[str]:
    """The actions of one demonstration of `task` (variant `seed`)."""
    rng = random.Random(f"{task['id']}/{seed}")
    queries, opened = search_path(task, load_records(), rng)
    actions = [format_call(ToolCall("search", {"query": query})) for query in queries]
    actions += [format_call(ToolCall("open", {"doc_id": doc})) for doc in opened]
    actions.append(format_call(ToolCall("answer", {"text": task["answers"][0]})))
    return actions
