"""The node count ``flwr run`` would simulate an app with, and where it comes from.

flwr 1.42 no longer reads the node count from an app's ``[tool.flwr.app]``.
``flwr run APP_DIR`` (no SuperLink connection named, no
``--federation-config``) simulates with, first found:

1. the app's own federation: an old-style ``[tool.flwr.federations]`` in its
   ``pyproject.toml`` (``default = "NAME"``, ``[tool.flwr.federations.NAME]
   options.num-supernodes``), which ``flwr run`` migrates into the user's
   Flower config and makes the default connection;
2. the user's Flower config, ``$FLWR_HOME/config.toml`` (``~/.flwr`` without
   ``FLWR_HOME``): the default connection's ``options.num-supernodes``
   (``[superlink] default = "local"``, ``[superlink.local]``);
3. Flower's default, ``flwr.supercore.constant.DEFAULT_SIMULATION_CONFIG``: 2.

A count set inside a running local SuperLink (``flwr federation
simulation-config``) lives in that SuperLink's state and is not read here.
Before all of them come compare's own ``--num-supernodes`` and the
``[federation] num-supernodes`` of a ``--run-config`` file (:func:`node_count`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..runner.apps import load_app


def flower_default() -> int:
    """Flower's own default node count for a simulation (2 in flwr 1.42)."""
    try:
        from flwr.supercore.constant import DEFAULT_SIMULATION_CONFIG
    except ImportError:  # (another flwr: its documented default)
        return 2
    return int(DEFAULT_SIMULATION_CONFIG.num_supernodes)


@dataclass(frozen=True)
class NodeCount:
    """A node count and where it comes from, in words (``"the app's [tool.flwr.federations.local]"``)."""

    nodes: int
    source: str

    def __str__(self) -> str:
        return f"{self.nodes} nodes, from {self.source}"


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: num-supernodes must be an integer >= 1, got {value!r}")
    return value


def flower_config_path() -> Path:
    """The user's Flower config as flwr finds it: ``$FLWR_HOME/config.toml``, else ``~/.flwr/config.toml``."""
    home = os.environ.get("FLWR_HOME")
    return (Path(home) if home else Path.home() / ".flwr") / "config.toml"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"cannot read {str(path)!r}: {err}") from err


def _default_entry_count(table: Any, where: Callable[[str], str]) -> NodeCount | None:
    """``options.num-supernodes`` of the entry that ``table["default"]`` names, if it sets one.

    Both places flwr reads a node count from have this shape (the app's
    ``[tool.flwr.federations]``, the config's ``[superlink]``); ``where(name)``
    says which, for the count's source and its error.
    """
    name = table.get("default") if isinstance(table, dict) else None
    entry = table.get(name) if isinstance(name, str) else None
    options = entry.get("options") if isinstance(entry, dict) else None
    if not isinstance(options, dict) or "num-supernodes" not in options:
        return None
    return NodeCount(_count(options["num-supernodes"], where(str(name))), where(str(name)))


def app_federation(folder: Path) -> NodeCount | None:
    """The node count of the app's default ``[tool.flwr.federations]`` entry, if it sets one."""
    toml = folder / "pyproject.toml"
    federations = _read_toml(toml).get("tool", {}).get("flwr", {}).get("federations", {})
    return _default_entry_count(federations,
                                lambda name: f"the app's [tool.flwr.federations.{name}] ({toml})")


def user_federation(config: Path) -> NodeCount | None:
    """The node count of the default SuperLink connection in the Flower config ``config``, if it sets one."""
    if not config.is_file():
        return None
    superlink = _read_toml(config).get("superlink", {})
    return _default_entry_count(superlink, lambda name: f"your Flower config's [superlink.{name}] ({config})")


def node_count(app: str | Path, given: int | None = None, federation: dict[str, Any] | None = None,
               config: Path | None = None) -> NodeCount:
    """The node count for ``app``: ``given`` (``--num-supernodes``), a ``--run-config`` file's
    ``federation`` table, else what ``flwr run`` would use (the module docstring).

    ``config``: the Flower config file (default :func:`flower_config_path`).
    ``ConfigError`` naming the file for a count that is not an integer >= 1.
    """
    if given is not None:
        return NodeCount(_count(given, "--num-supernodes"), "--num-supernodes")
    if federation and "num-supernodes" in federation:
        where = "the --run-config file's [federation]"
        return NodeCount(_count(federation["num-supernodes"], where), where)
    found = app_federation(load_app(app).folder) or user_federation(config or flower_config_path())
    return found or NodeCount(flower_default(), "Flower's default (no federation in the app or your "
                                                "Flower config sets num-supernodes)")


__all__ = ["NodeCount", "app_federation", "flower_config_path", "flower_default", "node_count",
           "user_federation"]
