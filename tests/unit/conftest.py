"""Unit tests (no Ray): every folder of tests/unit on ``sys.path`` (:mod:`unit_paths`)."""

from unit_paths import add_test_folders

add_test_folders()
