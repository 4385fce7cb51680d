"""A package's source, as the swe env and its synthesis need it: a `NAME==VERSION` spec, its sdist
(downloaded once with pip, or shipped beside the tasks), unpacked, and what is in it (source files,
test files, import roots, declared test requirements)."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

TEST_DIRS = frozenset({"test", "tests", "testing"})
SPEC_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
SKIP_DIRS = frozenset({"docs", "doc", "build", "dist", "examples", "benchmarks", "bench", "scripts",
                       "tools", "ci", ".github", ".git"})
SKIP_FILES = frozenset({"setup.py", "versioneer.py", "_version.py", "conftest.py", "noxfile.py", "__main__.py"})
TEST_EXTRAS = ("test", "tests", "testing", "dev")
TOX_FACTOR = re.compile(r"^[\w.{},!-]+:\s")
NOT_NEEDED = re.compile(r"^(pytest-cov|coverage|pytest-xdist|tox|flake8|black|mypy|ruff|pre-commit|sphinx)\b",
                        re.I)


def parse_spec(spec: str) -> tuple[str, str]:
    m = SPEC_RE.match(spec.strip())
    if not m:
        raise ValueError(f"package spec {spec!r} must look like NAME==VERSION (e.g. inflection==0.5.1)")
    return m.group(1), m.group(2)


def fetch_sdist(spec: str, dest: Path) -> Path:
    """The sdist of `NAME==VERSION` in `dest`, downloaded with pip on first use."""
    name, version = parse_spec(spec)
    dest.mkdir(parents=True, exist_ok=True)
    found = _find_sdist(dest, name, version)
    if found:
        return found
    # build isolation as pip does by default: setuptools_scm / flit / hatch / poetry backends are
    # fetched for the metadata step (without it pip reads a setuptools_scm version as 0.0.0)
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--disable-pip-version-check",
           "-q", "-d", str(dest), spec]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = _find_sdist(dest, name, version)
    if r.returncode != 0 or not found:
        raise RuntimeError(f"pip could not download the sdist of {spec}: {(r.stderr or r.stdout)[-600:]}")
    return found


def _find_sdist(folder: Path, name: str, version: str) -> Path | None:
    norm = re.sub(r"[-_.]+", "_", name).lower()
    for f in sorted(folder.iterdir()):
        stem = re.sub(r"[-_.]+", "_", f.name).lower()
        if stem.startswith(f"{norm}_{re.sub(r'[-_.]+', '_', version).lower()}_tar") or \
                stem == f"{norm}_{re.sub(r'[-_.]+', '_', version).lower()}_tar_gz":
            return f
    return None


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack a source tarball into `dest` and return its single top folder."""
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise ValueError(f"{archive.name}: expected one top-level folder, found {[p.name for p in tops]}")
    return tops[0]


# ---------------------------------------------------------------------------------------------
# What is in the repository
# ---------------------------------------------------------------------------------------------


@dataclass
class Layout:
    source_files: list[str]
    test_files: list[str]
    pythonpath: list[str]
    test_requirements: list[str]


def analyse_repo(root: Path) -> Layout:
    """Source files (mutation targets), test files (pytest targets), import path and test deps."""
    sources, tests = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = PurePosixPath(rel).parts
        if any(p in SKIP_DIRS or p.endswith(".egg-info") or p.startswith(".") for p in parts[:-1]):
            continue
        if is_test_file(rel):
            if PurePosixPath(rel).name != "conftest.py" and PurePosixPath(rel).name != "__init__.py":
                tests.append(rel)
        elif parts[-1] not in SKIP_FILES and (len(parts) > 1 or not (root / "src").is_dir()):
            sources.append(rel)
    if not tests:
        raise ValueError(f"{root.name}: no test files (test_*.py, *_test.py, tests/) in the source archive")
    if not sources:
        raise ValueError(f"{root.name}: no Python source files besides the tests")
    pythonpath = ["src"] if (root / "src").is_dir() else []
    return Layout(sources, tests, pythonpath, test_requirements(root))


def test_requirements(root: Path) -> list[str]:
    """Test dependencies declared in pyproject.toml, setup.cfg, tox.ini or requirements files."""
    reqs: list[str] = []
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        try:
            import tomllib  # Python >= 3.11; older ones skip pyproject test extras

            data = tomllib.loads(pyproject.read_text())
        except (ImportError, ValueError):
            data = {}
        extras = data.get("project", {}).get("optional-dependencies", {})
        groups = data.get("dependency-groups", {})
        for key in TEST_EXTRAS:
            reqs += [r for r in extras.get(key, []) + groups.get(key, []) if isinstance(r, str)]
    cfg = configparser.ConfigParser(interpolation=None)
    for name in ("setup.cfg", "tox.ini"):
        if (root / name).exists():
            try:
                cfg.read(root / name)
            except configparser.Error:
                continue
    if cfg.has_section("options.extras_require"):
        for key in TEST_EXTRAS:
            reqs += cfg.get("options.extras_require", key, fallback="").split("\n")
    if cfg.has_section("testenv"):
        reqs += cfg.get("testenv", "deps", fallback="").split("\n")
    for f in sorted(root.glob("requirements*test*.txt")) + sorted(root.glob("requirements/test*.txt")):
        reqs += f.read_text().splitlines()
    out = []
    for r in reqs:
        r = r.split("#")[0].strip()
        if TOX_FACTOR.match(r):  # tox.ini "django22: Django>=2.2,<2.3": one env's pin, not pip syntax
            continue
        if r and not r.startswith(("-", "{", ".")) and not NOT_NEEDED.match(r) and r not in out:
            out.append(r)
    return out


def is_test_file(path: str) -> bool:
    """pytest's default discovery rules plus test directories."""
    p = PurePosixPath(path)
    return (p.name.startswith("test_") or p.name.endswith("_test.py") or p.name == "conftest.py"
            or any(part in TEST_DIRS for part in p.parts[:-1]))
