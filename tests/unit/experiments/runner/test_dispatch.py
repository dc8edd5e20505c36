"""The local Ray a sweep starts (``runner.dispatch.start_local_ray``): what its run processes start with."""

from __future__ import annotations

import os
import sys

import pytest

import lips_flwr.experiments.runner.dispatch as dispatch
from lips_flwr.experiments.runner.dispatch import MALLOC_SETTINGS, _environment, malloc_settings


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's settings, read from /proc")
def test_a_run_process_of_the_local_ray_starts_with_one_malloc_arena_and_memory_kept(local_ray):
    if any(name in os.environ for name in MALLOC_SETTINGS):
        pytest.skip("this test process sets a malloc variable: the local Ray keeps to it")

    def started_with() -> tuple[dict[str, str], int]:  # (defined here: sent to the worker by value)
        """The environment the process started with (``/proc/self/environ``: what glibc's malloc read),
        and whether this glibc takes the mmap threshold (``mallopt(M_MMAP_THRESHOLD, ...)``: 1)."""
        import ctypes

        with open("/proc/self/environ", "rb") as environ:
            pairs = [item.decode().partition("=") for item in environ.read().split(b"\0") if item]
        environment = {name: value for name, _, value in pairs}
        threshold = int(environment.get("MALLOC_MMAP_THRESHOLD_", "0"))
        return environment, ctypes.CDLL(None).mallopt(-3, threshold)

    task = local_ray.remote(max_calls=1)(started_with)  # (a fresh worker process, as a run's)
    environment, accepted = local_ray.get(task.remote())
    assert {name: environment.get(name) for name in MALLOC_SETTINGS} == malloc_settings()
    assert accepted == 1  # (a threshold glibc refuses would leave the trim threshold fixing it at 128 KB)
    assert not any(name in os.environ for name in MALLOC_SETTINGS)  # (the sweep's own process: unchanged)


@pytest.mark.parametrize("name", sorted(MALLOC_SETTINGS))
def test_a_malloc_variable_the_user_set_leaves_all_of_them_to_the_user(monkeypatch, name):
    for other in MALLOC_SETTINGS:
        monkeypatch.delenv(other, raising=False)
    assert malloc_settings().keys() == MALLOC_SETTINGS.keys()
    monkeypatch.setenv(name, "0")
    assert malloc_settings() == {}


def test_glibc_malloc_tunables_the_user_set_leave_the_settings_to_the_user(monkeypatch):
    for name in MALLOC_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
    assert malloc_settings().keys() == MALLOC_SETTINGS.keys()
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")
    assert malloc_settings() == {}


def test_glibc_before_2_35_gets_the_largest_mmap_threshold_it_takes(monkeypatch):
    for name in MALLOC_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(dispatch, "glibc_version", lambda: (2, 35))
    assert malloc_settings() == MALLOC_SETTINGS and MALLOC_SETTINGS["MALLOC_MMAP_THRESHOLD_"] == str(64 << 20)
    monkeypatch.setattr(dispatch, "glibc_version", lambda: (2, 31))  # (Debian 11, Ubuntu 20.04)
    assert malloc_settings() == {**MALLOC_SETTINGS, "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}


def test_the_glibc_version_is_read_from_this_process():
    version = dispatch.glibc_version()
    assert version == (0,) or (len(version) == 2 and version >= (2, 17))


def test_the_settings_are_in_the_environment_only_while_ray_starts_and_a_value_before_comes_back(monkeypatch):
    monkeypatch.setenv("LIPS_TEST_KEPT", "before")
    monkeypatch.delenv("LIPS_TEST_NEW", raising=False)
    with _environment({"LIPS_TEST_KEPT": "during", "LIPS_TEST_NEW": "during"}):
        assert os.environ["LIPS_TEST_KEPT"] == os.environ["LIPS_TEST_NEW"] == "during"
    assert os.environ["LIPS_TEST_KEPT"] == "before" and "LIPS_TEST_NEW" not in os.environ
