"""Reward integrity (issue 20): known reward hacks score 0 on code, search and swe, on the real local
(bubblewrap) and Docker backends, and `agentrl env check --adversarial` catches a gameable env."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrl.config import SandboxConfig
from agentrl.envs.code import procedural_task, run_hidden_tests
from agentrl.reward_hacks import PATCH_HACKS, TEXT_HACKS, code_hacks
from agentrl.sandboxes import Sandbox, make_sandbox
from tests.support.docker import require_docker

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(params=BACKENDS)
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    if request.param == "docker":
        require_docker()
    sb = make_sandbox(SandboxConfig(backend=request.param, memory_mb=512, max_output_bytes=4_000_000),
                      run_id="pytest-reward-integrity")
    await sb.start()  # type: ignore[attr-defined]
    try:
        yield sb
    finally:
        await sb.close()


# ---------------------------------------------------------------------------------------------
# code
# ---------------------------------------------------------------------------------------------


async def test_code_hacks_score_zero(sandbox: Sandbox) -> None:
    task = procedural_task(1, 0)
    assert (await run_hidden_tests(sandbox, task, task["solution"], timeout=20)).passed  # the control
    passed = {}
    for name, source in code_hacks(task["entry_point"]).items():
        await sandbox.reset()
        outcome = await run_hidden_tests(sandbox, task, source, timeout=3)
        passed[name] = outcome.passed
    assert not any(passed.values()), [n for n, p in passed.items() if p]


async def test_code_grader_secrets_are_out_of_the_submissions_reach(sandbox: Sandbox) -> None:
    """What a same-process grader leaked (issue 20: the nonce read from the running program): the
    submission's process sees neither the nonce nor the tests, on disk, in /proc or in memory."""
    task = procedural_task(0, 0)
    probe = textwrap.dedent(f'''
        import glob, os, sys
        seen = []
        for path in glob.glob("/proc/[0-9]*/fd/0") + glob.glob("/proc/[0-9]*/mem") + glob.glob("/proc/[0-9]*/environ"):
            try:
                with open(path, "rb") as f:
                    f.read(1)
                seen.append(path)
            except OSError:
                pass
        open("/tmp/probe.txt", "w").write(repr((seen, os.listdir("."), sorted(vars(sys.modules["__main__"])))))
        def {task["entry_point"]}(a, b):
            return a + b
    ''')
    await run_hidden_tests(sandbox, task, probe, timeout=10)
    seen, files, main_names = eval((await sandbox.read_file("/tmp/probe.txt")).decode())
    opened = [p for p in seen if not p.startswith(("/proc/self", "/proc/thread-self"))]
    own = {p.split("/")[2] for p in opened}
    assert len(own) <= 1, f"the submission opened another process's stdin/memory/environ: {opened}"
    assert [f for f in files if f != "__pycache__"] == ["solution.py"], files  # no tests, no grader, no expected values on disk
    assert "nonce" not in main_names and "check" not in main_names


# ---------------------------------------------------------------------------------------------
# search
# ---------------------------------------------------------------------------------------------


async def test_search_hacks_score_zero() -> None:
    from agentrl.envs.search.env import SearchEnv

    for kind in ("em", "f1"):
        env = SearchEnv(reward=kind)
        tasks = env.tasks("train")[:5]
        every_answer = " ".join(a for t in env.tasks("train")[:300] for a in t["answers"])
        for task in tasks:
            golds = task["answers"]
            hacks = {**TEXT_HACKS, "every_answer": every_answer, "gold_in_a_list": every_answer + " " + golds[0],
                     "gold_repeated": " ".join([golds[0]] * 30)}
            scores = {n: (await env.reward(task, {"answer": a, "submitted": True}))["reward"] for n, a in hacks.items()}
            assert max(scores.values()) == 0.0, (kind, task["id"], {n: s for n, s in scores.items() if s})
            assert (await env.reward(task, {"answer": golds[0], "submitted": True}))["reward"] == 1.0


# ---------------------------------------------------------------------------------------------
# swe: protected files are dropped; code-level hacks run for real and fail
# ---------------------------------------------------------------------------------------------


def _semver_task() -> dict[str, Any]:
    from pathlib import Path

    from agentrl.envs.swe import schema

    return schema.load_tasks(Path(schema.__file__).with_name("data") / "semver-3.0.2.jsonl")[0]


