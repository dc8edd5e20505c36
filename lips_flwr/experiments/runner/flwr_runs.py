"""Runs of engine ``"flwr"``: the real ``flwr run`` on a private local SuperLink (:mod:`.local_flower`).

The runner cannot see inside such a run: its result file's ``observed`` is
null and the app's own results file (its ``results-path``) is the record. A
run fails when it does not end ``finished:completed`` (``flwr run`` exits 0
whatever happens to the run), when the app wrote no results file, or when
that file, in the paper app's layout, shows a round without train metrics
(:func:`results_problem`); the error names the first exception of the
run's log. The seed reaches the app through its run config only.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..local_flower import LocalFlower, first_error, local_flower
from .apps import folder_modules, with_modules
from .provenance import PACKAGE, git_state, now_utc, provenance
from .runs import PreparedRun
from .store import write_result

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def toml_value(value: Any) -> str:
    """``value`` (bool, int, float or str) as a TOML value (strings with JSON's escapes, valid TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(float(value))  # (TOML spells inf, -inf and nan as repr does; numpy 2's repr of its
        # float64, a float too, is np.float64(0.5))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"a run-config value must be a bool, int, float or str, got {type(value).__name__}")


def write_run_config(path: Path, run_config: dict[str, Any]) -> Path:
    """``run_config`` as a TOML file for ``flwr run --run-config FILE`` (dotted keys as nested tables)."""
    lines = [f"{key if _BARE_KEY.fullmatch(key) else json.dumps(key)} = {toml_value(value)}"
             for key, value in run_config.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_config_string(values: dict[str, Any]) -> str:
    """``key=value`` pairs for ``flwr run --run-config`` (strings as TOML literal strings, ``'x'``)."""
    def value(v: Any) -> str:
        return f"'{v}'" if isinstance(v, str) and "'" not in v else toml_value(v)
    return " ".join(f"{key}={value(v)}" for key, v in values.items())


def results_problem(path: str | Path, num_rounds: int | None) -> str | None:
    """Why the app's results file ``path`` (the paper app's layout: ``rounds`` -> train, evaluate) shows a
    failed run, or ``None``.

    Failed: no file, or not JSON; no round with train metrics; a round without
    them (no client trained); a round of ``1..num_rounds`` missing; the last
    round not evaluated. A record in another layout is only required to exist.
    """
    path = Path(path)
    if not path.is_file():
        return f"no results file {str(path)!r}"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return f"{str(path)!r} is not a readable results file: {err!r}"
    if not isinstance(record, dict) or "rounds" not in record:
        return None
    try:
        rounds = {int(r): entry if isinstance(entry, dict) else {} for r, entry in record["rounds"].items()}
    except (ValueError, TypeError, AttributeError) as err:
        return f"its results file is not readable: {err!r}"
    untrained = sorted(r for r, entry in rounds.items() if not entry.get("train"))
    if rounds and len(untrained) == len(rounds):
        return f"no client trained: no round has train metrics ({len(rounds)} rounds recorded)"
    if untrained:
        return f"no client trained in rounds {', '.join(map(str, untrained))}"
    missing = sorted(set(range(1, (num_rounds or 0) + 1)) - set(rounds))
    if not rounds or missing:
        return f"rounds {', '.join(map(str, missing)) or '(all)'} missing from the results"
    last = max(rounds)
    if not rounds[last].get("evaluate"):
        return f"no client evaluated round {last} (the last)"
    return None


@contextmanager
def flower_for(out: Path, apps: list[Path]) -> Iterator[LocalFlower]:
    """A local SuperLink for a sweep into ``out`` (its Flower home ``<out>/.flwr_home``, removed after).

    This checkout of ``lips_flwr`` (when imported from one) and the apps'
    folders go on the ``PYTHONPATH`` of every process it starts.
    """
    import shutil

    checkout = [str(PACKAGE.parent)] if git_state() is not None else []
    home = out / ".flwr_home"
    try:
        with local_flower(home, pythonpath=[*checkout, *map(str, apps)], cwd=out) as flower:
            yield flower
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run_with_flwr(job: PreparedRun, flower: Any, timeout: float, progress: Callable[[str], None]) -> None:
    """Run ``job`` under ``flwr run``, write its result file; ``RuntimeError`` (its log's error) if failed."""
    resources = {"num-cpus": 1, "num-gpus": 0.0, **job.spec.client_resources}
    federation = " ".join([f"num-supernodes={job.spec.num_nodes}",
                           *(f"client-resources-{k}={toml_value(v)}" for k, v in resources.items())])
    started, start = now_utc(), time.monotonic()
    modules = folder_modules(job.app)  # its imports happen in Flower's processes, unseen: all its code
    config_file = write_run_config(job.staging / "run-config.toml", job.run_config)
    run_id = flower.run(job.app.folder, str(config_file), federation)
    progress(f"[{job.name}] flwr run {run_id} started")
    status = flower.wait(run_id, timeout=timeout, progress=lambda s: progress(
        f"[{job.name}] {s}, {time.monotonic() - start:.0f}s"))
    path = job.run_config.get("results-path")
    problem = (f"ended as {status}" if status != "finished:completed"
               else results_problem(path, job.num_rounds) if path else None)
    if problem is not None:
        logs = flower.logs(run_id)
        error = first_error(logs)
        detail = f"the first error in its log:\n{error}" if error else f"the end of its log:\n{logs[-3000:]}"
        raise RuntimeError(f"[{job.name}] flwr run {run_id} failed: {problem}; {detail}")
    info = provenance("flwr", started, time.monotonic() - start, client_resources=resources,
                      **({"locations": job.locations} if job.locations else {}))
    identity = with_modules(job.identity, modules)
    write_result(job.result, identity, info, None, json.loads(Path(path).read_text()) if path else None)
    progress(f"[{job.name}] done in {time.monotonic() - start:.0f}s")


__all__ = ["flower_for", "results_problem", "run_config_string", "run_with_flwr", "toml_value",
           "write_run_config"]
