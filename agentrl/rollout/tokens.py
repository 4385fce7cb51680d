"""Token-in/token-out chat bookkeeping (architecture.md §6).

The rollout keeps the exact token ids the policy sampled and never re-tokenizes the history.
Everything the env adds (the assistant turn's closing tokens, observation messages, the next
generation prompt) is appended as the chat template's tokens *for the new part only*: the text
that `render(history + new)` adds to `render(history)`. That is only sound if the template is
append-only — each rendering is a prefix of the next — so `verify_append_only` checks it at
start-up and every delta re-checks it on the live conversation (`HistoryRewrite` otherwise: the
rollout engine then goes step-wise, agentrl/rollout/stepwise.py).

A context (one segment) is laid out as

    prompt(msgs) | gen_prompt | action₁ (policy) | close₁ | obs₁ | gen_prompt | action₂ | ...

where `close` is what the template renders after the assistant's content: the tail after its
EOS (ChatML: "\\n") when the policy emitted EOS, else the EOS itself plus that tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from agentrl.types import Message


class ChatTemplateError(RuntimeError):
    """The chat template is not append-only (or lacks what token bookkeeping needs)."""


class HistoryRewrite(ChatTemplateError):
    """The template rendered earlier turns differently once a message was added (e.g. it dropped a
    past assistant turn's `<think>` block): there is no delta to append."""


class ChatTokenizer(Protocol):
    """The slice of a Hugging Face tokenizer that the rollout uses."""

    eos_token_id: int | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str: ...


# Conversation shapes the engine produces: prompt, then (assistant, observation)* turns. The
# assistant probe carries a reasoning block so templates that strip past reasoning are caught.
_PROBE_ASSISTANT = "<think>probe reasoning</think>probe answer <tool_call>{\"name\": \"f\"}</tool_call>"
DEFAULT_SHAPES: tuple[tuple[str, ...], ...] = (
    ("system", "user", "assistant", "tool", "assistant", "tool", "assistant"),
    ("system", "user", "assistant", "user", "assistant", "user", "assistant"),
    ("system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant"),
)


def probe_conversation(shape: Sequence[str]) -> list[Message]:
    """Fill a role sequence with distinct probe contents."""
    return [Message(role=r, content=_PROBE_ASSISTANT if r == "assistant" else f"probe {r} message {i}")
            for i, r in enumerate(shape)]


class ChatTokens:
    """Renders the chat template into token deltas for one tokenizer.

    `eos_token_ids` are the ids that end an assistant turn (default: the tokenizer's EOS); the
    first one is the id the template writes after assistant content.
    """

    def __init__(self, tokenizer: ChatTokenizer, eos_token_ids: Sequence[int] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        ids = list(eos_token_ids) if eos_token_ids else [tokenizer.eos_token_id]
        if ids[0] is None:
            raise ChatTemplateError("the tokenizer has no eos_token_id; pass eos_token_ids")
        self.tokenizer = tokenizer
        self.eos_token_ids: tuple[int, ...] = tuple(int(i) for i in ids)
        self.eos_text = tokenizer.decode([self.eos_token_ids[0]])
        self.template_kwargs = chat_template_kwargs or {}

    # -- rendering ------------------------------------------------------------------------------

    def render(self, messages: Sequence[Message], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=generation_prompt,
            **self.template_kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def rendered(self, messages: Sequence[Message], generation_prompt: bool = False) -> list[int]:
        """The template's whole rendering of `messages`, in tokens."""
        return self.encode(self.render(messages, generation_prompt))

    def _delta(self, before: str, after: str, what: str) -> str:
        if not after.startswith(before):
            i = _first_difference(before, after)
            raise HistoryRewrite(
                f"chat template is not append-only while adding {what}: rendering changed at "
                f"character {i}: before {before[max(0, i - 40):i + 40]!r}, after "
                f"{after[max(0, i - 40):i + 40]!r}")
        return after[len(before):]

    # -- the pieces of a context ----------------------------------------------------------------

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        """The closed rendering of the initial messages (no generation prompt)."""
        return self.rendered(messages)

    def generation_prompt(self, history: Sequence[Message]) -> list[int]:
        """Tokens that open the next assistant turn after `history` (ChatML: `<|im_start|>assistant\\n`)."""
        return self.encode(self._delta(self.render(history), self.render(history, True), "the generation prompt"))

    def ends_turn(self, token_ids: Sequence[int]) -> bool:
        return bool(token_ids) and token_ids[-1] in self.eos_token_ids

    def action_text(self, token_ids: Sequence[int]) -> str:
        """The assistant message content for the policy's tokens (its final EOS dropped)."""
        return self.decode(token_ids[:-1] if self.ends_turn(token_ids) else token_ids)

    def close_assistant(self, history: Sequence[Message], ended_with_eos: bool) -> list[int]:
        """Tokens the template renders after the last (assistant) message's content.

        When the policy stopped without EOS (max_tokens, stop string) the EOS itself is
        included, so the context stays what the template would render."""
        if not history or history[-1].get("role") != "assistant":
            raise ValueError("close_assistant needs a history that ends with an assistant message")
        opened = self.render(history[:-1], True)
        full = self._delta(opened, self.render(history), "an assistant message")
        at = full.rfind(self.eos_text)
        if at < 0:
            raise ChatTemplateError(
                f"the chat template does not end assistant messages with EOS {self.eos_text!r}: {full!r}")
        return self.encode(full[at + len(self.eos_text):] if ended_with_eos else full[at:])

    def append_messages(self, history: Sequence[Message], new: Sequence[Message]) -> list[int]:
        """The template's tokens for `new` rendered after `history` (closed, no generation prompt)."""
        if not new:
            return []
        return self.encode(self._delta(self.render(history), self.render([*history, *new]),
                                       f"{len(new)} {new[0].get('role')} message(s)"))


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def verify_append_only(tokenizer: ChatTokenizer, shapes: Sequence[Sequence[str]] = DEFAULT_SHAPES,
                       eos_token_ids: Sequence[int] | None = None,
                       chat_template_kwargs: dict[str, Any] | None = None) -> None:
    """Check, in tokens, that each rendering the engine relies on is a strict prefix of the next.

    For every shape the renderings are: the closed prompt, + generation prompt, + each
    assistant message (closed), + each observation (closed), + generation prompt, ... and the
    token bookkeeping (prompt + deltas) must reproduce each full rendering exactly. Raises
    `ChatTemplateError` naming the shape, step and first diverging token."""
    chat = ChatTokens(tokenizer, eos_token_ids, chat_template_kwargs)
    for shape in shapes:
        conv = probe_conversation(shape)
        first = next((i for i, m in enumerate(conv) if m["role"] == "assistant"), len(conv))
        steps: list[tuple[str, str]] = [("prompt", chat.render(conv[:first]))]
        for k in range(first, len(conv)):
            if conv[k]["role"] == "assistant":
                steps.append((f"generation prompt before message {k}", chat.render(conv[:k], True)))
            steps.append((f"message {k} ({conv[k]['role']})", chat.render(conv[: k + 1])))
        prev_name, prev = steps[0][0], chat.encode(steps[0][1])
        for name, text in steps[1:]:
            cur = chat.encode(text)
            if len(cur) <= len(prev) or cur[: len(prev)] != prev:
                i = _first_difference(prev, cur)
                raise ChatTemplateError(
                    f"chat template is not append-only for shape {'+'.join(shape)}: the rendering "
                    f"after {name} is not a strict token extension of the rendering after "
                    f"{prev_name}; first divergence at token {i}: "
                    f"{chat.decode(prev[max(0, i - 8):i + 8])!r} became {chat.decode(cur[max(0, i - 8):i + 8])!r}")
            prev_name, prev = name, cur
        _check_bookkeeping(chat, conv, first, shape)


def _check_bookkeeping(chat: ChatTokens, conv: list[Message], first: int, shape: Sequence[str]) -> None:
    """The engine's pieces (prompt, deltas, the policy's own action tokens) must add up to the
    template's full rendering, token for token."""
    ids = chat.prompt(conv[:first])
    for k in range(first, len(conv)):
        if conv[k]["role"] == "assistant":
            ids += chat.generation_prompt(conv[:k])
            ids += [*chat.encode(conv[k]["content"]), chat.eos_token_ids[0]]  # what a policy emits
            ids += chat.close_assistant(conv[: k + 1], ended_with_eos=True)
        else:
            ids += chat.append_messages(conv[:k], [conv[k]])
    full = chat.encode(chat.render(conv))
    if ids != full:
        i = _first_difference(ids, full)
        raise ChatTemplateError(
            f"token bookkeeping for shape {'+'.join(shape)} disagrees with the template's rendering "
            f"at token {i}: built {chat.decode(ids[max(0, i - 8):i + 8])!r}, template "
            f"{chat.decode(full[max(0, i - 8):i + 8])!r}")