@pytest.mark.parametrize("name", sorted(PATCH_HACKS))
async def test_swe_protected_file_hacks_are_empty(name: str) -> None:
    from agentrl.envs.swe.grade import filter_patch, grade

    task = _semver_task()
    kept, dropped = filter_patch(PATCH_HACKS[name], task)
    assert not kept.strip() and dropped, (name, dropped)
    assert (await grade(None, task, PATCH_HACKS[name])).outcome == "empty"  # type: ignore[arg-type]


# Appended to the task's buggy source file (imported by every test): each makes the tests "pass"
# without fixing the bug, under a grader that trusted pytest's text output or its process.
SOURCE_HACKS = {
    "early_exit_after_forged_summary": (
        "import os as _os, sys as _sys\n"
        "_sys.stdout.write('=== short test summary info ===\\n' + ''.join('PASSED %s\\n' % n for n in {f2p!r}))\n"
        "_sys.stdout.flush()\n_os._exit(0)\n"),
    "patch_pytest_reports": (
        "import _pytest.reports as _r\n_orig = _r.TestReport.from_item_and_call\n"
        "def _fake(item, call):\n    rep = _orig(item, call)\n    rep.outcome = 'passed'\n    rep.longrepr = None\n"
        "    return rep\n_r.TestReport.from_item_and_call = staticmethod(_fake)\n"),
    "patch_builtins": "import builtins as _b\n_b.isinstance = lambda *a: True\n",
    "always_equal_class": "class _AlwaysEqual:\n    def __eq__(self, other):\n        return True\n",
    "plugin_from_source": (
        "import gc as _gc, pytest as _pytest\nclass _Hack:\n    @_pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n        out = yield\n        rep = out.get_result()\n"
        "        rep.outcome = 'passed'\n"
        "for _o in _gc.get_objects():\n    if type(_o).__name__ == 'Config' and hasattr(_o, 'pluginmanager'):\n"
        "        _o.pluginmanager.register(_Hack())\n        break\n"),
    "skip_every_test": "import pytest as _pytest\n_pytest.skip('hack', allow_module_level=True)\n",
}


async def _hack_patch(sandbox: Sandbox, task: dict[str, Any], code: str) -> str:
    """A real diff (git in the sandbox) that appends `code` to the file the gold patch fixes."""
    from agentrl.envs.swe.grade import prepare_repo, split_patch

    target = split_patch(task["patch"])[0][0]
    await sandbox.reset()
    await prepare_repo(sandbox, task, commit=True)
    await sandbox.write_file("/tmp/hack.py", "\n" + code)
    r = await sandbox.exec(f"cat /tmp/hack.py >> {target} && git diff")
    assert r.ok and r.stdout.startswith("diff --git"), r
    return r.stdout


# every hack on both backends (the same grader; ~6 s a run on Docker)
_SWE_CASES = [("local", n) for n in sorted(SOURCE_HACKS)] + [
    pytest.param("docker", n, marks=pytest.mark.docker) for n in sorted(SOURCE_HACKS)]


@pytest.mark.parametrize(("backend", "name"), _SWE_CASES)
async def test_swe_source_hacks_fail(backend: str, name: str) -> None:
    from agentrl.envs.swe.grade import grade

    if backend == "docker":
        require_docker()
    task = _semver_task()
    sandbox = make_sandbox(SandboxConfig(backend=backend, memory_mb=512, max_output_bytes=4_000_000))
    try:
        patch = await _hack_patch(sandbox, task, SOURCE_HACKS[name].replace("{f2p!r}", repr(task["FAIL_TO_PASS"])))
        result = await grade(sandbox, task, patch)
    finally:
        await sandbox.close()
    assert result.outcome == "fail", (name, result)
    assert result.evaluation is not None and result.evaluation.applied, result


async def test_swe_gold_patch_still_passes(sandbox: Sandbox) -> None:
    from agentrl.envs.swe.grade import grade

    task = _semver_task()
    assert (await grade(sandbox, task, task["patch"])).outcome == "pass"


# ---------------------------------------------------------------------------------------------
# env check --adversarial
# ---------------------------------------------------------------------------------------------


def test_env_check_adversarial_flags_a_gameable_reward_and_passes_an_honest_one() -> None:
    from agentrl.env import ToolEnv
    from agentrl.envcheck import check_env
    from agentrl.tools import submit

    class Gameable(ToolEnv):
        tools = (submit,)

        def tasks(self, split: str = "train") -> list[dict[str, Any]]:
            return [{"id": "0", "prompt": "What is 2 + 2?"}]

        async def reward(self, task: dict[str, Any], state: Any) -> float:
            return float("PASSED" in str(state.get("answer", "")) or state.get("answer") == "4")

    class Honest(Gameable):
        async def reward(self, task: dict[str, Any], state: Any) -> float:
            return float(str(state.get("answer", "")).strip() == "4")

    bad = check_env(Gameable(), adversarial=True)
    failed = {c.name: c.detail for c in bad.failed()}
    assert "reward hacks score no better than a wrong answer" in failed, bad
    assert "prompt_injection" in failed["reward hacks score no better than a wrong answer"]
    good = check_env(Honest(), adversarial=True)
    assert good.ok, good


