"""Every user-facing failure of the CLI ends with one line naming the problem and the fix: exit 2
for usage and config errors, 1 at run time, the traceback only with --debug (issue 14).

Run-time cases go through `cli.main` in-process with the learner replaced by a stub (loading the
135M model is not what they test, and it would cost ~15 s each); one case runs the real command in
a subprocess with the real learner, end to end."""

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentrl.run
import agentrl.sandboxes.docker
import agentrl.trainer.learner
from agentrl import cli

ROOT = Path(__file__).resolve().parent.parent
NO_TASKS_ENV = '''
from agentrl import ToolEnv
from agentrl.tools import submit


class EmptyEnv(ToolEnv):
    tools = (submit,)

    def tasks(self, split="train"):
        return []

    def user_prompt(self, task):
        return "nothing"

    async def reward(self, task, state):
        return 0.0
'''


class _StubLearner:
    """Stands in for the model-loading learner: every case below fails before learning."""

    version = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


def fail(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "no error line"
    assert not any(line.startswith("Traceback") for line in err), err
    return code, err[-1]


@pytest.fixture
def stub_learner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    monkeypatch.setattr(agentrl.trainer.learner, "Learner", _StubLearner)
    monkeypatch.setattr(agentrl.run, "make_learner", _StubLearner)  # what run.py calls
    # The Docker client is cached per process (run.py uses agentrl.sandboxes): an earlier test's
    # client would ignore DOCKER_HOST.
    agentrl.sandboxes.docker.docker_client.cache_clear()
    yield [f"run.dir={tmp_path / 'runs'}", "sandbox.pool_size=1", "eval.enabled=false",
           "trainer.warm_start.enabled=false", "--quiet"]  # the smallest run, under tmp_path
    agentrl.sandboxes.docker.docker_client.cache_clear()


def test_usage_error_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, line = fail(capsys, "train", "--env", "nosuchenv", f"run.dir={tmp_path}")
    assert code == 2
    assert line.startswith("agentrl train: unknown env 'nosuchenv'")
    registered = line.split("registered: ", 1)[1].split(" (", 1)[0].split(", ")
    assert {"code", "search", "summarize", "swe"} <= set(registered)  # an earlier test may add its own


def test_env_file_that_does_not_import_exit_1_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad_env.py"
    bad.write_text("import json\nimport nosuchdep_for_agentrl\n")
    argv = [sys.executable, "-m", "agentrl.cli", "train", "--env", f"{bad}:E", f"run.dir={tmp_path / 'runs'}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "does not import: ModuleNotFoundError" in lines[0] and "nosuchdep_for_agentrl" in lines[0]
    assert f"{bad}:2" in lines[0] and "fix:" in lines[0]
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, timeout=120)
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == lines[0]
    assert not (tmp_path / "runs").exists()  # it stopped before any work


def test_no_tasks_exit_1(capsys: pytest.CaptureFixture[str], stub_learner: list[str], tmp_path: Path) -> None:
    env_file = tmp_path / "empty_env.py"
    env_file.write_text(NO_TASKS_ENV)
    code, line = fail(capsys, "train", "--env", f"{env_file}:EmptyEnv", *stub_learner)
    assert code == 1
    assert "has no training tasks" in line and "fix:" in line


def test_a_balance_key_the_tasks_lack_exit_1(capsys: pytest.CaptureFixture[str], stub_learner: list[str]) -> None:
    code, line = fail(capsys, "train", "--env", "search", "rollout.balance_key=level", *stub_learner)
    assert code == 1
    assert "rollout.balance_key 'level' is not a field of env 'search''s task" in line
    assert "fix: use one of its fields (answers, hops, id, kind, question, split)" in line


def test_an_eval_group_by_the_held_out_tasks_lack_exit_1(capsys: pytest.CaptureFixture[str],
                                                         stub_learner: list[str]) -> None:
    evaluating = [a if a != "eval.enabled=false" else "eval.enabled=true" for a in stub_learner]
    code, line = fail(capsys, "train", "--env", "search", "eval.group_by=level", *evaluating)
    assert code == 1
    assert "eval.group_by 'level' is not a field of env 'search''s task 'search/" in line
    assert "fix: use one of its fields (answers, hops, id, kind, question, split) or eval.group_by=null" in line


def test_eval_samples_under_greedy_decoding_exit_2(capsys: pytest.CaptureFixture[str], stub_learner: list[str]) -> None:
    code, line = fail(capsys, "train", "--env", "search", "eval.samples=4", *stub_learner)
    assert code == 2  # a config error: before any work
    assert "eval.samples=4 would repeat the same greedy episode: set eval.temperature > 0" in line


def test_no_docker_engine_exit_1(capsys: pytest.CaptureFixture[str], stub_learner: list[str],
                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    code, line = fail(capsys, "train", "--env", "code", "sandbox.backend=docker", *stub_learner)
    assert code == 1
    assert "no Docker engine answers" in line and "docker_up.sh" in line


def test_no_bubblewrap_exit_1(capsys: pytest.CaptureFixture[str], stub_learner: list[str],
                              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without bwrap
    code, line = fail(capsys, "train", "--env", "code", "sandbox.backend=local", *stub_learner)
    assert code == 1
    assert "'bwrap' not found" in line and "apt-get install -y bubblewrap" in line


def test_engine_that_cannot_start_exit_1(capsys: pytest.CaptureFixture[str], stub_learner: list[str]) -> None:
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        code, line = fail(capsys, "train", "--env", "code", "--engine", "openai", f"engine.base_url={url}",
                          "sandbox.backend=process", *stub_learner)
    assert code == 1
    assert f"the openai engine at {url} does not answer" in line and "fix: start the server" in line


def test_bad_task_file_exit_1(capsys: pytest.CaptureFixture[str], stub_learner: list[str], tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.csv"
    tasks.write_text("instance_id,repo\nx,r\n")  # not a format the loader reads
    code, line = fail(capsys, "train", "--env", "swe", f"env.kwargs.task_file={tasks}", "sandbox.backend=process",
                      *stub_learner)
    assert code == 1
    assert line.startswith("agentrl train: bad task file:") and "unsupported task file type '.csv'" in line
    assert "agentrl swe validate" in line


def test_port_in_use_exit_1(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        def serve(_: object) -> int:  # a command that binds a port, as a server would
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
            return 0

        monkeypatch.setitem(cli.COMMANDS, "report", serve)
        code, line = fail(capsys, "report", "somewhere")
    assert code == 1
    assert "port is already in use" in line and os.strerror(errno.EADDRINUSE) in line and "ss -ltnp" in line


def test_a_closed_pipe_ends_quietly() -> None:
    """`agentrl swe stats --json | head -c 20` where head leaves before agentrl writes: no error
    line, exit 141 (as Unix tools end on SIGPIPE)."""
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "swe", "stats", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the command (seconds of imports) writes a byte
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err.decode().strip() == "", err.decode()


@pytest.mark.parametrize("argv, code, start", [
    (["train", "--env", "nosuchenv"], 2, "agentrl train: unknown env 'nosuchenv'"),
    (["eval", "--env", "nosuchenv"], 2, "agentrl eval: unknown env 'nosuchenv'"),
    (["eval", "--env", "search", "--n", "0"], 2, "agentrl eval: --n must be >= 1"),
    (["serve", "{run}"], 2, "agentrl serve: run directory"),
    (["serve", "smollm2-135m", "nosuch.key=1"], 2, "agentrl serve: unknown config key 'nosuch'"),
])
def test_a_mistake_is_one_line_before_torch_loads(tmp_path: Path, argv: list[str], code: int, start: str) -> None:
    """train, eval and serve check their arguments (agentrl/plan.py) before anything heavy loads."""
    run = tmp_path / "run"  # a run directory with no checkpoint yet
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  name: search\n")
    probe = ("import sys\nfrom agentrl import cli\ncode = cli.main(sys.argv[1:])\n"
             "print('torch' in sys.modules, code)")
    out = subprocess.run([sys.executable, "-c", probe, *(a.format(run=run) for a in argv)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.split() == ["False", str(code)], (out.stdout, out.stderr[-2000:])
    assert out.stderr.strip().splitlines()[-1].startswith(start), out.stderr
