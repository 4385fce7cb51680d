"""`make test-gpu` (tests_gpu/, docs/cluster.md §5) on this machine: without a GPU it fails with
the reason instead of passing by skipping; with one, its placement check passes."""

from __future__ import annotations

import subprocess
import sys

import torch

from agentrl.models import resolve_device


def test_gpu_suite_fails_without_a_gpu_and_passes_with_one() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests_gpu",
                          "-k", "auto_puts_the_learner_on_the_gpu"], capture_output=True, text=True, timeout=300)
    if torch.cuda.is_available():
        assert out.returncode == 0, out.stdout[-2000:]
    else:
        assert out.returncode == 1 and "tests_gpu needs a CUDA GPU" in out.stdout, out.stdout[-2000:]


def test_auto_device_follows_the_gpus_torch_sees() -> None:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert resolve_device("auto") == ("cuda" if gpus >= 1 else "cpu")
    assert resolve_device("auto", gpus_needed=gpus + 1) == "cpu"  # a rank per GPU, or gloo on the CPU
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda") == "cuda"
