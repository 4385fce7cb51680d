"""`--env openenv:URL | openenv:IMAGE | openenv:module:Class` (issue 53) against the real OpenEnv
package: a server of OpenEnv's own code on 127.0.0.1 (tests/interop/fixtures/openenv_guess.py),
the same env from a Docker image on the Docker backend, and the Environment class in-process.
Each passes `agentrl env check` and trains two steps through the CLI; bad input is one line, a
server that dies ends its episode with status error, and nothing is left running."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

import agentrl
from agentrl.env import EnvError
from agentrl.parsing import ToolCall
from tests.support.docker import require_docker
from tests.support.interop import TINY, one_error_line, run_cli, without_packages

pytest.importorskip("openenv.core")  # CI installs .[interop]; AGENTRL_REQUIRE_ALL fails the skip

FIXTURES = Path(__file__).parent / "fixtures"
CLASS_SPEC = f"openenv:{FIXTURES / 'openenv_guess.py'}:GuessEnvironment"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_server(port: int, app: str = "openenv_guess:app") -> subprocess.Popen[bytes]:
    """A fixture env served as OpenEnv serves any env: uvicorn on 127.0.0.1. Its log goes to a file:
    a pipe nobody reads fills after 64 KB of warnings (a client that hangs up mid-session logs a
    traceback) and then blocks the server."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - the server writes to it as long as it runs
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=FIXTURES,
                            stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    log.seek(0)
    raise RuntimeError(f"the OpenEnv fixture server did not start: {log.read().decode()[-2000:]}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server_url() -> object:
    port = _free_port()
    proc = start_server(port)
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)
    assert not _listening(port)


def _guess(env: agentrl.ToolEnv, guess: object) -> str:
    return env.tool_parser.format_call(ToolCall("step", {"guess": guess}))


# ---------------------------------------------------------------------------------------------
# the mapping: tools from the Action schema, observations, rewards, done, tasks
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["url", "class"])
def test_an_episode_maps_action_observation_reward_and_done(form: str, server_url: str) -> None:
    env = agentrl.make(f"openenv:{server_url}" if form == "url" else CLASS_SPEC, train_tasks=5, test_tasks=3)
    try:
        (step,) = env.tools
        assert step.name == "step" and step.parameters["required"] == ["guess"]
        assert "metadata" not in step.parameters["properties"]  # OpenEnv's bookkeeping field is hidden
        train, test = env.tasks("train"), env.tasks("test")
        assert len(train) == 5 and len(test) == 3
        assert not {t["reset"]["seed"] for t in train} & {t["reset"]["seed"] for t in test}
        task = train[2]
        target = __import__("random").Random(task["reset"]["seed"]).randint(1, 5)  # what reset(seed) picks
        messages, _ = env.reset(options={"task": task})
        assert "Guess it: you have 3 guesses" in messages[1]["content"]
        assert '"guess"' in messages[0]["content"]  # the schema reaches the model's tool list
        obs, _, terminated, truncated, _ = env.step(_guess(env, 9))  # outside the schema's 1..5
        assert not (terminated or truncated) and "invalid arguments" in obs[0]["content"]
        wrong = 1 if target != 1 else 2
        obs, _, terminated, _, _ = env.step(_guess(env, wrong))
        assert obs[0]["content"] == ("higher" if wrong < target else "lower") and not terminated
        obs, _, terminated, truncated, info = env.step(_guess(env, target))
        assert obs[0]["content"].startswith("correct") and terminated and not truncated
        assert info["ended_by"] == "done" and info["outcome_reward"] == 1.0  # the sum of the env's rewards
        messages, _ = env.reset(options={"task": task})  # a new episode: a new server-side session
        for _ in range(3):
            obs, _, terminated, truncated, info = env.step(_guess(env, wrong))
        assert terminated and info["outcome_reward"] == 0.0  # the env's own end after 3 guesses
    finally:
        env.close()


def test_gymnasium_make_builds_it_by_name() -> None:
    import gymnasium as gym

    env = gym.make("agentrl/env-v0", name=CLASS_SPEC, train_tasks=2)
    try:
        messages, _ = env.reset(seed=0)
        assert "Guess it" in messages[1]["content"]
        _, _, terminated, truncated, _ = env.step(_guess(env.unwrapped, 3))
        assert isinstance(terminated, bool) and not truncated
    finally:
        env.close()


