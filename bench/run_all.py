"""`make bench`: run every benchmark in quick mode and collect their JSON lines.

    .venv/bin/python bench/run_all.py [--only sandbox,learning] [--timeout-s 1200] [--out bench/results]

Runs bench/sandbox.py, bench/rollout.py, bench/laminar_sim.py and bench/learning.py with
`--quick`, one after the other. Each prints one JSON line; a missing script is reported, a
failing one is reported with its stderr tail, and neither stops the others. Writes
`latest.jsonl` (a first line with the time, git commit and machine, then one line per benchmark)
and appends the same lines to `history.jsonl`, both in --out, and prints them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, ROOT, git_commit, machine_info, utc_now

BENCHES = ("sandbox", "rollout", "laminar_sim", "learning")


def last_json_line(stdout: str) -> dict[str, Any] | None:
    """The last line of `stdout` that is a JSON object (scripts may log before it)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def run_one(name: str, timeout_s: float, bench_dir: Path = ROOT / "bench") -> dict[str, Any]:
    """Run bench/<name>.py --quick; returns {"bench", "status", "seconds", "result" | "error"}."""
    script = bench_dir / f"{name}.py"
    if not script.exists():
        return {"bench": name, "status": "missing", "error": f"{script.relative_to(ROOT)} does not exist yet"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(script), "--quick"], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-1500:] if isinstance(e.stderr, bytes) else (e.stderr or "")[-1500:]
        return {"bench": name, "status": "timeout", "seconds": round(time.perf_counter() - t0, 1),
                "error": f"no result within {timeout_s:.0f} s", "stderr_tail": str(tail)}
    seconds = round(time.perf_counter() - t0, 1)
    result = last_json_line(proc.stdout)
    if proc.returncode != 0 or result is None:
        why = f"exit code {proc.returncode}" if proc.returncode != 0 else "no JSON line on stdout"
        return {"bench": name, "status": "failed", "seconds": seconds, "error": why,
                "stderr_tail": proc.stderr[-1500:]}
    return {"bench": name, "status": "ok", "seconds": seconds, "result": result}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(BENCHES), help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--timeout-s", type=float, default=1500.0, help="per benchmark")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHES]
    if unknown or not names:
        ap.error(f"--only: unknown {unknown or 'empty list'}; choose from {', '.join(BENCHES)}")
    if not args.timeout_s > 0:
        ap.error(f"--timeout-s must be > 0, got {args.timeout_s}")

    args.out.mkdir(parents=True, exist_ok=True)
    lines = [{"bench": "meta", "time": utc_now(), "git_commit": git_commit(), "machine": machine_info(),
              "python": sys.executable}]
    for name in names:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        lines.append(run_one(name, args.timeout_s))
        print(f"[bench] {name}: {lines[-1]['status']}", file=sys.stderr, flush=True)
    text = "".join(json.dumps(line, default=str) + "\n" for line in lines)
    (args.out / "latest.jsonl").write_text(text)
    with open(args.out / "history.jsonl", "a") as f:
        f.write(text)
    sys.stdout.write(text)
    print(f"[bench] wrote {args.out / 'latest.jsonl'}", file=sys.stderr)
    return 0 if all(line.get("status", "ok") in ("ok", "missing") for line in lines[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
