"""A Flower App folder as ``flwr run`` takes it: its components, its run config, its digest.

An App folder holds a ``pyproject.toml`` with ``[tool.flwr.app.components]``
(``serverapp`` and ``clientapp``, each ``"module:attribute"``, imported with
the folder first on ``sys.path``) and ``[tool.flwr.app.config]``, the run
config's defaults (nested tables flattened with dots, by Flower's own
:func:`flwr.common.config.flatten_dict`).

The run config of a run is those defaults with the overrides fused in by
Flower's own :func:`flwr.common.config.fuse_dicts`: a key the app does not
declare is an error, and a value keeps the type it was given (``flwr run
--run-config lr=1`` gives the app the int ``1`` even where the default is
``0.5``: measured under flwr 1.42, whose SuperLink fuses without converting).
The overrides come as ``flwr run --run-config`` takes them (:func:`parse_overrides`).

The app's digest (:func:`app_digest`) and those of the modules a run loaded
from the folder (:func:`loaded_modules`) are part of a run's identity (:mod:`.runs`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import os
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.common.config import flatten_dict, fuse_dicts, parse_config_args

from ...errors import ConfigError
from .provenance import PACKAGE, tree_digest

CACHE_PARTS = ("__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache")
MAIN_MODULES = ("__main__", "__mp_main__")  # the process's script (a sweep's), not the app's code
SKIPPED_PARTS = ("site-packages", "dist-packages", "__pycache__")  # installed code, caches: not the app's


@dataclass(frozen=True)
class FlowerApp:
    """A Flower App folder: where it is, what it is called, its components and run-config defaults."""

    folder: Path
    name: str
    serverapp: str
    clientapp: str
    defaults: dict[str, Any]


def load_app(folder: str | Path) -> FlowerApp:
    """Read the App folder ``folder`` (``ValueError`` naming what is missing)."""
    folder = Path(folder).resolve()
    toml = folder / "pyproject.toml"
    if not toml.is_file():
        raise ValueError(f"{str(folder)!r} is not a Flower App: it has no pyproject.toml")
    try:
        config = tomllib.loads(toml.read_text())
    except tomllib.TOMLDecodeError as err:  # (tomllib's message names the line, not the file)
        raise ConfigError(f"{str(toml)!r} is not valid TOML: {err}") from None
    app = config.get("tool", {}).get("flwr", {}).get("app", {})
    components = app.get("components", {})
    missing = [key for key in ("serverapp", "clientapp") if not isinstance(components.get(key), str)]
    if missing:
        raise ValueError(f"{str(toml)!r} has no [tool.flwr.app.components] {' and '.join(missing)}")
    name = str(config.get("project", {}).get("name") or folder.name)
    return FlowerApp(folder, name, components["serverapp"], components["clientapp"],
                     flatten_dict(app.get("config", {})))


def parse_overrides(items: Iterable[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(run-config overrides, federation)`` from ``KEY=VALUE`` strings and TOML file paths, in order.

    A string may hold several pairs whose values are TOML (``"dataset='digits'
    lr=0.1"``), as ``flwr run --run-config`` takes them; later items win. A
    TOML file's ``[federation]`` table (our examples' conf files have one) is
    returned apart: not run config, its ``num-supernodes`` is the run's default
    node count (:func:`num_supernodes`).
    """
    overrides: dict[str, Any] = {}
    federation: dict[str, Any] = {}
    for item in items:
        if item.endswith(".toml"):
            path = Path(item).expanduser()
            try:
                values = tomllib.loads(path.read_text())
            except (OSError, tomllib.TOMLDecodeError) as err:
                raise ValueError(f"cannot read the run-config file {item!r}: {err}") from err
            federation.update(values.pop("federation", {}) or {})
            overrides.update(flatten_dict(values))
            continue
        if "=" not in item:
            raise ValueError(f"run-config override {item!r} is not KEY=VALUE (nor a .toml file)")
        try:
            overrides.update(parse_config_args([item]))
        except Exception as err:  # click.ClickException for a value that is not TOML
            raise ValueError(f"run-config override {item!r}: the value is not TOML (strings need quotes, "
                             f"e.g. dataset='digits'): {getattr(err, 'message', err)}") from err
    return overrides, federation


