"""Unit tests: every folder of tests/unit on ``sys.path`` (:mod:`unit_paths`); one local Ray for sweeps.

A sweep's runs are Ray tasks (lips_flwr.experiments.runner.dispatch). A sweep
that finds Ray joined already uses it rather than starting one: the tests
marked ``slow`` (those that run sweeps among them) share one local Ray per
pytest process, started at the first of them, instead of paying Ray's
start and stop (about 5 s on 2 cores) each.
"""

import pytest
from unit_paths import add_test_folders

add_test_folders()


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray sized to the machine, as a sweep starts it, for the whole test session."""
    ray = pytest.importorskip("ray")
    from lips_flwr.experiments.runner.dispatch import start_local_ray

    if not ray.is_initialized():
        start_local_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def _slow_tests_share_one_ray(request):
    if request.node.get_closest_marker("slow") is not None:
        request.getfixturevalue("local_ray")
