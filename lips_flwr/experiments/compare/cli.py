"""The ``lips-flwr`` command (``[project.scripts]``): ``lips-flwr compare APP_DIR --seeds ... --out DIR``.

Exit status: 0 when every run finished and the report is written; 1 when a
run failed (its error and first client error on stderr), the sweep was
refused before running (e.g. a result file of other settings: ``--recompute``;
an unknown run-config key; ``--out`` not a writable folder; an app without
LIPS under the default arms) or the report cannot be made from the runs (e.g.
``--last`` more than the runs' evaluated rounds); 2 for a usage error found
in the arguments alone (argparse's: a missing option, a seed twice in ``--seeds``,
``--last``, ``--num-supernodes`` or ``--jobs`` below 1) or missing extras;
130 when stopped (Ctrl-C: the same command continues). Every exit 1 or 130
ends with one ``lips-flwr compare: ...`` line naming the file or the fix,
never a traceback."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from ..runner.stall import DEFAULT_STALL_TIMEOUT

EXTRAS = ("ray", "scipy", "matplotlib")  # what compare needs beyond the package's own dependencies


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be integers and commas, got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"seeds must be integers >= 0, got {text!r}")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"each seed once (a seed pairs one run of each arm), got {repeated} "
                                         f"more than once in {text!r}")
    return seeds


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"an integer >= 1, got {text!r}")
    return value


def _gpus(text: str) -> float:
    """``--gpus-per-run``: a number of GPUs >= 0 (a fraction shares one GPU between runs)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of GPUs >= 0, got {text!r}") from None
    if not value >= 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"a number of GPUs >= 0, got {text!r}")
    return value


