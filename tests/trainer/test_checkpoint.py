"""Exact resume: 4 global batches straight == 2, checkpoint, a new process resumes, 2 more."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentrl.trainer.learner import Learner

from .conftest import tiny_llama
from .resume_worker import CFG, train

ROOT = Path(__file__).resolve().parents[2]


def test_resume_in_new_process_is_exact(tmp_path):
    straight = train(4, None, None)
    first = train(2, None, str(tmp_path / "ckpt"))
    assert first.global_step == 4 and latest_checkpoint(tmp_path / "ckpt").name == "step_4.pt"
    out = tmp_path / "resumed.pt"
    code = "from tests.trainer.resume_worker import main; main()"
    subprocess.run([sys.executable, "-c", code, "2", str(tmp_path / "ckpt"), "-", str(out)], cwd=ROOT,
                   check=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    resumed = torch.load(out)
    assert resumed.pop("__step") == straight.global_step == 8
    diffs = [(resumed[k] - v).abs().max().item() for k, v in straight.model.state_dict().items()]
    assert max(diffs) <= 1e-6
    # and the comparison is not vacuous: the 2-step model differs from the 4-step one
    assert max((first.model.state_dict()[k] - v).abs().max().item()
               for k, v in straight.model.state_dict().items()) > 1e-4


def test_checkpoint_contents_and_errors(tmp_path):
    learner = Learner(tiny_llama(), CFG)
    learner.version, learner.global_step = 3, 7
    path = save_checkpoint(tmp_path, learner, extra={"cursor": 11, "config": {"lr": 1e-3}})
    other = Learner(tiny_llama(seed=5), CFG)
    assert load_checkpoint(path, other) == {"cursor": 11, "config": {"lr": 1e-3}}
    assert other.version == 3 and other.global_step == 7
    assert all(torch.equal(v, other.model.state_dict()[k]) for k, v in learner.model.state_dict().items())
    assert latest_checkpoint(tmp_path / "none") is None
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt", other)
    torch.save({"x": 1}, tmp_path / "junk.pt")
    with pytest.raises(ValueError, match="not an agentrl checkpoint"):
        load_checkpoint(tmp_path / "junk.pt", other)
