"""The commands the README and docs/*.md document, run as a user runs them.

- `make train` is the search job (and `make train ENV=swe` the swe one): what make would run;
- the README's default job, `agentrl train --env search`, end to end at a smoke size on the real
  embedded model (warm start, held-out evaluations, one RL step), ending with the one line that
  says whether held-out success rose (CI's stage 1 smokes `make train ENV=swe`);
- every `agentrl ...` line in a code block of README.md or docs/*.md: a `train` command resolves
  its config (`--dry-run`, the CLI's own path), any other command's subcommand exists and takes
  every flag the line uses (its `--help`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.evaluate import verdict_line

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _record(phase: str, success: float, n: int = 4) -> dict:
    return {"phase": phase, "heldout_success": success, "heldout_n": n, "heldout_samples": 1}


def test_the_verdict_says_whether_heldout_success_rose_and_by_how_much() -> None:
    rose = verdict_line([_record("base", 0.0, 48), _record("warm_start", 0.563, 48), _record("final", 0.667, 48)])
    assert rose == ("held-out success rose by 0.667: 0.000 (the base model) → 0.667 (the end), "
                    "n=48 held-out tasks")
    flat = verdict_line([_record("base", 0.0), _record("final", 0.0)])
    assert flat is not None and flat.startswith("held-out success did not rise: 0.000")
    fell = verdict_line([_record("warm_start", 0.5), _record("final", 0.25)])
    assert fell is not None and fell.startswith("held-out success fell by 0.250: 0.500 (after the warm start)")
    assert verdict_line([_record("base", 0.0)]) is None  # no final evaluation (Ctrl-C): nothing to say


@pytest.mark.parametrize(("args", "env"), [([], "search"), (["ENV=swe"], "swe")])
def test_make_train_runs_search_and_swe_is_one_flag_away(args: list[str], env: str) -> None:
    out = subprocess.run(["make", "-n", "train", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"/bin/agentrl train --env {env}" in out.stdout


SMOKE = ["trainer.steps=1", "trainer.checkpoint_every=1", "trainer.batch_groups=1", "rollout.group_size=2",
         "rollout.concurrency=2", "trainer.micro_batch_size=2", "sampling.max_tokens=40", "eval.n=2",
         "eval.concurrency=2", "trainer.warm_start.tasks=2", "trainer.warm_start.per_task=1",
         "trainer.warm_start.epochs=1", "trainer.warm_start.batch_size=2", "trainer.max_gen_batches=1"]


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a few minutes on an idle 2-core CPU; a loaded one takes several times that
def test_the_readme_default_job_at_smoke_size_ends_with_the_verdict(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--env", "search", "--quiet", *SMOKE,
                          f"run.dir={tmp_path}", "run.name=search"], capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "search"
    phases = [json.loads(line)["phase"] for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert phases == ["base", "warm_start", "final"]  # the README's three stages
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0]
    summary = json.loads((run_dir / "summary.json").read_text())
    last = out.stdout.strip().splitlines()[-1]
    assert last == f"[agentrl] {summary['heldout_verdict']}"
    base, final = summary["heldout_base"]["heldout_success"], summary["heldout_final"]["heldout_success"]
    assert f"{base:.3f} (the base model) → {final:.3f} (the end), n=2" in last
    assert (run_dir / "report" / "index.html").stat().st_size > 0


def documented_commands() -> list[tuple[str, list[str], bool]]:
    """(where, argv after `agentrl`, concrete) for each `agentrl ...` command in README.md and
    docs/*.md: every one in a shell code block (a trailing backslash continues the line, `# ...`
    ends it), and every inline code span that starts with one (also after `/usr/bin/time -v`).
    A span with placeholders (`NAME`, `RUN_DIR`, `[--flag X]`, `a|b`) is a synopsis, not concrete."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for lang, block in re.findall(r"^```([a-z]*)\n(.*?)^```", text, flags=re.M | re.S):
            if lang not in ("", "bash", "sh", "console"):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                if not re.search(r"(^|\s)(\S*/bin/)?agentrl\s", line):
                    continue
                words = shlex.split(line, comments=True)
                for i, word in enumerate(words):
                    if word == "agentrl" or word.endswith("/bin/agentrl"):
                        found.append((f"{doc.name}: {line.strip()}", words[i + 1:], True))
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        for span in re.findall(r"`([^`\n]+)`", prose):
            if match := re.match(r"(/usr/bin/time -v )?(\.venv/bin/)?agentrl\s+(.*)", span):
                argv = match.group(3).replace("\\|", "|").split()
                concrete = (len(argv) > 1 and not re.search(r"[\[\]{}|<>]|\.\.\.", match.group(3))
                            and not any(re.fullmatch(r"[A-Z][A-Z_]+(==[A-Z]+)?", w) for w in argv))
                found.append((f"{doc.name}: `{span}`", argv, concrete))
    return found


COMMANDS = documented_commands()


def test_the_docs_document_commands() -> None:
    assert len(COMMANDS) >= 20
    assert any(argv[:3] == ["train", "--env", "search"] and concrete for _, argv, concrete in COMMANDS)


@pytest.mark.parametrize(("where", "argv", "concrete"), COMMANDS, ids=[where for where, _, _ in COMMANDS])
def test_a_documented_command_runs(where: str, argv: list[str], concrete: bool, capsys: pytest.CaptureFixture[str],
                                   tmp_path: Path) -> None:
    if concrete and argv[:1] == ["train"]:  # the whole command, up to the point where it would start work
        code = main([*argv, f"run.dir={tmp_path}", "--dry-run"])
        out = capsys.readouterr()
        if code != 0 and (user := re.search(r"no module '([\w.]+)'", out.err)):
            # an example naming the reader's own module (`trl:my_envs:IncrementEnv`): the command got as far
            # as importing it, and the module is indeed nobody's here
            assert importlib.util.find_spec(user.group(1)) is None, f"{where}: {out.err}"
            return
        assert code == 0, f"{where}: {out.err}"
        assert "# agentrl: the resolved config" in out.out
        return
    # any other command, and a synopsis: its subcommand exists and takes every flag it names
    words = [w for w in argv if not w.startswith("-")]
    path = [w for w in words[:1] if re.fullmatch(r"[a-z]+", w)]
    path += [w for w in words[1:2] if path in (["env"], ["sandbox"], ["swe"]) and re.fullmatch(r"[a-z]+", w)]
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0, where
    help_text = capsys.readouterr().out
    for flag in (w.split("=")[0].strip("[]") for w in argv if w.lstrip("[").startswith("--")):
        assert flag in help_text, f"{where}: `agentrl {' '.join(path)}` takes no {flag}"