def _seconds(text: str) -> float | None:
    """``--stall-timeout``: seconds > 0, or ``0`` for no limit (``None``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"a number of seconds >= 0, got {text!r}")
    return value or None


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="lips-flwr", description="lips-flwr's experiment tools")
    commands = top.add_subparsers(dest="command", required=True)
    compare = commands.add_parser(
        "compare", help="does LIPS (or a change of run config) help on this Flower App?",
        description="Run a Flower App's two arms over paired seeds on the batched Grid and report the paired "
                    "difference of an evaluate metric (default arms: A = LIPS off, B = the app as written).")
    compare.add_argument("app", type=Path, metavar="APP_DIR", help="a Flower App folder, for `flwr run`")
    compare.add_argument("--seeds", type=_seeds, required=True, help="comma-separated, e.g. 1000,1001,1002")
    compare.add_argument("--a", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                         help="arm A's run-config overrides (then nothing is forced off)")
    compare.add_argument("--b", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                         help="arm B's run-config overrides")
    compare.add_argument("--run-config", nargs="+", action="extend", default=[], metavar="KEY=VALUE|FILE",
                         help="overrides for both arms; a .toml file's [federation] num-supernodes is the "
                              "default node count")
    compare.add_argument("--num-supernodes", type=_positive, default=None,
                         help="nodes (default: the --run-config file's [federation] value, else what "
                              "`flwr run` would use: the app's federation, your Flower config's, else "
                              "Flower's default, 2)")
    compare.add_argument("--metric", default=None, help="the evaluate metric (default: the first with 'acc')")
    compare.add_argument("--goal", choices=("max", "min"), default=None,
                         help="which way the metric is better (default: min for a name with loss, error "
                              "or err, else max)")
    compare.add_argument("--last", type=_positive, default=None,
                         help="evaluated rounds in the endpoint (default: min(10, rounds))")
    compare.add_argument("--engine", choices=("auto", "sequential", "stacked"), default="auto")
    compare.add_argument("--jobs", type=_positive, default=None,
                         help="runs at once, each a Ray task in its own process with cores // jobs CPUs "
                              "and threads (default: gcd(runs, cores): jobs x threads is every core)")
    compare.add_argument("--address", default=None,
                         help="the Ray cluster to run on: auto, HOST:PORT or ray://HOST:10001 (default: "
                              "RAY_ADDRESS, else a local Ray started for the sweep; docs/ray-cluster.md)")
    compare.add_argument("--gpus-per-run", type=_gpus, default=0.0, metavar="GPUS",
                         help="GPUs each run reserves, fractions allowed (default 0)")
    compare.add_argument("--stall-timeout", type=_seconds, default=DEFAULT_STALL_TIMEOUT, metavar="SECONDS",
                         help="a run in which no round and no client call ends for this long fails, with the "
                              f"end of its log (default {DEFAULT_STALL_TIMEOUT:.0f}; 0: no limit)")
    compare.add_argument("--recompute", action="store_true",
                         help="run again (and replace) result files computed with other settings")
    compare.add_argument("--out", type=Path, required=True, help="results: DIR/runs, summary.json, report.md")
    return top


def missing_extras() -> list[str]:
    return [name for name in EXTRAS if importlib.util.find_spec(name) is None]


STOPPED = "stopped; run the same command to continue"
NO_LIPS_FIX = ("builds no LIPS strategy, so arm A (LIPS off) would be the app as written: swap LIPS in "
               "as the README's \"Swap LIPS into your existing project\" shows (`from lips_flwr.strategies "
               "import LIPS`, then `strategy = LIPS(strategy, tau0=0.5, every=5)`; legacy API: "
               "`LegacyLIPS`), or give each arm its settings with --a KEY=VALUE --b KEY=VALUE")


def _say(text: str) -> None:
    """``text`` on stderr, its first and last lines as ``lips-flwr compare: ...`` (the last names the fix)."""
    lines = text.strip().splitlines() or [""]
    shown = [f"lips-flwr compare: {lines[0]}", *lines[1:-1]]
    if len(lines) > 1:
        shown.append(f"lips-flwr compare: {lines[-1].strip().strip('()')}")
    print("\n".join(shown), file=sys.stderr)


def compare_main(args: argparse.Namespace) -> int:
    """Run ``compare``; every failure ends with one ``lips-flwr compare: ...`` line (see the module)."""
    from ..runner.apps import parse_overrides
    from ..runner.sweep import STOPPED_EXIT, SweepFailed
    from ..runner.worker import NO_LIPS
    from . import Comparison, run_compare
    from .federation import node_count

    try:
        common, federation = parse_overrides(args.run_config)
        a, _ = parse_overrides(args.a)
        b, _ = parse_overrides(args.b)
        nodes = node_count(args.app, args.num_supernodes, federation)
        print(f"lips-flwr compare: {nodes}", flush=True)
        comparison = Comparison(app=args.app.resolve(), seeds=args.seeds, a=a, b=b, run_config=common,
                                num_nodes=nodes.nodes, metric=args.metric, last=args.last, engine=args.engine,
                                num_nodes_from=nodes.source, goal=args.goal)
        summary = run_compare(comparison, args.out, jobs=args.jobs, recompute=args.recompute,
                              progress=lambda line: print(line, flush=True), stall_timeout=args.stall_timeout,
                              address=args.address, gpus_per_run=args.gpus_per_run)
    except KeyboardInterrupt:
        _say(STOPPED)
        return STOPPED_EXIT
    except SweepFailed as err:
        if NO_LIPS in str(err):  # (the app's fault, not a run's: the fix, not a traceback)
            _say(f"{str(args.app)!r} {NO_LIPS_FIX}")
            return 1
        print(f"lips-flwr compare: a run failed:\n{err}", file=sys.stderr)
        _say(f"a run failed (above: its error and its first client error); the runs done are kept in "
             f"{str(args.out / 'runs')!r}")
        return 1
    except (ValueError, OSError) as err:  # LipsError, and what the file system refused (naming the file)
        _say(str(err))
        return 1
    print((args.out / "report.md").read_text())
    print(f"verdict: {summary['verdict']}; written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    missing = missing_extras()
    if missing:
        print(f"lips-flwr {args.command} needs {', '.join(missing)}: pip install \"lips-flwr[examples]\"",
              file=sys.stderr)
        return 2
    return compare_main(args)


if __name__ == "__main__":
    sys.exit(main())
