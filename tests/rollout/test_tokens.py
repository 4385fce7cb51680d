"""Chat-template bookkeeping: append-only verification and token deltas (architecture.md §6)."""

from __future__ import annotations

import pytest

from agentrl.rollout.tokens import ChatTemplateError, ChatTokens, probe_conversation, verify_append_only

from .fakes import CHATML, CharTokenizer

# Non-append-only templates of the kinds peer systems trip over.
COUNTING_SYSTEM = CHATML.replace("<|im_start|>{{ m['role'] }}\n{{ m['content'] }}",
                                 "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                                 "{% if m['role'] == 'system' %} ({{ messages|length }} messages){% endif %}")
# Qwen3-style: reasoning of assistant turns before the last user message is stripped.
STRIP_REASONING = (
    "{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in m['content'] %}"
    "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_EOS_AFTER_ASSISTANT = CHATML.replace("{{ m['content'] }}<|im_end|>",
                                        "{{ m['content'] }}{% if m['role'] != 'assistant' %}<|im_end|>{% endif %}")


def test_chatml_is_append_only() -> None:
    verify_append_only(CharTokenizer())


@pytest.mark.parametrize(("template", "needle"), [
    (COUNTING_SYSTEM, "not append-only"),
    (STRIP_REASONING, "not append-only"),
    (NO_EOS_AFTER_ASSISTANT, "EOS"),
])
def test_non_append_only_templates_fail_loudly(template: str, needle: str) -> None:
    with pytest.raises(ChatTemplateError, match=needle) as err:
        verify_append_only(CharTokenizer(template))
    assert "shape" in str(err.value) or "EOS" in str(err.value)


def test_error_names_first_divergence() -> None:
    with pytest.raises(ChatTemplateError) as err:
        verify_append_only(CharTokenizer(COUNTING_SYSTEM))
    msg = str(err.value)
    assert "first divergence at token 32" in msg and "(2 messag" in msg and "(3 messag" in msg


def test_deltas_reproduce_full_rendering() -> None:
    tok = CharTokenizer()
    chat = ChatTokens(tok)
    conv = probe_conversation(("system", "user", "assistant", "tool", "assistant"))
    ids = chat.prompt(conv[:2]) + chat.generation_prompt(conv[:2])
    ids += [*tok.encode(conv[2]["content"]), 2]  # the policy's tokens, EOS included
    ids += chat.close_assistant(conv[:3], ended_with_eos=True) + chat.append_messages(conv[:3], conv[3:4])
    ids += chat.generation_prompt(conv[:4])
    assert tok.decode(ids) == chat.render(conv[:4], True)


def test_close_without_eos_adds_eos_and_tail() -> None:
    chat = ChatTokens(CharTokenizer())
    hist = [*probe_conversation(("system", "user")), {"role": "assistant", "content": "cut"}]
    assert chat.close_assistant(hist, ended_with_eos=True) == chat.encode("\n")
    assert chat.close_assistant(hist, ended_with_eos=False) == [2, *chat.encode("\n")]
    with pytest.raises(ValueError, match="ends with an assistant"):
        chat.close_assistant(hist[:2], ended_with_eos=True)


def test_action_text_drops_only_final_eos() -> None:
    chat = ChatTokens(CharTokenizer())
    ids = chat.encode("hi")
    assert chat.action_text([*ids, 2]) == "hi" and chat.ends_turn([*ids, 2])
    assert chat.action_text(ids) == "hi" and not chat.ends_turn(ids)


def test_runtime_delta_detects_rewritten_history() -> None:
    chat = ChatTokens(CharTokenizer(STRIP_REASONING))
    hist = [*probe_conversation(("system", "user", "assistant"))]
    with pytest.raises(ChatTemplateError, match="not append-only"):
        chat.append_messages(hist, [{"role": "user", "content": "next"}])


def test_tokenizer_without_eos_is_rejected() -> None:
    tok = CharTokenizer()
    tok.eos_token_id = None  # type: ignore[assignment]
    with pytest.raises(ChatTemplateError, match="eos_token_id"):
        ChatTokens(tok)


# ---- the real SmolLM2 template -------------------------------------------------------------


def test_smollm2_template_is_append_only(smollm2_tokenizer) -> None:
    verify_append_only(smollm2_tokenizer)
    chat = ChatTokens(smollm2_tokenizer)
    hist = [*probe_conversation(("system", "user")), {"role": "assistant", "content": "ok"}]
    im_end = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    newline = smollm2_tokenizer.encode("\n", add_special_tokens=False)
    assert chat.close_assistant(hist, ended_with_eos=True) == newline  # the "\n" after <|im_end|>
    assert chat.close_assistant(hist, ended_with_eos=False) == [im_end, *newline]
    assert chat.decode(chat.generation_prompt(hist[:2])) == "<|im_start|>assistant\n"


def _per_render_date(original: str) -> str:
    """SmolLM2's own template plus a system-prompt line that changes with every render."""
    head = "{{'<|im_start|>' + message['role'] + '\n' +"
    assert head in original
    return original.replace(head, "{% if loop.first %}Today is day {{ messages|length }}.\n{% endif %}" + head)


@pytest.mark.parametrize("make_template", [_per_render_date, lambda original: STRIP_REASONING],
                         ids=["date-in-system-prompt", "strip-past-reasoning"])
def test_smollm2_tokenizer_with_non_append_only_template_fails(smollm2_tokenizer, make_template) -> None:
    tok = smollm2_tokenizer
    original = tok.chat_template
    try:
        tok.chat_template = make_template(original)
        with pytest.raises(ChatTemplateError, match="first divergence"):
            verify_append_only(tok)
    finally:
        tok.chat_template = original
    verify_append_only(tok)  # and the real template still passes
