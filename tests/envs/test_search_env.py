"""The search env: ISO corpus, generated questions, BM25 and the remote retriever, EM/F1 reward."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from agentrl.config import load_config
from agentrl.env import make
from agentrl.envcheck import check_env
from agentrl.envs.search import SearchEnv
from agentrl.envs.search.corpus import build_corpus, load_records
from agentrl.envs.search.questions import generate_questions, iter_questions
from agentrl.envs.search.retriever import (
    BM25Retriever,
    RemoteRetriever,
    RetrieverError,
    parse_contents,
    parse_hit,
)
from agentrl.envs.search.scoring import exact_match, normalize_answer, token_f1
from agentrl.envs.search.server import RetrievalServer


@pytest.fixture(scope="module")
def bm25(tmp_path_factory: pytest.TempPathFactory) -> BM25Retriever:
    retriever = BM25Retriever(cache_dir=tmp_path_factory.mktemp("bm25"))
    retriever.index()
    return retriever


@pytest.fixture(scope="module")
def server(bm25: BM25Retriever):
    with RetrievalServer(bm25, host="127.0.0.1", port=0) as srv:
        yield srv


# -- corpus and questions ----------------------------------------------------------------------


def test_corpus_has_one_document_per_record_with_stable_ids() -> None:
    r = load_records()
    docs = {d.id: d for d in build_corpus()}
    assert len(docs) == len(r.countries) + len(r.subdivisions) + len(r.currencies) + len(r.languages)
    assert "alpha-3 code NOR" in docs["country/NO"].text
    assert "Norwegian Krone (ISO 4217 code NOK)" in docs["country/NO"].text  # ISO 4217 link
    assert "of Norway" in docs["subdivision/NO-03"].text
    assert docs["language/hun"].text.startswith("Hungarian") and "code hu" in docs["language/hun"].text


def test_questions_are_deterministic_disjoint_and_balanced() -> None:
    train, test = generate_questions("train", seed=0), generate_questions("test", seed=0)
    assert train == generate_questions("train", seed=0)
    assert [q["id"] for q in train] != [q["id"] for q in generate_questions("train", seed=1)]
    assert not {q["id"] for q in train} & {q["id"] for q in test}
    subjects = lambda qs: {q["id"].split("/", 2)[2] for q in qs}  # noqa: E731
    assert not subjects(train) & subjects(test)  # a record's questions all land in one split
    assert len({q["kind"] for q in train[:20]}) >= 10  # interleaved kinds
    assert {1, 2} <= {q["hops"] for q in test}


def test_question_answers_match_records() -> None:
    qs = {q["id"]: q for q in iter_questions(load_records())}
    assert qs["search/country_alpha3/country/NO"]["answers"] == ["NOR"]
    assert qs["search/currency_of_alpha3/country/NO"]["answers"] == ["NOK"]
    assert qs["search/currency_numeric_of_country/country/NO"]["answers"] == ["578"]
    assert qs["search/country_of_subdivision/subdivision/AD-02"]["answers"][0] == "Andorra"
    assert "Bolivia" in qs["search/country_by_alpha3/country/BO"]["answers"]


def test_bad_split_and_kind_are_named() -> None:
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        generate_questions("dev")
    with pytest.raises(ValueError, match="unknown question kinds"):
        generate_questions("train", kinds=["capital_of"])


# -- scoring -----------------------------------------------------------------------------------


def test_exact_match_and_f1() -> None:
    assert normalize_answer("  The Kingdom of  NORWAY!") == "kingdom of norway"
    assert exact_match("the nok.", ["NOK"]) == 1.0
    assert exact_match("NOR", ["NOK"]) == 0.0
    assert exact_match("an", ["an"]) == 1.0 and exact_match("", ["an"]) == 0.0  # Aragonese
    assert token_f1("Kingdom of Norway", ["Norway"]) == pytest.approx(0.5)  # P=1/3, R=1
    assert token_f1("Bolivia", ["Bolivia, Plurinational State of", "Bolivia"]) == 1.0
    assert token_f1("", ["x"]) == 0.0


# -- retrieval ---------------------------------------------------------------------------------


def test_bm25_finds_the_subject_document(bm25: BM25Retriever) -> None:
    assert bm25.retrieve_sync(["Norway alpha-3 code"], 3)[0][0].id == "country/NO"
    assert bm25.retrieve_sync(["Liberecky kraj"], 1)[0][0].id == "subdivision/CZ-51"  # accent folding
    assert bm25.retrieve_sync(["zzzz qqqq"], 3) == [[]]
    hits = bm25.retrieve_sync(["Canillo"], 5)[0]
    assert hits[0].id == "subdivision/AD-02" and all(h.score > 0 for h in hits)
    with pytest.raises(ValueError, match="k must be >= 1"):
        bm25.retrieve_sync(["x"], 0)


def test_bm25_recall_on_single_hop_questions(bm25: BM25Retriever) -> None:
    qs = [q for q in generate_questions("test") if q["kind"] == "country_of_subdivision"][:200]
    hits = bm25.retrieve_sync([q["question"] for q in qs], 3)
    found = sum(q["id"].split("/", 2)[2] in {h.id for h in hs} for q, hs in zip(qs, hits))
    assert found / len(qs) > 0.9


def test_bm25_index_is_cached_on_disk(bm25: BM25Retriever) -> None:
    cached = list(bm25.cache_dir.glob("bm25-*"))
    assert [p.name for p in cached] == [f"bm25-{bm25.digest}"]
    again = BM25Retriever(cache_dir=bm25.cache_dir)
    assert again.retrieve_sync(["Norway"], 2) == bm25.retrieve_sync(["Norway"], 2)


def test_parse_contents_search_r1_layout() -> None:
    doc = parse_contents("x", '"Oslo"\nOslo is a county.')
    assert (doc.title, doc.text) == ("Oslo", "Oslo is a county.")
    assert parse_contents("y", "plain text").text == "plain text"


def test_server_speaks_search_r1_protocol(server: RetrievalServer) -> None:
    reply = httpx.post(server.url + "/retrieve", json={"queries": ["Norway alpha-3", "Canillo"], "topk": 2,
                                                       "return_scores": True}).json()
    assert len(reply["result"]) == 2 and len(reply["result"][0]) == 2
    first = reply["result"][0][0]
    assert first["document"]["id"] == "country/NO" and first["document"]["contents"].startswith('"Norway"\n')
    plain = httpx.post(server.url + "/retrieve", json={"queries": ["Canillo"], "topk": 1}).json()
    assert set(plain["result"][0][0]) == {"id", "contents"}
    bad = httpx.post(server.url + "/retrieve", json={"queries": "Norway"})
    assert bad.status_code == 400 and "queries" in bad.json()["error"]
    bad = httpx.post(server.url + "/retrieve", content=b"{not json")
    assert bad.status_code == 400
    assert httpx.get(server.url + "/health").json()["documents"] == len(build_corpus())


async def test_remote_retriever_matches_local(server: RetrievalServer, bm25: BM25Retriever) -> None:
    remote = RemoteRetriever(server.url)
    queries = ["Norway alpha-3 code", "Hungarian language", "Tarija"]
    got = await remote.retrieve(queries, 3)
    want = bm25.retrieve_sync(queries, 3)
    assert [[h.id for h in hs] for hs in got] == [[h.id for h in hs] for hs in want]
    assert (await remote.open("currency/NOK")).title == "Norwegian Krone"  # via /documents
    assert await remote.open("country/XX") is None


async def test_remote_retriever_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="must start with http"):
        RemoteRetriever("127.0.0.1:1")
    with pytest.raises(RetrieverError, match="unreachable"):
        await RemoteRetriever("http://127.0.0.1:9", timeout=2).search("x", 1)


def test_server_reply_is_json_serialisable_unicode(server: RetrievalServer) -> None:
    reply = httpx.post(server.url + "/retrieve", json={"queries": ["Babək"], "topk": 1})
    assert json.loads(reply.content)["result"][0][0]["id"] == "subdivision/AZ-BAB"


# -- the env, driven by scripted agents through its tools -----------------------------------------

_HIT = re.compile(r"\[\d+\] id=(\S+) (.*)\n(.*)")


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def search_hits(env: SearchEnv, query: str) -> list[tuple[str, str, str]]:
    result = await env.astep(call("search", query=query, k=5))
    return _HIT.findall(result.observation[0]["content"])


async def solve_alpha3_of_subdivision(env: SearchEnv, task: dict) -> float:
    """A two-hop scripted agent: subdivision → its country (by name) → the country's alpha-3 code."""
    await env.areset(task)
    name = re.fullmatch(r".*the subdivision (.+)\?", task["question"]).group(1)
    text = next((t for _, title, t in await search_hits(env, name) if title == name), "")
    country = re.search(r" of (.+?) with ISO 3166-2 code", text)
    answer = ""
    if country:
        doc_id = next((i for i, title, _ in await search_hits(env, f"{country.group(1)} alpha-3 code")
                       if title == country.group(1)), "")
        opened = (await env.astep(call("open", doc_id=doc_id))).observation[0]["content"]
        code = re.search(r"alpha-3 code (\w+)", opened)
        answer = code.group(1) if code else ""
    result = await env.astep(call("answer", text=answer))
    assert result.terminated
    return result.info["outcome_reward"]


