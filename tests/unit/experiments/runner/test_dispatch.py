"""The local Ray a sweep starts (``runner.dispatch.start_local_ray``): what its run processes start with."""

from __future__ import annotations

import os
import sys

import pytest

from lips_flwr.experiments.runner.dispatch import MALLOC_SETTINGS, malloc_settings


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's settings, read from /proc")
def test_a_run_process_of_the_local_ray_starts_with_one_malloc_arena_and_memory_kept(local_ray):
    if any(name in os.environ for name in MALLOC_SETTINGS):
        pytest.skip("this test process sets a malloc variable: the local Ray keeps to it")

    def started_with() -> dict[str, str]:  # (defined here: sent to the worker by value)
        """The environment the process started with (``/proc/self/environ``: what glibc's malloc read)."""
        with open("/proc/self/environ", "rb") as environ:
            pairs = [item.decode().partition("=") for item in environ.read().split(b"\0") if item]
        return {name: value for name, _, value in pairs}

    task = local_ray.remote(max_calls=1)(started_with)  # (a fresh worker process, as a run's)
    environment = local_ray.get(task.remote())
    assert {name: environment.get(name) for name in MALLOC_SETTINGS} == MALLOC_SETTINGS
    assert MALLOC_SETTINGS["MALLOC_ARENA_MAX"] == "1"
    assert not any(name in os.environ for name in MALLOC_SETTINGS)  # (the sweep's own process: unchanged)


@pytest.mark.parametrize("name", sorted(MALLOC_SETTINGS))
def test_a_malloc_variable_the_user_set_leaves_all_of_them_to_the_user(monkeypatch, name):
    for other in MALLOC_SETTINGS:
        monkeypatch.delenv(other, raising=False)
    assert malloc_settings() == MALLOC_SETTINGS
    monkeypatch.setenv(name, "0")
    assert malloc_settings() == {}
