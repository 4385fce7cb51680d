"""What every adapter of a foreign ecosystem says when its package or its name is wrong.

    ta = require("textarena", scheme="textarena")        # UserError naming the extra to install
    check_known("game", "TicTacToe-v9", ids, scheme="textarena")  # ConfigError naming close matches
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable
from types import ModuleType

from agentrl.config import ConfigError
from agentrl.env import SCHEMES
from agentrl.errors import UserError


def require(module: str, *, scheme: str) -> ModuleType:
    """Import an adapter's third-party package, or say which extra installs it (exit 1)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        extra = SCHEMES[scheme].extra if scheme in SCHEMES else scheme
        raise UserError(f"'{scheme}:' envs need the {module} package, which does not import ({e})",
                        fix=f"pip install 'agentrl[{extra}]'") from None


def check_known(kind: str, name: str, known: Iterable[str], *, scheme: str) -> None:
    """ConfigError (exit 2) when `name` is not among `known`, naming the closest ones."""
    choices = sorted(set(known))
    if name in choices:
        return
    close = difflib.get_close_matches(name, choices, n=5, cutoff=0.5)
    hint = (f"did you mean {', '.join(close)}?" if close
            else f"known: {', '.join(choices[:12])}{', ...' if len(choices) > 12 else ''}")
    raise ConfigError(f"{scheme}: unknown {kind} '{name}'; {hint}")