async def test_scripted_agent_answers_multi_hop_questions(bm25: BM25Retriever) -> None:
    env = SearchEnv(retriever=bm25, kinds=["alpha3_of_subdivision_country"])
    tasks = env.tasks("test")[:30]
    rewards = [await solve_alpha3_of_subdivision(env, t) for t in tasks]
    assert sum(rewards) / len(rewards) >= 0.9


async def test_scripted_agent_through_the_remote_retriever(server: RetrievalServer) -> None:
    env = SearchEnv(retriever="remote", url=server.url, kinds=["alpha3_of_subdivision_country"])
    assert isinstance(env.retriever, RemoteRetriever)
    rewards = [await solve_alpha3_of_subdivision(env, t) for t in env.tasks("test")[:5]]
    assert sum(rewards) >= 4


async def test_reward_em_f1_and_no_answer(bm25: BM25Retriever) -> None:
    task = {"id": "q", "question": "Which country has the subdivision Oslo?", "answers": ["Norway"]}
    for kind, expected in (("em", 0.0), ("f1", 2 / 3)):
        env = SearchEnv(retriever=bm25, reward=kind)
        messages = await env.areset(task)
        assert messages[1]["content"] == "Question: Which country has the subdivision Oslo?"
        result = await env.astep(call("answer", text="Norway county"))
        assert result.info["outcome_reward"] == pytest.approx(expected)
        assert result.info["reward_components"]["f1"] == pytest.approx(2 / 3)
    env = SearchEnv(retriever=bm25, max_turns=1)
    await env.areset(task)
    result = await env.astep(call("search", query="Oslo"))
    assert result.truncated and result.info["reward_components"] == {"reward": 0.0, "answered": 0.0,
                                                                     "em": 0.0, "f1": 0.0}


