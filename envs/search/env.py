"""The `search` environment: answer a question by searching a document collection.

Tools: `search(query, k)` (top-k snippets with doc ids), `open(doc_id)` (a whole document) and
`answer(text)` (terminal). Reward: exact match or token F1 against the gold answers
(`scoring.py`), chosen by `reward: em | f1`; both are reported as components.
"""

from __future__ import annotations

import functools
from typing import Any

from agentrl.env import ToolEnv
from agentrl.envs.search.demos import search_demonstration
from agentrl.envs.search.questions import generate_questions
from agentrl.envs.search.retriever import BM25Retriever, RemoteRetriever, Retriever
from agentrl.envs.search.scoring import score
from agentrl.tools import ToolResult, search, state_get, state_set, tool
from agentrl.types import Task

REWARDS = ("em", "f1")
BACKENDS = ("local", "remote")


@tool(name="open", inject=("retriever",))
async def open_document(doc_id: str, retriever: Any = None) -> ToolResult:
    """Read a whole document by its id (the id= shown in search results).

    Args:
        doc_id: the document id, e.g. country/NO
    """
    doc = await retriever.open(doc_id.strip())
    if doc is None:
        return ToolResult(error=f"no document with id {doc_id!r}; use an id= from the search results")
    return ToolResult(f"id={doc.id} {doc.title}\n{doc.text}")


@tool(name="answer", terminal=True, inject=("state",))
async def answer(text: str, state: Any = None) -> str:
    """Give your final answer, as short as possible (a name or a code), and end the episode.

    Args:
        text: the answer
    """
    state_set(state, "answer", text)
    state_set(state, "submitted", True)
    return "Answer recorded."


@functools.lru_cache(maxsize=1)
def default_retriever() -> BM25Retriever:
    """One BM25 index over the ISO corpus per process, shared by every env instance."""
    return BM25Retriever()


_SYSTEM = ("You answer questions by searching a collection of ISO records: countries (ISO 3166-1), their "
           "subdivisions (ISO 3166-2), currencies (ISO 4217) and languages (ISO 639). Search with a few "
           "key words, open a document by its id when the snippet is not enough, follow links between "
           "records for multi-step questions, then call `answer` with the short answer only.")


class SearchEnv(ToolEnv):
    """Question answering over a BM25 index (local) or a Search-R1-style retrieval server (remote).

    Args (also `env.kwargs` in configs/search.yaml):
        retriever: "local", "remote", or any object with async `search(query, k)` and `open(doc_id)`
        url: the retrieval server's base URL (remote)
        reward: "em" (exact match) or "f1" (token F1)
        max_hops: 1 keeps single-hop questions only; None keeps all
        kinds: question kinds to keep (None: all)
        seed: the seed of the question order
    and every `ToolEnv` option (max_turns, parser, ...).
    """

    tools = (search, open_document, answer)
    max_turns = 6

    def __init__(self, retriever: str | Retriever = "local", url: str | None = None, reward: str = "em",
                 max_hops: int | None = None, kinds: list[str] | None = None, seed: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if reward not in REWARDS:
            raise ValueError(f"unknown search reward {reward!r}; expected one of {', '.join(REWARDS)}")
        if retriever == "remote":
            if not url:
                raise ValueError("the remote retriever needs url= (a Search-R1-style server, e.g. "
                                 "python -m agentrl.envs.search.server)")
            retriever = RemoteRetriever(url)
        elif retriever == "local":
            retriever = default_retriever()
        elif isinstance(retriever, str) or not hasattr(retriever, "search") or not hasattr(retriever, "open"):
            raise ValueError(f"retriever must be one of {', '.join(BACKENDS)} or an object with search() "
                             f"and open(), got {retriever!r}")
        self.retriever = retriever
        self.reward_kind = reward
        self.max_hops, self.kinds, self.seed = max_hops, kinds, seed
        generate_questions("test", seed, kinds, max_hops)  # validate kinds now, with a clear error
        self._tasks: dict[str, list[Task]] = {}

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in self._tasks:
            self._tasks[split] = generate_questions(split, self.seed, self.kinds, self.max_hops)
        return self._tasks[split]

    def system_prompt(self, task: Task) -> str:
        return _SYSTEM

    def user_prompt(self, task: Task) -> str:
        return f"Question: {task['question']}"

    async def demonstrate(self, task: Task, seed: int = 0) -> list[str]:
        """The question's retrieval path, then the answer (envs/search/demos.py)."""
        return search_demonstration(task, self.tool_parser.format_call, seed)

    async def reward(self, task: Task, state: Any) -> dict[str, float]:
        given = state_get(state, "answer") if state_get(state, "submitted", False) else None
        if given is None:
            return {"reward": 0.0, "answered": 0.0, "em": 0.0, "f1": 0.0}
        em, f1 = score(str(given), task["answers"])
        return {"reward": em if self.reward_kind == "em" else f1, "answered": 1.0, "em": em, "f1": f1}
