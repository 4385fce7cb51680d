"""A wheel holds every module and config file of the source tree: `pip install .` (the Dockerfile's
cluster-node image) is not an editable install, and a package missing from pyproject's explicit
list is missing there only (a wheel once lacked agentrl.endpoint and agentrl.inference.cpu)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.checkout import copy_checkout

# source folder -> where the wheel puts it (pyproject.toml [tool.setuptools.package-dir])
MAPPED = {"agentrl": "agentrl", "envs": "agentrl/envs", "tools": "agentrl/tools",
          "sandboxes": "agentrl/sandboxes", "configs": "agentrl/configs"}


def test_the_wheel_holds_every_module_and_config_file(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: setuptools' build/ folder in a working tree can hold stale files
    tracked = copy_checkout(src, lambda rel: rel.partition("/")[0] in MAPPED or rel in ("pyproject.toml", "README.md"))
    expected = {f"{MAPPED[rel.partition('/')[0]]}/{rel.partition('/')[2]}" for rel in tracked
                if rel.endswith((".py", ".yaml")) and rel.partition("/")[0] in MAPPED}
    assert "agentrl/inference/cpu/policy.py" in expected and "agentrl/configs/base.yaml" in expected
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("agentrl-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = set(z.namelist())
    assert sorted(expected - shipped) == []