def resolve_run_config(app: FlowerApp, overrides: dict[str, Any]) -> dict[str, Any]:
    """The app's defaults with ``overrides`` fused in (Flower's rules); ``ValueError`` for an unknown key."""
    unknown = sorted(set(overrides) - set(app.defaults))
    if unknown:
        raise ValueError(f"{app.name}: unknown run-config keys {unknown}; the app declares "
                         f"{sorted(app.defaults)}")
    return dict(fuse_dicts(dict(app.defaults), dict(overrides)))


def num_supernodes(federation: dict[str, Any], default: int = 10) -> int:
    """The node count of a conf file's ``[federation]`` table (``num-supernodes``), else ``default``."""
    value = federation.get("num-supernodes", default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"[federation] num-supernodes must be an integer >= 1, got {value!r}")
    return value


def _source_files(app: FlowerApp) -> list[Path]:
    """``pyproject.toml`` and the files of the packages (or top-level modules) the components import.

    The folder may hold more than the app (the paper app's folder has its
    sweep scripts, conf files and README): those do not decide a run's
    numbers and are left out (a module beside the app that the run imports
    is in its recorded modules instead: :func:`loaded_modules`). A component
    in a top-level module brings every top-level ``.py`` file (it may import
    its siblings).
    """
    folder = app.folder
    files = [folder / "pyproject.toml"]
    for top in sorted({ref.split(":")[0].split(".")[0] for ref in (app.serverapp, app.clientapp)}):
        package = folder / top
        if package.is_dir():
            files += sorted(p for p in package.rglob("*") if p.is_file()
                            and not any(part in CACHE_PARTS for part in p.relative_to(folder).parts)
                            and p.suffix not in (".pyc", ".pyo"))
        else:
            files += sorted(folder.glob("*.py"))
    return sorted(set(files))


class _NoDocstrings(ast.NodeTransformer):
    """Takes out every statement that is a lone string: docstrings (of modules, classes, functions,
    attributes), which compute nothing."""

    def visit_Expr(self, node: ast.Expr) -> ast.Expr | None:
        is_text = isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        return None if is_text else node


def code_content(path: Path) -> bytes:
    """What of the file ``path`` decides what a run computes, as bytes to digest.

    A ``.py`` file: its syntax tree without docstrings or other lone string
    statements (``ast.dump``, which holds no comments, line numbers or
    layout), so that an edit of a comment, a docstring or the spacing keeps
    it and an edit of the code changes it (a new Python may dump a tree
    otherwise: its results are then computed again); a ``.toml`` file: its
    values (comments and layout left out); any other file, or one that does
    not parse: its bytes.
    """
    data = path.read_bytes()
    try:
        if path.suffix == ".py":
            return ast.dump(_NoDocstrings().visit(ast.parse(data, filename=str(path)))).encode()
        if path.suffix == ".toml":
            return json.dumps(tomllib.loads(data.decode()), sort_keys=True, default=str).encode()
    except (SyntaxError, ValueError):  # (tomllib.TOMLDecodeError, UnicodeDecodeError are ValueErrors)
        pass
    return data


def app_digest(app: FlowerApp) -> str:
    """SHA-256 of the app's ``pyproject.toml`` and component packages (:func:`code_content`; caches excluded).

    Paths relative to the App folder: a moved folder keeps its digest.
    """
    return tree_digest(app.folder, _source_files(app), code_content)


def _app_file(folder: Path, path: Path) -> str | None:
    """``path``'s name relative to the App folder ``folder`` (both resolved) when it is the app's code.

    ``None`` for a file that is not the app's: outside the folder, in
    ``lips_flwr`` itself (its code identity covers it), in installed packages
    (a virtual environment inside the folder), caches and hidden folders.
    """
    if not path.is_relative_to(folder) or path.is_relative_to(PACKAGE) or not path.is_file():
        return None
    relative = path.relative_to(folder)
    if any(part in SKIPPED_PARTS or part.startswith(".") for part in relative.parts[:-1]):
        return None
    return relative.as_posix()


def _resolved(paths: Iterable[str | Path]) -> list[str]:
    """Each path with its symbolic links resolved, as ``Path.resolve`` does, each folder once.

    A process holds thousands of modules in a few hundred folders: resolving
    every file's whole path took 1.5 s of a tiny run.
    """
    folders: dict[str, str] = {}
    found, cwd = [], os.getcwd()
    for path in paths:
        head, tail = os.path.split(os.path.join(cwd, path))  # (no lexical '..': links first)
        if head not in folders:
            folders[head] = os.path.realpath(head)
        full = os.path.join(folders[head], tail)
        found.append(os.path.realpath(full) if os.path.islink(full) else full)
    return found


