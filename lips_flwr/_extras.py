"""The optional extras: a missing one is one line naming the ``pip install`` that adds it.

The base install (``flwr`` and ``numpy``) covers the strategies, the client
side and the core. :mod:`lips_flwr.experiments` and the ``lips-flwr``
command need torch and the rest of ``lips-flwr[examples]``. Without torch,
importing :mod:`lips_flwr.experiments` raises :class:`MissingExtraError`,
whose message is that line, and the command (:func:`main`, the
``[project.scripts]`` entry) prints it and exits 2.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from importlib.util import find_spec

EXAMPLES_INSTALL = 'pip install "lips-flwr[examples]"'


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs it.

    A :class:`ModuleNotFoundError` (``name`` is the first missing module), so
    code that guards an optional import with ``except ImportError`` keeps
    working. Not a :class:`~lips_flwr.errors.LipsError`: the install lacks
    something, the user's input is fine.
    """


def require(what: str, modules: Iterable[str]) -> None:
    """Raise :class:`MissingExtraError` if any of ``modules`` is not installed (``what`` needs them).

    Looks the modules up without importing them: a check that costs nothing
    where they are installed.
    """
    missing = [name for name in modules if find_spec(name) is None]
    if missing:
        raise MissingExtraError(f"{what} needs {', '.join(missing)}, which is not installed: "
                                f"{EXAMPLES_INSTALL}", name=missing[0])


def main(argv: list[str] | None = None) -> int:
    """The ``lips-flwr`` command: :func:`lips_flwr.experiments.compare.cli.main`, or, without its extra,
    one line on stderr naming the ``pip install`` and exit 2 (the command's usage-error status)."""
    try:
        from .experiments.compare.cli import main as command
    except MissingExtraError as err:
        print(f"lips-flwr: {err}", file=sys.stderr)
        return 2
    return command(argv)


__all__ = ["EXAMPLES_INSTALL", "MissingExtraError", "main", "require"]
