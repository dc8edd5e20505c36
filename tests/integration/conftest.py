"""Fixtures for end-to-end `flwr run` tests of the example apps.

The session gets its own Flower home and SuperLink ports
(:func:`lips_flwr.experiments.local_flower.local_flower`); at the end of the session the
SuperLink that ``flwr run`` started, and everything it started, is stopped by
pid, however the tests ended.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import lips_flwr
from lips_flwr.experiments.local_flower import LocalFlower, find_superlinks, local_flower

REPO_ROOT = Path(__file__).resolve().parents[2]


# LIPS_TEST_INSTALLED=1 (make test-wheel): test the installed package, not this checkout.
INSTALLED = os.environ.get("LIPS_TEST_INSTALLED") == "1"


@pytest.fixture(scope="session")
def flwr(tmp_path_factory: pytest.TempPathFactory):
    if INSTALLED:
        # Nothing of the checkout on the apps' path: they import the installed lips_flwr,
        # so a module left out of the wheel fails here.
        imported_from = Path(lips_flwr.__file__).resolve().parent
        assert imported_from != REPO_ROOT / "lips_flwr", imported_from
        assert imported_from.parent.name == "site-packages", imported_from
        cwd = tmp_path_factory.mktemp("cwd")
        handle: LocalFlower = local_flower(tmp_path_factory.mktemp("flwr_home"), cwd=cwd)
    else:
        # The ServerApp/ClientApp processes must import this checkout's lips_flwr.
        handle = local_flower(
            tmp_path_factory.mktemp("flwr_home"), pythonpath=[str(REPO_ROOT)], cwd=REPO_ROOT
        )
    try:
        yield handle
    finally:
        handle.close()
        assert not find_superlinks(handle.log_file), "SuperLink still running"
