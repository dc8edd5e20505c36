"""The layout's promises, checked on the source: who may import whom.

- the core (the algorithm), the protocol, persistence and the npy reader
  import no ``flwr``;
- the core imports neither persistence, the protocol nor the Flower adapters;
- the server side (``strategies``) and the client side (``clients``) never
  import each other; both take the ``lips-*`` keys from ``lips_flwr.protocol``,
  the only module that spells them;
- the package does not import its example support (``experiments``);
- the server side is in three wings: ``adapters`` (the strategies, the round's
  sequence once), ``replies`` (the reply gate) and ``resume`` (checkpoints);
  the adapters use the other two, which know neither the adapters nor each
  other, and only the reply wing reads reply headers; one codec per API
  (``codecs.py``) converts models, and no adapter has conversion hooks;
- the experiments wing is in rooms, ``compare`` -> ``runner`` -> ``batched`` -> ``task``, each
  importing only the rooms below it, with no circle of imports;
- each part of the server side (its three wings and its top-level modules)
  keeps to a line budget, at most 10% over the figure measured when it was
  set; no class of the server side is over 200 lines, no module of the
  package is over 400, and no object rewrites its own ``__class__``.
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


WINGS = ("adapters", "replies", "resume")


@pytest.mark.parametrize("path", modules("strategies/replies", "strategies/resume"),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_gate_and_the_checkpoint_wing_know_neither_the_adapters_nor_each_other(path):
    other = "resume" if "replies" in path.parts else "replies"
    assert imports_any(path, ("lips_flwr.strategies.adapters", f"lips_flwr.strategies.{other}")) == []


def test_the_server_side_is_in_its_wings():
    top = sorted(p.name for p in (PACKAGE / "strategies").iterdir() if not p.name.startswith((".", "__py")))
    assert top == sorted(["__init__.py", "chain.py", "codecs.py", "flower_state.py", "options.py", *WINGS])


# The conversions each adapter once answered twice (issue 36): the codecs are the one place now.
# (Spelled without their underscore, so that a search for the old names finds only old code.)
CONVERSION_HOOKS = tuple("_" + name for name in ("views", "serialized", "parse_aggregate", "with_model",
                                                 "cached_to_numpy", "numpy_to_cached", "to_state", "from_state"))


def test_models_are_converted_by_one_codec_per_api():
    """No module of the server side defines a conversion hook; the gate is given the codec."""
    defined = {}
    for path in modules("strategies"):
        names = [n.name for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.FunctionDef) and n.name in CONVERSION_HOOKS]
        if names:
            defined[str(path.relative_to(PACKAGE))] = names
    assert defined == {}
    base = (PACKAGE / "strategies" / "adapters" / "base.py").read_text()
    assert "ReplyGate(codec)" in base and "ReplyGate(self)" not in base


# What reads a reply's .npy headers: the header reader, the checks built on it, the dtype vote.
HEADER_READERS = ("lips_flwr._npy.npy_header", "lips_flwr._npy.npy_shape", "lips_flwr.strategies.replies.checks",
                  "lips_flwr.strategies.replies.headers", "lips_flwr.strategies.replies.dtypes")


@pytest.mark.parametrize("path", [p for p in modules(".") if "replies" not in p.parts],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_reply_wing_reads_reply_headers(path):
    assert imports_any(path, HEADER_READERS) == []


def test_the_round_sequence_takes_the_replies_and_no_callables():
    tree = ast.parse((PACKAGE / "strategies" / "adapters" / "base.py").read_text())
    sequence = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_aggregate_round")
    assert [a.arg for a in sequence.args.args] == ["self", "server_round", "replies"]
    assert "Callable" not in ast.unparse(sequence.args)


# Lines of each part of the server side (every line of its .py files), measured at the commit that set
# them (issue 36, after the per-API codecs). A part may grow by GROWTH at most: a change that needs more
# changes its figure here, in the same commit, and says why in the commit message.
LINE_BUDGETS = {"adapters": 921, "replies": 1394, "resume": 683, "top": 472}  # top: strategies/*.py
GROWTH = 1.10


def part_lines(part: str) -> int:
    paths = sorted((PACKAGE / "strategies").glob("*.py")) if part == "top" else modules(f"strategies/{part}")
    return sum(len(path.read_text().splitlines()) for path in paths)


@pytest.mark.parametrize("part", list(LINE_BUDGETS))
def test_each_part_of_the_server_side_keeps_to_its_line_budget(part):
    assert part_lines(part) <= LINE_BUDGETS[part] * GROWTH, (
        f"strategies/{part}: {part_lines(part)} lines, budget {LINE_BUDGETS[part]} + 10%")


def test_the_line_budgets_cover_the_whole_server_side():
    assert set(LINE_BUDGETS) == {*WINGS, "top"}
    assert sum(map(part_lines, LINE_BUDGETS)) == sum(len(p.read_text().splitlines()) for p in modules("strategies"))


@pytest.mark.parametrize("path", modules("strategies"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_class_of_the_server_side_is_over_200_lines(path):
    sizes = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.ClassDef)}
    assert {name: size for name, size in sizes.items() if size > 200} == {}


MODULE_LINES = 400  # the most lines one module of the package may have (the house style: 100-400)


def test_no_module_of_the_package_is_over_400_lines():
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in modules(".")}
    assert {name: size for name, size in sizes.items() if size > MODULE_LINES} == {}
    assert sizes  # (the modules were found)


# The experiments wing's rooms, top down (issue 38): `lips-flwr compare` on the runner, the runner on the
# batched engine, the engine on the learning task (data, models, training). A room imports only rooms below
# it; the wing's top-level modules (what every room shares) import none of them.
EXPERIMENT_ROOMS = ("compare", "runner", "batched", "task")


@pytest.mark.parametrize("path", modules("experiments"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_experiments_rooms_import_only_the_rooms_below_them(path):
    parts = path.relative_to(PACKAGE / "experiments").parts
    own = parts[0] if len(parts) > 1 and parts[0] in EXPERIMENT_ROOMS else None
    above = EXPERIMENT_ROOMS[: EXPERIMENT_ROOMS.index(own)] if own else EXPERIMENT_ROOMS
    assert imports_any(path, tuple(f"lips_flwr.experiments.{room}" for room in above)) == []


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> the modules among ``paths`` it imports (a name imported from a module counts as that module)."""
    names = {module_name(path): path for path in paths}
    graph = {}
    for name, path in names.items():
        found = set()
        for imported_name in imported(path):
            while imported_name and imported_name not in names:
                imported_name = imported_name.rpartition(".")[0]
            if imported_name and imported_name != name:
                found.add(imported_name)
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``, each as the modules on it from where the search entered it."""
    found, done = [], set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            found.append(trail[trail.index(name):])
        elif name not in done:
            for other in sorted(graph.get(name, ())):
                visit(other, [*trail, name])
            done.add(name)

    for name in sorted(graph):
        visit(name, [])
    return found


def test_no_module_of_the_experiments_imports_its_importer():
    """No circle of imports in the wing: before issue 38, compare <-> its report and sweep <-> worker."""
    assert circles(import_graph(modules("experiments"))) == []


def test_circles_are_found_however_long():
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    report = PACKAGE / "experiments" / "compare" / "report.py"
    graph = import_graph(modules("experiments"))
    assert "lips_flwr.experiments.compare.comparison" in graph[module_name(report)]


def test_no_object_rewrites_its_own_class():
    rewrites = []
    for path in modules("."):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            rewrites += [str(path.relative_to(PACKAGE)) for t in targets
                         if isinstance(t, ast.Attribute) and t.attr == "__class__"]
    assert rewrites == []


def test_the_unit_tests_mirror_the_package():
    """tests/unit's folders are the package's (examples/ holds the example scripts' tests), names unique.

    Unique test module names: pytest's default import mode, and the test
    modules that import each other's helpers by name (``unit_paths``), need it.
    """
    unit = Path(__file__).resolve().parent
    tests = sorted(unit.rglob("test_*.py"))
    folders = {path.parent.relative_to(unit) for path in tests} - {Path(".")}
    assert sorted(str(f) for f in folders if f.parts[0] != "examples" and not (PACKAGE / f).is_dir()) == []
    names = [path.name for path in tests]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_the_experiments_keep_no_process_pool_of_their_own():
    """Issue 38: every sweep's runs are Ray tasks (runner/dispatch.py); no multiprocessing in the wing."""
    found = [str(path.relative_to(PACKAGE)) for path in sorted((PACKAGE / "experiments").rglob("*.py"))
             if "multiprocessing" in path.read_text()]
    assert found == []