def _digests(folder: Path, paths: Iterable[str | Path]) -> dict[str, str]:
    """``{name relative to folder: SHA-256 of its code}`` of those ``paths`` that are the app's code."""
    found = {}
    inside = str(folder).rstrip(os.sep) + os.sep  # (a string test first: most modules are elsewhere)
    for path in _resolved(paths):
        name = _app_file(folder, Path(path)) if path.startswith(inside) else None
        if name is not None:
            found[name] = hashlib.sha256(code_content(Path(path))).hexdigest()
    return dict(sorted(found.items()))


def loaded_modules(app: FlowerApp) -> dict[str, str]:
    """``{path relative to the App folder: SHA-256 of its code}`` of every module this process loaded from it.

    What a run imported from the folder (its components, their packages, a
    sibling ``helpers.py``; see :func:`_app_file` for what is left out): read
    by a run's process after the run's imports, recorded in its result's
    identity (``app.modules``) and checked whenever the result is reused
    (:func:`module_digests`). The process's main module is not the app's: a
    sweep script in the App folder (the paper's ``study.py``) is imported
    again, as ``__mp_main__``, by each run process it spawns.
    """
    files = [getattr(module, "__file__", None) for name, module in list(sys.modules.items())
             if name not in MAIN_MODULES]
    return _digests(app.folder.resolve(), [name for name in files if isinstance(name, str)])


def folder_modules(app: FlowerApp) -> dict[str, str]:
    """:func:`loaded_modules` for a run whose imports this process cannot see (``flwr run``): every
    ``.py`` file of the App folder (but those :func:`_app_file` leaves out)."""
    folder = app.folder.resolve()
    return _digests(folder, folder.rglob("*.py"))


def module_digests(app: FlowerApp, names: Iterable[str]) -> dict[str, str | None]:
    """The code digest now (as :func:`loaded_modules` takes it) of each file of ``names``.

    ``None`` for a file that is gone, or that a damaged result names outside the App folder.
    """
    folder = app.folder.resolve()
    out: dict[str, str | None] = {}
    for name in names:
        path = (folder / name).resolve()
        inside = folder in path.parents and path.is_file()
        out[name] = hashlib.sha256(code_content(path)).hexdigest() if inside else None
    return out


def with_modules(identity: dict[str, Any], modules: Mapping[str, str | None]) -> dict[str, Any]:
    """A run's ``identity`` with ``modules`` as its ``app.modules`` (:func:`loaded_modules`)."""
    return {**identity, "app": {**identity["app"], "modules": dict(modules)}}


def planned_identity(identity: dict[str, Any]) -> dict[str, Any]:
    """A result's ``identity`` as known before its run: without the ``app.modules`` that the run recorded."""
    app = identity.get("app")
    if not isinstance(app, dict) or "modules" not in app:
        return identity
    return {**identity, "app": {k: v for k, v in app.items() if k != "modules"}}


def _import_ref(ref: str, folder: Path) -> Any:
    module_name, _, attr = ref.partition(":")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{ref!r}: module {module_name!r} has no attribute {attr!r}") from None


def import_components(app: FlowerApp) -> tuple[Any, Any]:
    """``(ServerApp, ClientApp)`` of ``app``, imported with its folder first on ``sys.path``."""
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    server_app, client_app = _import_ref(app.serverapp, app.folder), _import_ref(app.clientapp, app.folder)
    if not isinstance(server_app, ServerApp):
        raise ValueError(f"{app.serverapp!r} is a {type(server_app).__name__}, not a flwr ServerApp")
    if not isinstance(client_app, ClientApp):
        raise ValueError(f"{app.clientapp!r} is a {type(client_app).__name__}, not a flwr ClientApp")
    return server_app, client_app


__all__ = ["FlowerApp", "app_digest", "code_content", "folder_modules", "import_components", "load_app",
           "loaded_modules", "module_digests", "num_supernodes", "parse_overrides", "planned_identity",
           "resolve_run_config", "with_modules"]
