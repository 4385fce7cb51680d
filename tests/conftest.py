"""Suite-wide rule: where the real components must be there (CI, `make test` as root, which installs
them all: bubblewrap, Docker, vLLM, Ray), a test that would skip for want of one fails instead,
with the skip's reason. Set AGENTRL_REQUIRE_ALL=1 to ask for it."""

from __future__ import annotations

import os

import gymnasium
import pytest

import agentrl.env


@pytest.fixture(autouse=True)
def _env_registry_restored() -> object:
    """An env a test registers is gone after it: the next test sees the registry the package set."""
    before = dict(agentrl.env._REGISTRY)
    yield
    for name in set(agentrl.env._REGISTRY) - set(before):
        agentrl.env._REGISTRY.pop(name)
        gymnasium.envs.registry.pop(agentrl.env.gym_id(name), None)
    agentrl.env._REGISTRY.update(before)


def _required() -> bool:
    return os.environ.get("AGENTRL_REQUIRE_ALL") == "1"


def _fail(report: pytest.CollectReport | pytest.TestReport) -> None:
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = f"AGENTRL_REQUIRE_ALL=1 but this test was skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if _required() and report.skipped and not hasattr(report, "wasxfail"):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    report = outcome.get_result()
    if _required() and report.skipped:  # a module-level importorskip (vllm, ray)
        _fail(report)
