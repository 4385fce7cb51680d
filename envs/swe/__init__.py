"""The built-in `swe` environment (architecture.md §3): SWE-bench-style bug fixing in a sandbox.

    schema.py  task schema (SWE-bench fields) and loaders: load_tasks(path), builtin_tasks()
    mutate.py  AST bug injection: find_mutations(source, path)
    synth.py   task synthesis from a package's sdist: `agentrl swe synth --package NAME==VERSION`
    grade.py   grading a diff in a fresh sandbox; validate_task(task, sandbox)
    env.py     SWEEnv (ToolEnv with bash, str_replace_editor, submit; G-RA step signals)

The env module is imported lazily (agentrl.make("swe") loads it), so the pipeline pieces stay
usable without the env machinery.
"""

from .schema import TaskError, builtin_tasks, load_tasks

__all__ = ["TaskError", "builtin_tasks", "load_tasks"]
