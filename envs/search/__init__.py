"""The `search` environment: ISO records from pycountry, BM25 or a remote retriever, EM/F1 reward."""

from agentrl.envs.search.env import SearchEnv

__all__ = ["SearchEnv"]
