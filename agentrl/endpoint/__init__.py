"""The policy endpoint: an OpenAI-compatible server that samples from agentrl's engine and
records each completion's tokens for training (issue 54). Needs the `serve` extra."""

from agentrl.endpoint.conversation import Conversation, RequestError
from agentrl.endpoint.server import HOST, Episode, PolicyEndpoint

__all__ = ["HOST", "Conversation", "Episode", "PolicyEndpoint", "RequestError"]