async def test_open_unknown_document_is_an_observation(bm25: BM25Retriever) -> None:
    env = SearchEnv(retriever=bm25)
    await env.areset(env.tasks("train")[0])
    result = await env.astep(call("open", doc_id="country/XX"))
    assert "no document with id 'country/XX'" in result.observation[0]["content"]
    assert not result.terminated


def test_bad_env_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="unknown search reward 'bleu'"):
        SearchEnv(reward="bleu")
    with pytest.raises(ValueError, match="needs url="):
        SearchEnv(retriever="remote")
    with pytest.raises(ValueError, match="retriever must be one of local, remote"):
        SearchEnv(retriever="elastic")


def test_config_builds_the_env() -> None:
    cfg = load_config(env="search", overrides=["env.kwargs.reward=f1", "env.kwargs.max_hops=1"])
    env = make("search", **cfg.env.kwargs, max_turns=cfg.env.max_turns)
    try:
        assert isinstance(env, SearchEnv) and env.reward_kind == "f1" and env.max_turns == cfg.env.max_turns
        assert {t["hops"] for t in env.tasks("test")} == {1}
    finally:
        env.close()


def test_env_check_passes() -> None:
    report = check_env("search")
    assert report.ok, str(report)


def test_hits_in_both_search_r1_layouts() -> None:
    scored = parse_hit({"document": {"id": "d1", "contents": '"T"\nbody'}, "score": 2.5})
    bare = parse_hit({"id": "d2", "contents": "just text"})
    assert (scored.id, scored.title, scored.text, scored.score) == ("d1", "T", "body", 2.5)
    assert (bare.id, bare.title, bare.text, bare.score) == ("d2", "", "just text", 0.0)
    with pytest.raises(RetrieverError, match="without 'contents'"):
        parse_hit({"id": "d3"})


def test_server_command_line(tmp_path) -> None:
    env = {**os.environ, "AGENTRL_CACHE": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.envs.search.server", "--port", "0"], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
        hits = httpx.post(url + "/retrieve", json={"queries": ["Oslo county"], "topk": 1}, timeout=10).json()
        assert hits["result"][0][0]["id"] == "subdivision/NO-03"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
