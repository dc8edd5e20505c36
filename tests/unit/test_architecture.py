"""The layout's promises, checked on the source: who may import whom.

- the core (the algorithm), the protocol, persistence and the npy reader
  import no ``flwr``;
- the core imports neither persistence, the protocol nor the Flower adapters;
- the server side (``strategies``) and the client side (``clients``) never
  import each other; both take the ``lips-*`` keys from ``lips_flwr.protocol``,
  the only module that spells them;
- the package does not import its example support (``experiments``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lips_flwr"
# "lips-tau" is also the name of a round metric, so it is not searched for.
WIRE_KEYS = ("lips-round", "lips-mode", "lips-score", "lips-seed", "lips-layers",
             "lips-run-key", "lips-state-dir", "lips-client-zeros")


def modules(*parts: str) -> list[Path]:
    found = []
    for part in parts:
        path = PACKAGE / part
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return found


def imported(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = package[:-1] if package[-1] != "__init__" else package[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


def imports_any(path: Path, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(n for n in imported(path) if any(n == p or n.startswith(p + ".") for p in prefixes))


FLWR_FREE = modules("core", "protocol.py", "persistence", "_npy.py", "strategies/replies/checks.py",
                    "strategies/replies/headers.py", "strategies/replies/dtypes.py")


@pytest.mark.parametrize("path", FLWR_FREE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_flwr_import(path):
    assert imports_any(path, ("flwr",)) == []


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_knows_no_persistence_protocol_or_adapters(path):
    assert imports_any(path, ("lips_flwr.persistence", "lips_flwr.protocol", "lips_flwr.strategies",
                              "lips_flwr.clients", "lips_flwr.experiments", "lips_flwr._records")) == []


@pytest.mark.parametrize("path", modules("strategies"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_server_side_does_not_import_the_client_side(path):
    assert imports_any(path, ("lips_flwr.clients", "lips_flwr.experiments")) == []


@pytest.mark.parametrize("path", modules("clients"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_client_side_does_not_import_the_server_side(path):
    assert imports_any(path, ("lips_flwr.strategies", "lips_flwr.experiments")) == []


def test_only_the_protocol_spells_the_wire_keys():
    spelled = {}
    for path in modules("."):
        if path.name == "protocol.py" or "experiments" in path.parts:
            continue
        found = [k for k in WIRE_KEYS if re.search(rf"[\"']{k}[\"']", path.read_text())]
        if found:
            spelled[str(path.relative_to(PACKAGE))] = found
    assert spelled == {}


def test_a_round_reaches_the_core_once():
    """The adapter base calls the core's round method in exactly one place; the adapters never."""
    calls = {}
    for path in modules("strategies"):
        tree = ast.parse(path.read_text())
        count = sum(isinstance(n, ast.Attribute) and n.attr == "round"
                    and isinstance(n.value, ast.Attribute) and n.value.attr == "core"
                    for n in ast.walk(tree))
        if count:
            calls[path.name] = count
    assert calls == {"base.py": 1}


def test_only_the_scores_module_tells_scores_apart():
    """What a score needs (the update ``dw``, a Generator) is declared in core/scores.py: a new score
    touches that one file."""
    compared = {}
    for path in modules("."):
        if path.name == "scores.py" or "experiments" in path.parts:
            continue
        found = re.findall(r"[=!]= *[\"'](sensitivity|magnitude|random)[\"']", path.read_text())
        if found:
            compared[str(path.relative_to(PACKAGE))] = found
    assert compared == {}


def test_the_core_exports_what_its_docstring_promises():
    import lips_flwr
    import lips_flwr.core as core

    assert {"LIPSCore", "RoundOutcome", "MaskSchedule", "mask_layers", "select_layers"} <= set(core.__all__)
    assert all(getattr(core, name) is getattr(lips_flwr, name) for name in lips_flwr.__all__)
