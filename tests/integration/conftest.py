"""Fixtures for end-to-end `flwr run` tests of the example apps.

The session gets its own Flower home and SuperLink ports
(:func:`lips_flwr.experiments.local_flower.local_flower`); at the end of the session the
SuperLink that ``flwr run`` started, and everything it started, is stopped by
pid, however the tests ended.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lips_flwr.experiments.local_flower import LocalFlower, find_superlinks, local_flower

REPO_ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: end-to-end `flwr run` simulations (slow, ~30 s each)"
    )


@pytest.fixture(scope="session")
def flwr(tmp_path_factory: pytest.TempPathFactory):
    # The ServerApp/ClientApp processes must import this checkout's lips_flwr.
    handle: LocalFlower = local_flower(
        tmp_path_factory.mktemp("flwr_home"), pythonpath=[str(REPO_ROOT)], cwd=REPO_ROOT
    )
    try:
        yield handle
    finally:
        handle.close()
        assert not find_superlinks(handle.log_file), "SuperLink still running"
