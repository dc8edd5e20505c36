"""The stall timeout: a run that shows no progress for that long fails with the end of its log."""

from __future__ import annotations

import threading
import time

import pytest
from runner_apps import make_app

from lips_flwr.experiments.runner.runs import RunSpec
from lips_flwr.experiments.runner.stall import StallWatch, heartbeat
from lips_flwr.experiments.runner.sweep import SweepFailed, run_sweep


@pytest.mark.slow
def test_a_run_whose_client_never_returns_fails_after_the_timeout_with_its_log(tmp_path):
    app = make_app(tmp_path / "app")
    client = app / "tinyapp" / "client_app.py"
    sleep = '    time.sleep(float(context.run_config["sleep"]))\n'
    client.write_text(client.read_text().replace(
        sleep, '    print("tiny app: a client that never returns", flush=True)\n    time.sleep(3600)\n'))
    lines: list[str] = []
    start = time.monotonic()
    with pytest.raises(SweepFailed) as err:
        run_sweep([RunSpec(app, "hung", 0, num_nodes=2, engine="sequential")], tmp_path / "out",
                  progress=lines.append, stall_timeout=20)  # (a loaded machine's imports take seconds)
    assert time.monotonic() - start < 120
    assert "[hung] made no progress for 20 s" in str(err.value) and "--stall-timeout" in str(err.value)
    assert "tiny app: a client that never returns" in str(err.value)  # the end of its log
    assert any("[hung] made no progress" in line for line in lines)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []  # no result, no staging, no lock


@pytest.mark.slow
def test_a_stalled_run_that_ignores_sigterm_is_killed(tmp_path):
    """A stalled run got SIGTERM only: an app with its own handler kept the sweep waiting for ever."""
    app = make_app(tmp_path / "app")
    client = app / "tinyapp" / "client_app.py"
    sleep = '    time.sleep(float(context.run_config["sleep"]))\n'
    deaf = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)  # (as the run imports it)\n"
    client.write_text(deaf + client.read_text().replace(sleep, '    time.sleep(3600)\n'))
    start = time.monotonic()
    with pytest.raises(SweepFailed, match="made no progress for 20 s"):
        run_sweep([RunSpec(app, "deaf", 0, num_nodes=2, engine="sequential")], tmp_path / "out",
                  progress=lambda line: None, stall_timeout=20)
    assert time.monotonic() - start < 150


@pytest.mark.slow
def test_a_run_that_goes_on_is_not_stalled(tmp_path):
    app = make_app(tmp_path / "app")
    [path] = run_sweep([RunSpec(app, "fine", 0, num_nodes=2, engine="sequential")], tmp_path / "out",
                       progress=lambda line: None, stall_timeout=120)
    assert path.is_file()


def test_the_watch_names_the_runs_silent_too_long_and_a_heartbeat_is_throttled():
    watch = StallWatch(0.2)
    watch.heard("a")
    watch.heard("b")
    time.sleep(0.3)
    watch.heard("b")
    assert watch.stalled(["a", "b"]) == ["a"]
    assert StallWatch(None).stalled(["a"]) == []
    with pytest.raises(ValueError, match="stall timeout must be"):
        StallWatch(0)
    sent: list[int] = []
    beat = heartbeat(lambda: sent.append(1), every=60.0)
    threads = [threading.Thread(target=beat) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sent == [1]  # once a minute at most, from any thread


def test_compare_takes_a_stall_timeout_of_a_few_minutes_by_default_and_0_for_none():
    from lips_flwr.experiments.compare import cli
    from lips_flwr.experiments.runner.stall import DEFAULT_STALL_TIMEOUT

    def parsed(*extra: str):
        return cli.parser().parse_args(["compare", "app", "--seeds", "1", "--out", "o", *extra]).stall_timeout

    assert parsed() == DEFAULT_STALL_TIMEOUT == 300.0
    assert parsed("--stall-timeout", "90") == 90.0 and parsed("--stall-timeout", "0") is None
    with pytest.raises(SystemExit) as exc:
        parsed("--stall-timeout", "-1")
    assert exc.value.code == 2