@pytest.mark.parametrize("form", ["url", "class"])
def test_an_mcp_env_gives_one_tool_per_mcp_tool(form: str) -> None:
    port = _free_port()
    proc = start_server(port, "openenv_mcp:app") if form == "url" else None
    spec = f"openenv:http://127.0.0.1:{port}" if form == "url" else f"openenv:{FIXTURES / 'openenv_mcp.py'}:AdderEnvironment"
    env = agentrl.make(spec)
    try:
        assert env.is_mcp and [t.name for t in env.tools] == ["add"]
        assert env.tools[0].parameters["required"] == ["a", "b"]
        env.reset(options={"task": env.tasks()[0]})
        observation, *_ = env.step(env.tool_parser.format_call(ToolCall("add", {"a": 2, "b": 3})))
        assert observation[0]["content"] == "5"  # through step(CallToolAction) on the env
        observation, *_ = env.step(env.tool_parser.format_call(ToolCall("add", {"a": 2})))
        assert "'b' is a required property" in observation[0]["content"]
    finally:
        env.close()
        if proc is not None:
            stop_server(proc)
            assert not _listening(port)


def test_a_task_file_gives_reset_kwargs_prompts_and_splits(tmp_path: Path, server_url: str) -> None:
    rows = [{"id": f"r{i}", "reset": {"seed": i}, "prompt": f"Round {i}."} for i in range(10)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = agentrl.make(f"openenv:{server_url}", tasks=str(tmp_path / "rows.jsonl"))
    try:
        assert [t["id"] for t in env.tasks("test")] == ["r4", "r9"]
        assert len(env.tasks("train")) == 8
        messages, _ = env.reset(options={"task": env.tasks("test")[0]})
        assert messages[1]["content"].startswith("Round 4.")
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------
# through the CLI: env check for each form, two training steps for the class and image forms
# ---------------------------------------------------------------------------------------------

def _train(spec: str, tmp_path: Path, name: str) -> Path:
    # A loaded CPU generates slowly: a long episode budget keeps its episodes from being aborted.
    out = run_cli("train", "--env", spec, "trainer.steps=2", f"run.dir={tmp_path}", f"run.name={name}",
                  "env.max_turns=3", "env.kwargs.train_tasks=8", "env.kwargs.test_tasks=2",
                  "rollout.trajectory_timeout_s=1200", *TINY, timeout=1400)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and sum(r["policy_tokens"] for r in rows) > 0
    trajs = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert trajs and all(t["task_id"].startswith("seed-") for t in trajs)
    assert any("Guess it" in json.dumps(t) for t in trajs)  # the env's first observation reached the model
    return run


def test_url_form_env_check_through_the_cli(server_url: str) -> None:
    """The url form's own part is the connection: the image form below trains through the same
    client over a URL (its container's), so training is not repeated here."""
    out = run_cli("env", "check", f"openenv:{server_url}", "train_tasks=4", "test_tasks=2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK:" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
def test_class_form_env_check_and_train_through_the_cli(tmp_path: Path) -> None:
    out = run_cli("env", "check", CLASS_SPEC, "train_tasks=4", "test_tasks=2")
    assert out.returncode == 0, out.stdout + out.stderr
    _train(CLASS_SPEC, tmp_path, "oe-class")


def _image_tag() -> str:
    """The fixture image, tagged by what goes into it, so a rebuild happens only when it changes."""
    import openenv

    digest = hashlib.sha256()
    for file in ("openenv_guess.py", "openenv_image.py"):
        digest.update((FIXTURES / file).read_bytes())
    digest.update(str(getattr(openenv, "__version__", "")).encode() + sys.version.encode())
    return f"agentrl-test-openenv-guess:{digest.hexdigest()[:12]}"


def _ours(client: object) -> set[str]:
    """Ids of the OpenEnv containers and networks agentrl has running (by their label and name)."""
    containers = client.containers.list(all=True, filters={"label": "agentrl.pool=openenv"})  # type: ignore[attr-defined]
    networks = [n for n in client.networks.list() if n.name.startswith("agentrl-openenv-")]  # type: ignore[attr-defined]
    return {c.id for c in containers} | {n.id for n in networks}


@pytest.mark.slow
@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
def test_image_form_on_docker_trains_on_an_internal_network_and_leaves_nothing(tmp_path: Path) -> None:
    require_docker()
    import docker

    sys.path.insert(0, str(FIXTURES))
    try:
        import openenv_image
    finally:
        sys.path.remove(str(FIXTURES))
    client = docker.from_env(timeout=120)
    tag = _image_tag()
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        openenv_image.build(tag)  # offline: the host venv's packages copied onto agentrl's base image
    before = _ours(client)  # another run's, if any: ours must come and go

    out = run_cli("env", "check", f"openenv:{tag}", "train_tasks=4", "test_tasks=2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _ours(client) <= before  # removed when the command ended
    _train(f"openenv:{tag}", tmp_path, "oe-image")
    assert _ours(client) <= before

    # Network off: the server is reachable from the host on a private --internal bridge only.
    from agentrl.interop.docker_server import docker_server, stop_servers

    server = docker_server(tag)
    try:
        (network,) = server.container.attrs["NetworkSettings"]["Networks"]
        assert client.networks.get(network).attrs["Internal"] is True
        probe = server.container.exec_run(["python3", "-c", "import socket; s = socket.socket(); s.settimeout(3); "
                                           "print(s.connect_ex(('1.1.1.1', 80)))"])
        assert probe.output.strip() != b"0"  # no route out
    finally:
        stop_servers()
    assert _ours(client) <= before


# ---------------------------------------------------------------------------------------------
# bad input: one line, the right exit code; a dead server ends one episode
# ---------------------------------------------------------------------------------------------

def test_unreachable_url_is_one_line_before_any_work(tmp_path: Path) -> None:
    port = _free_port()
    out = run_cli("train", "--env", f"openenv:http://127.0.0.1:{port}", f"run.dir={tmp_path / 'runs'}")
    assert out.returncode == 1
    line = one_error_line(out)
    assert f"no OpenEnv server answers at http://127.0.0.1:{port}" in line and "fix: start the server" in line
    assert not (tmp_path / "runs").exists()


def test_unknown_class_names_close_matches_exit_2(tmp_path: Path) -> None:
    out = run_cli("train", "--env", f"openenv:{FIXTURES / 'openenv_guess.py'}:GuessEnviron",
                  f"run.dir={tmp_path / 'runs'}")
    assert out.returncode == 2
    line = one_error_line(out)
    assert "has no class 'GuessEnviron'" in line and "did you mean" in line and ":GuessEnvironment" in line
    assert not (tmp_path / "runs").exists()


def test_missing_package_names_the_extra_exit_1(tmp_path: Path, server_url: str) -> None:
    out = run_cli("train", "--env", f"openenv:{server_url}", f"run.dir={tmp_path / 'runs'}",
                  env=without_packages(tmp_path, "openenv", "openenv.core"))
    assert out.returncode == 1
    line = one_error_line(out)
    assert "OpenEnv is not installed" in line and "pip install 'agentrl[openenv]'" in line
    assert not (tmp_path / "runs").exists()


def test_a_server_that_dies_ends_the_episode_with_status_error_and_the_run_goes_on() -> None:
    # EnvError is what the rollout engine ends one trajectory on (status error), never the run.
    port = _free_port()
    proc = start_server(port)
    env = agentrl.make(f"openenv:http://127.0.0.1:{port}")
    other = agentrl.make(CLASS_SPEC)

    async def play() -> None:
        await env.areset(env.tasks()[0])
        stop_server(proc)  # dies mid-episode
        with pytest.raises(EnvError, match=r"OpenEnv server .* (stopped answering|cannot be reached)"):
            await env.astep(_guess(env, 1))
        with pytest.raises(EnvError, match="cannot be reached"):
            await env.areset(env.tasks()[1])  # the next episode on it: an error too, not a hang
        await env.aclose()
        await other.areset(other.tasks()[0])  # other envs go on
        result = await other.astep(_guess(other, 1))
        assert result.observation[0]["content"]
        await other.aclose()

    try:
        asyncio.run(play())
    finally:
        if proc.poll() is None:
            stop_server(proc)
    assert not _listening(port)
