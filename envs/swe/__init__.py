"""The built-in `swe` environment (architecture.md §3): SWE-bench-style bug fixing in a sandbox.

    source.py    a package's source: NAME==VERSION specs, sdists (pip), unpacking, what is in them
    datasets.py  published datasets' records (SWE-bench, SWE-Gym, SWE-smith) in agentrl's schema
    schema.py    task schema (SWE-bench fields) and loaders: load_tasks(path), builtin_tasks()
    runtime.py   per-package task runtimes (venvs) and the sandboxes that mount them
    grade.py     grading a diff in a fresh sandbox; validation (gold = 1, empty = 0) of a task set
    images.py    per-package docker images of synthesised tasks
    mutate.py    AST bug injection: find_mutations(source, path)
    synth.py     task synthesis from a package's sdist by bug injection
    batch.py     synthesis over many packages, each validated, with a per-package report
    cli.py       `agentrl swe synth | validate | build | stats`
    demos.py     demonstrations (the gold hunks through the editor)
    env.py       SWEEnv (ToolEnv with bash, str_replace_editor, submit; G-RA step signals)

Each imports only those above it in this list.

The env module is imported lazily (agentrl.make("swe") loads it), so the pipeline pieces stay
usable without the env machinery.
"""

from .schema import TaskError, builtin_tasks, load_tasks

__all__ = ["TaskError", "builtin_tasks", "load_tasks"]