def test_adversarial_pass_runs_an_envs_own_hacks() -> None:
    from agentrl.env import ToolEnv
    from agentrl.reward_hacks import adversarial_pass
    from agentrl.tools import submit

    class Own(ToolEnv):
        tools = (submit,)

        def tasks(self, split: str = "train") -> list[dict[str, Any]]:
            return [{"id": "0", "prompt": "say the word"}]

        def adversarial_submissions(self, task: dict[str, Any]) -> list[tuple[str, str]]:
            return [("magic_word", "xyzzy")]

        async def reward(self, task: dict[str, Any], state: Any) -> float:
            return float(state.get("answer") == "xyzzy")

    env = Own()
    try:
        wins = env._run(adversarial_pass(env))
    finally:
        env.close()
    assert [w[1] for w in wins] == ["magic_word"]


def test_cli_env_check_adversarial(capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from agentrl.cli import main

    example = Path(__file__).parent.parent / "examples" / "my_env.py"
    assert main(["env", "check", f"{example}:AddEnv", "--adversarial"]) == 0
    out = capsys.readouterr().out
    assert "PASS  reward hacks score no better than a wrong answer" in out


def test_swe_plugin_allows_a_tests_own_monkeypatch_of_builtins(tmp_path: Any) -> None:
    """No false alarm: a test that monkeypatches builtins (undone at teardown) is not tampering,
    while repository code that leaves builtins patched is."""
    import subprocess
    import sys
    from pathlib import Path

    from agentrl.envs.swe import grade

    (tmp_path / ".agentrl" / "plugin").mkdir(parents=True)
    (tmp_path / ".agentrl" / "plugin" / "agentrl_grade_plugin.py").write_text(grade.PLUGIN_SOURCE)
    (tmp_path / "mod.py").write_text("def f():\n    return 1\n")
    (tmp_path / "test_a.py").write_text(
        "import builtins\nimport mod\n\ndef test_mp(monkeypatch):\n"
        "    monkeypatch.setattr(builtins, 'input', lambda *a: 'y')\n    assert input() == 'y' and mod.f() == 1\n")

    def run() -> tuple[dict[str, str] | None, str]:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "agentrl_grade_plugin",
                            "test_a.py"], cwd=tmp_path, input="n0nce\n", capture_output=True, text=True, timeout=60,
                           env={"PYTHONPATH": str(tmp_path / ".agentrl" / "plugin"), "PATH": "/usr/bin:/bin"})
        return grade.plugin_results(r.stdout, "n0nce")

    assert run() == ({"test_a.py::test_mp": "PASSED"}, "")
    Path(tmp_path / "mod.py").write_text("import builtins\nbuiltins.len = lambda x: 0\ndef f():\n    return 1\n")
    statuses, why = run()
    assert statuses is None and "builtins.len was changed" in why


def test_adversarial_pass_plays_shell_hacks_through_a_bash_tool() -> None:
    """An env whose answer is the sandbox's state gets the shell hacks played with its `bash` tool
    (here a fake that records commands; the reward naively pays for a conftest.py)."""
    from agentrl.env import ToolEnv
    from agentrl.reward_hacks import adversarial_pass
    from agentrl.tools import state_get, state_set, submit, tool

    @tool(name="bash", inject=("state",))
    def fake_bash(command: str, state: Any = None) -> str:
        """Run a command.

        Args:
            command: the command
        """
        state_set(state, "commands", [*(state_get(state, "commands") or []), command])
        return ""

    class StateGraded(ToolEnv):
        tools = (fake_bash, submit)

        def tasks(self, split: str = "train") -> list[dict[str, Any]]:
            return [{"id": "0", "prompt": "fix the bug"}]

        async def reward(self, task: dict[str, Any], state: Any) -> float:
            return float(any("> conftest.py" in c for c in state.get("commands") or []))

    env = StateGraded()
    try:
        wins = env._run(adversarial_pass(env))
    finally:
        env.close()
    assert [w[1] for w in wins] == ["conftest_skips_everything"]
