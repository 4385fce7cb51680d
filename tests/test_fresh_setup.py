"""What a fresh install sees: a quiet build that ships every data file, and `gymnasium.make` finding
agentrl's envs in a fresh interpreter the way the README says (Gymnasium >= 1.0 has no plugin entry
points; its "module:id" form imports the registering module first)."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _clone(dest: Path) -> Path:
    """The files a fresh clone has (tracked by git; a work in progress is not), copied to `dest`,
    so the build sees what a new user's does and leaves no build/ folder in the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def test_wheel_builds_without_setuptools_warnings_and_ships_the_data(tmp_path: Path) -> None:
    src = _clone(tmp_path / "src")
    # --no-build-isolation: the venv's setuptools (no network); -v so the backend's warnings reach us.
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                          "--disable-pip-version-check", "-w", str(tmp_path), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    for noise in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "is absent from the `packages`"):
        assert noise not in text, text[text.find(noise) - 200: text.find(noise) + 800]
    (wheel,) = tmp_path.glob("agentrl-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"agentrl/configs/{p.name}" for p in (src / "configs").glob("*.yaml")}
    wanted |= {f"agentrl/envs/{p.relative_to(src / 'envs')}" for p in (src / "envs").glob("**/data/**/*")
               if p.is_file()}
    assert any("/data/" in w for w in wanted)  # the SWE tasks and sdists at least
    assert wanted <= shipped, sorted(wanted - shipped)


def test_gymnasium_make_finds_agentrl_envs_in_a_fresh_interpreter() -> None:
    code = ("import sys, gymnasium as gym\n"
            "env = gym.make('agentrl:agentrl/code-v0')\n"  # as the README writes it
            "print(type(env.unwrapped).__name__)\n"
            "print(type(gym.make('my_env:agentrl/add-v0').unwrapped).__name__)\n"  # a user env's module
            "print(sorted(i for i in gym.envs.registry if i.startswith('agentrl/')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT / "examples")
    assert out.returncode == 0, out.stderr[-3000:]
    builtin, user, ids = out.stdout.splitlines()[:3]
    assert (builtin, user) == ("CodeEnv", "AddEnv")
    for name in ("code", "search", "swe", "summarize", "add"):
        assert f"agentrl/{name}-v0" in ids
