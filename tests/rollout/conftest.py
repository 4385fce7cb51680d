"""Fixtures for rollout tests: the embedded SmolLM2-135M model (real tokenizer and HF engine)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from agentrl.models import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path: Path):
    from agentrl.models import load_tokenizer

    return load_tokenizer(smollm2_path)
