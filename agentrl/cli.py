"""The `agentrl` command (architecture.md §10).

    agentrl train --env swe [--config FILE] [key.path=value ...] [--dry-run]
    agentrl eval --env code --model PATH_OR_RUN --n 8
    agentrl envs | env check NAME | sandbox build|ls|prune | swe synth | report RUN_DIR

Imports are lazy so `agentrl --help` answers at once. Exit codes: 0 ok, 1 failure, 2 bad usage
or bad config (nothing was started).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import agentrl


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", help="built-in env (code, search, swe, ...), a registered name, or module:Class")
    p.add_argument("--config", help="a YAML file applied on top of configs/base.yaml and configs/<env>.yaml")
    p.add_argument("--backend", choices=["auto", "laminar", "sync", "global-async"], help="= laminar.backend")
    p.add_argument("--engine", choices=["hf", "vllm", "openai"], help="= engine.kind")
    p.add_argument("--model", help="= model.name: smollm2-135m (embedded), a local HF folder or a hub id")
    p.add_argument("--ray", metavar="ADDRESS", help="run on Ray: 'local' or a cluster address such as auto")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config, non-default values marked, and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="dotted config overrides")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrl",
        description="Reinforcement learning of LLM agents that act over many turns with tools in sandboxes.")
    # main() takes --debug from anywhere on the line; declared here so --help shows it.
    parser.add_argument("--debug", action="store_true", help="on a failure, also print the full traceback")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("train", help="train a policy on an environment")
    _add_train_args(p)

    p = sub.add_parser("sft", help="supervised warm start on the env's demonstrations or recorded trajectories")
    p.add_argument("--env", required=True, help="an env with demonstrations (code, search, swe, ...) or any env with --data")
    p.add_argument("--data", metavar="FILE.jsonl", help="recorded trajectories (a run's trajectories.jsonl), "
                                                        "kept if reward >= trainer.warm_start.min_reward")
    p.add_argument("--config", default=None)
    p.add_argument("--model", help="= model.name")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key.path=value")

    p = sub.add_parser("eval", help="evaluate a model or a run's checkpoint on an environment")
    p.add_argument("--env", required=True)
    p.add_argument("--model", default=None, help="model name/path or a run directory (default: the embedded model)")
    p.add_argument("--n", type=int, default=8, help="number of episodes")
    p.add_argument("--config", default=None)
    p.add_argument("--split", default="test")
    p.add_argument("overrides", nargs="*", metavar="key.path=value")

    p = sub.add_parser("serve", help="serve a model or a run's checkpoint as an OpenAI-compatible endpoint "
                                     "on 127.0.0.1 (no training)")
    p.add_argument("target", metavar="RUN_DIR_OR_MODEL", help="a run directory (its latest checkpoint) or a model")
    p.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free port)")
    p.add_argument("--config", default=None)
    p.add_argument("overrides", nargs="*", metavar="key.path=value")

    sub.add_parser("envs", help="list registered environments")

    p = sub.add_parser("env", help="environment tools")
    env_sub = p.add_subparsers(dest="env_command", metavar="ENV_COMMAND")
    c = env_sub.add_parser("check", help="check an env against the Gymnasium and agentrl contracts")
    c.add_argument("name")
    c.add_argument("kwargs", nargs="*", metavar="key=value", help="constructor keyword arguments")
    c.add_argument("--adversarial", action="store_true",
                   help="also submit known reward hacks; they must score no better than a wrong answer")

    p = sub.add_parser("sandbox", help="sandbox images and containers")
    sb_sub = p.add_subparsers(dest="sandbox_command", metavar="SANDBOX_COMMAND")
    sb_sub.add_parser("build", help="build the base sandbox image (debootstrap + docker import)")
    c = sb_sub.add_parser("ls", help="list agentrl containers")
    c.add_argument("--run-id", default=None)
    c = sb_sub.add_parser("prune", help="remove leaked agentrl containers (also those of crashed runs)")
    c.add_argument("--run-id", default=None)
    c.add_argument("--older-than", type=float, default=None, metavar="SECONDS")

    p = sub.add_parser("swe", help="SWE task tools")
    swe_sub = p.add_subparsers(dest="swe_command", metavar="SWE_COMMAND")
    # `swe synth|validate|build|stats ...` hand their own arguments to agentrl.envs.swe.cli (see main()).
    swe_sub.add_parser("synth", help="synthesise SWE tasks from a real package by bug injection "
                                     "(--package NAME==VERSION [--max-tasks N] [--out FILE] [--validate])")
    swe_sub.add_parser("validate", help="check that every task's gold patch scores 1 and the empty patch 0")
    swe_sub.add_parser("build", help="prepare the task runtimes of a task set once ([--tasks FILE] [--backend docker])")
    swe_sub.add_parser("stats", help="count tasks by package, split and operator ([--tasks FILE] [--json])")

    p = sub.add_parser("report", help="write PNG plots and an HTML summary for a run")
    p.add_argument("run_dir")
    return parser


def _cmd_train(args: argparse.Namespace) -> int:
    from agentrl.config import explain_config, load_config  # lazy, as every command's own modules

    overrides = list(args.overrides)
    for flag, key in (("backend", "laminar.backend"), ("engine", "engine.kind"), ("model", "model.name")):
        if getattr(args, flag):
            overrides.append(f"{key}={getattr(args, flag)}")
    if args.quiet:
        overrides.append("run.quiet=true")
    if args.ray:
        overrides.append(f"laminar.ray_address={args.ray}")
    from agentrl.plan import prepare_run  # light: a bad flag or config is one line before torch loads

    plan = prepare_run(env=args.env, config_file=args.config, overrides=overrides, resume=args.resume)
    if args.dry_run:
        print(explain_config(plan.config, load_config()), end="")
        return 0
    from agentrl.run import train  # heavy lazy load: torch, the engine

    return train(plan)


def _cmd_sft(args: argparse.Namespace) -> int:
    from agentrl.plan import prepare_sft  # light: a bad flag or config is one line before torch loads

    overrides = list(args.overrides) + (["run.quiet=true"] if args.quiet else [])
    if args.model:
        overrides.append(f"model.name={args.model}")
    plan = prepare_sft(args.env, args.config, overrides, args.data)
    from agentrl.sft import run_sft  # heavy lazy load: torch, the model

    return run_sft(plan)


def _cmd_eval(args: argparse.Namespace) -> int:
    from agentrl.plan import prepare_eval  # light: a bad flag or config is one line before torch loads

    plan = prepare_eval(args.env, args.model, args.n, args.config, args.overrides)
    from agentrl.evaluate import main as eval_main  # heavy lazy load: torch, the engine

    return eval_main(plan.config, plan.checkpoint, args.n, args.split, model=args.model)


def _cmd_serve(args: argparse.Namespace) -> int:
    from agentrl.plan import resolve_target  # light: a bad target or config is one line before torch loads

    plan = resolve_target(args.target, None, args.config, args.overrides)
    from agentrl.serve import main as serve_main  # heavy lazy load: torch, the engine, uvicorn

    return serve_main(plan.config, plan.checkpoint, args.target, port=args.port)


def _cmd_envs(_: argparse.Namespace) -> int:
    for name, target in sorted(agentrl.registry().items()):
        print(f"{name:16s} {target}")
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    if args.env_command != "check":
        build_parser().parse_args(["env", "--help"])
    from agentrl.envcheck import main as check_main  # heavy lazy load: the env and its sandboxes

    return check_main([args.name, *args.kwargs, *(["--adversarial"] if args.adversarial else [])])


def _cmd_sandbox(args: argparse.Namespace) -> int:
    if args.sandbox_command == "build":
        script = Path(__file__).resolve().parent.parent / "scripts" / "docker_up.sh"
        return subprocess.call(["bash", str(script)])
    from agentrl.sandboxes import admin  # lazy: the Docker SDK

    if args.sandbox_command == "ls":
        for row in admin.list_containers(run_id=args.run_id):
            print(json.dumps(row))
        return 0
    if args.sandbox_command == "prune":
        removed = admin.prune(run_id=args.run_id, older_than_s=args.older_than)
        dirs = admin.prune_local_dirs()
        print(f"removed {removed} container(s) and {dirs} leftover local sandbox dir(s)")
        return 0
    build_parser().parse_args(["sandbox", "--help"])
    return 2


def _cmd_swe(args: argparse.Namespace) -> int:
    build_parser().parse_args(["swe", "--help"])  # bare `agentrl swe`: show its commands
    return 2


def _cmd_report(args: argparse.Namespace) -> int:
    from agentrl.report import write_report  # heavy lazy load: matplotlib

    out = write_report(args.run_dir)
    print(f"report written to {out}")
    return 0


COMMANDS = {"train": _cmd_train, "sft": _cmd_sft, "eval": _cmd_eval, "serve": _cmd_serve, "envs": _cmd_envs,
            "env": _cmd_env, "sandbox": _cmd_sandbox, "swe": _cmd_swe, "report": _cmd_report}


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["swe"] and argv[1:2] in (["synth"], ["validate"], ["build"], ["stats"]):
        from agentrl.envs.swe.cli import main as synth_main  # lazy: the swe env's task tooling

        return synth_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return COMMANDS[args.command](args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A failure ends with one line on stderr naming the problem and the fix
    (agentrl.errors.explain): exit 2 for usage and config errors, 1 at run time; `--debug`, anywhere
    on the line, also prints the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    head = argv[: argv.index("--")] if "--" in argv else argv
    debug = "--debug" in head
    if debug:
        argv.remove("--debug")
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        return _dispatch(argv)
    except KeyboardInterrupt:
        print(f"agentrl {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`agentrl swe stats | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141
    except Exception as e:
        from agentrl.errors import explain  # lazy: only a failure needs it

        if debug:
            traceback.print_exc()
        code, line = explain(e)
        print(f"agentrl {command}: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
