"""The `code` env's in-sandbox grader: hidden tests in one process, the submission in another.

Run as `python3 -I -c <this source> grade ENTRY` with one JSON line on stdin:
{"nonce": ..., "helpers": <the prompt's trusted helper code>, "tests": <check(candidate)>,
"source": <this source>}. Standard library only.

Why two processes: a submission that shares the tests' process can read their secrets (the
nonce, the expected values), patch `builtins` or the test code, return an object whose `__eq__`
is always True, or exit early. Here:
- the grader makes itself non-dumpable first, so the submission (same uid) cannot open its
  /proc/<pid>/fd, read its memory or ptrace it; the nonce and the tests arrive on its stdin and
  never touch the disk;
- the submission is imported only by a child process (`serve`) whose stdin and stdout are
  /dev/null; it talks to the grader over a private pipe pair;
- every call of `candidate(...)` in the tests is one request on that pipe; arguments and results
  cross it as plain data (None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset)
  rebuilt by the grader, so a result can never be an object of the submission's making;
- the grader prints the nonce only after `check(candidate)` returned; the host requires it as the
  last line of stdout. Ending either process early, or in any state, prints no nonce.
"""

import builtins
import importlib.util
import json
import os
import subprocess
import sys

MAX_LINE = 64 * 2**20  # longest answer the grader reads from the submission's process
MAX_DEPTH = 200


class Opaque:
    """A result the wire cannot carry (a function, a custom object): equal to nothing but itself."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"<unsupported result of type {self.kind}>"


def encode(value, depth=0):
    """Plain data as JSON-able tagged lists; exact types only (a subclass is opaque)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    kind = type(value)
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", format(value, "x")]  # hex: no int-to-decimal digit limit
    if kind is float:
        return ["f", value.hex()]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", value.hex()]
    if kind in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[kind]
        return [tag, [encode(v, depth + 1) for v in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    return ["o", kind.__name__ if isinstance(kind.__name__, str) else "?"]


def decode(data, depth=0):
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    tag = data[0]
    if tag == "n":
        return None
    if tag == "b":
        return data[1] is True
    if tag == "i":
        return int(str(data[1]), 16)
    if tag == "f":
        return float.fromhex(str(data[1]))
    if tag == "s":
        return str(data[1])
    if tag == "y":
        return bytes.fromhex(str(data[1]))
    if tag in ("l", "t", "S", "F"):
        items = [decode(v, depth + 1) for v in data[1]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in data[1]}
    return Opaque(str(data[1])[:60])


def undumpable() -> bool:
    try:
        import ctypes  # inside the try: a minimal Python may lack it, and then we refuse

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0 and libc.prctl(3, 0, 0, 0, 0) == 0
    except Exception:
        return False


def serve(rfd: int, wfd: int, entry: str) -> None:
    """The submission's process: import solution.py, answer calls of `entry` until EOF."""
    reader, writer = os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb")
    spec = importlib.util.spec_from_file_location("solution", "solution.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, entry)
    for line in reader:
        try:
            args, kwargs = decode(json.loads(line))
            answer = ["ok", encode(fn(*args, **kwargs))]
        except BaseException as e:  # the tests may expect an exception; report its kind
            answer = ["raise", type(e).__name__, str(e)[:500]]
        writer.write((json.dumps(answer) + "\n").encode())
        writer.flush()


class CandidateGone(Exception):
    """The submission's process ended or answered nonsense."""


def grade(entry: str) -> int:
    if not undumpable():
        print("grader: cannot make itself non-dumpable (no ctypes/prctl); refusing to grade", file=sys.stderr)
        return 3
    spec = json.loads(sys.stdin.readline())
    nonce = spec.pop("nonce")
    from_grader, to_child = os.pipe()  # (read end, write end)
    from_child, to_grader = os.pipe()
    child = subprocess.Popen([sys.executable, "-I", "-c", spec["source"], "serve", str(from_grader),
                              str(to_grader), entry], pass_fds=(from_grader, to_grader),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    os.close(from_grader)
    os.close(to_grader)
    writer, reader = os.fdopen(to_child, "wb"), os.fdopen(from_child, "rb")

    def candidate(*args, **kwargs):
        try:
            writer.write((json.dumps(encode([list(args), kwargs])) + "\n").encode())
            writer.flush()
            line = reader.readline(MAX_LINE)
        except OSError as e:
            raise CandidateGone(f"the submission's process is gone: {e}") from None
        if not line.endswith(b"\n"):
            raise CandidateGone("the submission's process ended (or sent an over-long answer)")
        try:
            answer = json.loads(line)
            if answer[0] == "ok":
                return decode(answer[1])
            kind = getattr(builtins, str(answer[1]), None)
            message = str(answer[2])
        except Exception as e:
            raise CandidateGone(f"unreadable answer from the submission: {type(e).__name__}") from None
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            kind = RuntimeError
        raise kind(message)

    candidate.__name__ = entry
    namespace = {"__name__": "hidden_tests"}
    try:
        exec(compile(spec["helpers"], "prompt_helpers.py", "exec"), namespace)
        namespace[entry] = candidate  # as before: some HumanEval tests call the function by name
        exec(compile(spec["tests"], "hidden_tests.py", "exec"), namespace)
        namespace["check"](candidate)
    except BaseException as e:
        print(f"FAILED: {type(e).__name__}: {str(e)[:500]}", file=sys.stderr)
        return 1
    finally:
        child.kill()
        child.wait()
    print(nonce)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(grade(sys.argv[2]))
