"""Retrievers for the search env: a local BM25 index and a client for a remote retrieval server.

Both speak the same small interface (`search`, `open`, batched `retrieve`), so the env does not
care where documents come from. The remote protocol is Search-R1's retrieval server
(`POST /retrieve {"queries": [...], "topk": k, "return_scores": true}` →
`{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`; without scores each hit
is the bare `{"id", "contents"}`), plus one extension our server adds for `open`:
`POST /documents {"ids": [...]}` → `{"result": [{"id", "contents"} | null, ...]}`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import bm25s
import httpx
import numpy as np

from agentrl.envs.search.corpus import Document, build_corpus

log = logging.getLogger(__name__)
_TOKEN = re.compile(r"\w+")
_TOKENIZER_VERSION = "casefold-nfkd-w+-v1"  # part of the cache key: change it when _tokenize changes


class RetrieverError(RuntimeError):
    """The retrieval backend failed (unreachable server, bad reply)."""


@dataclass(frozen=True)
class Hit:
    id: str
    title: str
    text: str
    score: float

    def snippet(self, max_chars: int = 240) -> str:
        return self.text if len(self.text) <= max_chars else self.text[: max_chars - 1] + "…"


def _tokenize(text: str) -> list[str]:
    """Case- and accent-insensitive word tokens ("Liberecký" matches "liberecky")."""
    folded = unicodedata.normalize("NFKD", text.casefold())
    return _TOKEN.findall("".join(ch for ch in folded if not unicodedata.combining(ch)))


def parse_contents(doc_id: str, contents: str) -> Document:
    """Split Search-R1's `"Title"\\ntext` contents into a Document (plain text gets no title)."""
    first, sep, rest = contents.partition("\n")
    if sep and len(first) >= 2 and first.startswith('"') and first.endswith('"'):
        return Document(doc_id, first[1:-1], rest)
    return Document(doc_id, "", contents)


def cache_root() -> Path:
    """agentrl's cache dir: $AGENTRL_CACHE, else ~/.cache/agentrl."""
    return Path(os.environ.get("AGENTRL_CACHE", "~/.cache/agentrl")).expanduser()


class Retriever(Protocol):
    async def retrieve(self, queries: list[str], k: int) -> list[list[Hit]]: ...

    async def search(self, query: str, k: int) -> list[Hit]: ...

    async def open(self, doc_id: str) -> Document | None: ...


