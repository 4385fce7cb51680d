"""Checkpoints that resume exactly: model, optimizer, scheduler, step, version, the learner's
shuffle generator, the global RNG states (python, numpy, torch) and a caller's extra dict
(buffer cursor, resolved config, ...). architecture.md §8, §10.

    path = save_checkpoint(run_dir / "checkpoints", learner, extra={"cursor": 17})
    extra = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"), learner)

One file per checkpoint, `step_<global_step>.pt`, written to a temporary name and renamed, so a
crash never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.checkpoint_files import checkpoint_name
from agentrl.checkpoint_files import latest_checkpoint as latest_checkpoint  # re-exported: the trainer's API
from agentrl.trainer.learner import Learner

FORMAT_VERSION = 1


def rng_states() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def save_checkpoint(directory: str | os.PathLike[str], learner: Learner,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write `<directory>/step_<global_step>.pt` atomically and return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / checkpoint_name(learner.global_step)
    tmp = path.with_suffix(".pt.tmp")
    torch.save({"format": FORMAT_VERSION, "learner": learner.training_state(), "rng": rng_states(),
                "extra": extra or {}}, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | os.PathLike[str], learner: Learner, restore_rng: bool = True) -> dict[str, Any]:
    """Restore `learner` (and the global RNGs) from `path`; return the caller's extra dict."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    # Our own files hold numpy RNG state and plain Python objects, hence weights_only=False.
    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path} is not an agentrl checkpoint (format {FORMAT_VERSION})")
    learner.load_training_state(state["learner"])
    if restore_rng:
        set_rng_states(state["rng"])
    return state["extra"]
