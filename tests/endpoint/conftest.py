"""Fixtures for the policy endpoint tests: the embedded SmolLM2-135M model in the real hf engine."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from agentrl.models import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture
async def hf_engine(smollm2_path: Path):
    from agentrl.inference.hf import HFEngine

    engine = HFEngine(smollm2_path, max_batch_size=8)
    yield engine
    await engine.close()