class BM25Retriever:
    """BM25 (Okapi, via `bm25s`) over a list of documents, built at first use and cached on disk
    under `<cache>/search/bm25-<digest of the corpus>/`."""

    def __init__(self, documents: tuple[Document, ...] | list[Document] | None = None,
                 cache_dir: str | Path | None = None) -> None:
        self.documents = tuple(build_corpus() if documents is None else documents)
        if not self.documents:
            raise ValueError("BM25Retriever needs at least one document")
        self._by_id = {d.id: d for d in self.documents}
        if len(self._by_id) != len(self.documents):
            raise ValueError("BM25Retriever: document ids must be unique")
        self.cache_dir = Path(cache_dir) if cache_dir else cache_root() / "search"
        self._index: bm25s.BM25 | None = None
        self._lock = threading.Lock()  # concurrent first searches build the index once

    @functools.cached_property
    def digest(self) -> str:
        h = hashlib.sha256(f"{bm25s.__version__}|{_TOKENIZER_VERSION}".encode())
        for d in self.documents:
            h.update(f"\0{d.id}\0{d.contents}".encode())
        return h.hexdigest()[:16]

    def index(self) -> bm25s.BM25:
        """Load the cached index, or build and cache it (atomically, so racing builders are safe)."""
        with self._lock:
            if self._index is None:
                self._index = self._load_or_build()
            return self._index

    def _load_or_build(self) -> bm25s.BM25:
        path = self.cache_dir / f"bm25-{self.digest}"
        if (path / "params.index.json").exists():
            try:
                return bm25s.BM25.load(str(path))
            except Exception as e:  # a damaged cache must not stop the env: rebuild in memory
                log.warning("BM25 cache %s unreadable (%r); rebuilding the index", path, e)
        index = bm25s.BM25()
        index.index([_tokenize(d.contents) for d in self.documents], show_progress=False)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.cache_dir, prefix=".tmp-"))
        index.save(str(tmp), show_progress=False)
        try:
            tmp.rename(path)
        except OSError:  # another process cached it first
            shutil.rmtree(tmp, ignore_errors=True)
        return index

    def retrieve_sync(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-k documents per query by BM25 score; ties break by corpus order; zero-score
        documents are never returned."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        index = self.index()
        results = []
        for query in queries:
            tokens = [t for t in _tokenize(query) if t in index.vocab_dict]
            if not tokens:
                results.append([])
                continue
            scores = np.asarray(index.get_scores(tokens))
            top = np.argsort(-scores, kind="stable")[:k]
            results.append([Hit(self.documents[i].id, self.documents[i].title, self.documents[i].text,
                                float(scores[i])) for i in top if scores[i] > 0])
        return results

    def get(self, doc_id: str) -> Document | None:
        return self._by_id.get(doc_id)

    async def retrieve(self, queries: list[str], k: int) -> list[list[Hit]]:
        return await asyncio.to_thread(self.retrieve_sync, queries, k)  # keep the event loop free

    async def search(self, query: str, k: int) -> list[Hit]:
        return (await self.retrieve([query], k))[0]

    async def open(self, doc_id: str) -> Document | None:
        return self.get(doc_id)


def parse_hit(item: Any) -> Hit:
    """One hit in either Search-R1 layout: {"document": {...}, "score"} or bare {"id", "contents"}."""
    if not isinstance(item, dict):
        raise RetrieverError(f"retrieval server returned a hit that is not an object: {item!r:.200}")
    doc, score = (item["document"], item.get("score", 0.0)) if "document" in item else (item, item.get("score", 0.0))
    if not isinstance(doc, dict) or "contents" not in doc:
        raise RetrieverError(f"retrieval server returned a hit without 'contents': {item!r:.200}")
    parsed = parse_contents(str(doc.get("id", "")), str(doc["contents"]))
    return Hit(parsed.id, parsed.title, parsed.text, float(score))


class RemoteRetriever:
    """Client for a Search-R1-style retrieval server over HTTP (httpx).

    Opens one short-lived connection per call, so it is safe from any event loop (the Gymnasium
    facade may drive each step on a fresh loop). Documents seen in search results are kept so
    `open` needs no round trip for them.
    """

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"RemoteRetriever base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._seen: dict[str, Document] = {}

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        url = self.base_url + path
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await client.post(url, json=payload)
        except httpx.HTTPError as e:
            raise RetrieverError(f"retrieval server {url} unreachable: {type(e).__name__}: {e}") from e
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise RetrieverError(f"retrieval server {url} answered HTTP {response.status_code}: "
                                 f"{response.text[:200]}")
        try:
            return response.json()["result"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise RetrieverError(f"retrieval server {url} reply has no 'result': {response.text[:200]}") from e

    async def retrieve(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        result = await self._post("/retrieve", {"queries": queries, "topk": k, "return_scores": True})
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrieverError(f"retrieval server returned {type(result).__name__} for {len(queries)} queries")
        hits = [[parse_hit(item) for item in per_query] for per_query in result]
        for h in (h for per_query in hits for h in per_query):
            self._seen[h.id] = Document(h.id, h.title, h.text)
        return hits

    async def search(self, query: str, k: int) -> list[Hit]:
        return (await self.retrieve([query], k))[0]

    async def open(self, doc_id: str) -> Document | None:
        if doc_id in self._seen:
            return self._seen[doc_id]
        result = await self._post("/documents", {"ids": [doc_id]})
        if not result or not isinstance(result, list) or not isinstance(result[0], dict):
            return None  # unknown id, or a server without the /documents extension
        return parse_contents(doc_id, str(result[0].get("contents", "")))
