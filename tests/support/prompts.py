"""Chat prompts (token ids) that the engine tests share."""

from __future__ import annotations

from pathlib import Path

from agentrl.models import load_tokenizer

QUESTIONS = ["Name a fruit.", "Write a haiku about rain.", "Say hello in French.", "What is Python?"]


def chat_prompts(model_path: Path) -> list[list[int]]:
    """One user turn per question, rendered with the model's chat template and generation prompt."""
    tok = load_tokenizer(model_path)
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for q in QUESTIONS]
