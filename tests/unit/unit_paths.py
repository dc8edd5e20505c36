"""The folders of ``tests/unit``, which mirror the package, all put on ``sys.path``.

Test modules share helpers by importing each other by name (``from
test_clients import FakeApp``) and the helper modules at this folder's root
(``flower_fakes``, ``core_models``, ``runner_apps``): ``conftest.py`` and the
child scripts (``client_state_child.py``, ``checkpoint_child.py``) call
:func:`add_test_folders` so that they resolve from any subfolder. Every test
module's name is unique across the folders (pytest's default import mode
needs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

UNIT = Path(__file__).resolve().parent
REPO = UNIT.parents[1]


def add_test_folders() -> None:
    """``tests/unit`` and each of its subfolders that holds tests, appended to ``sys.path`` once."""
    folders = [UNIT, *sorted(p.parent for p in UNIT.rglob("test_*.py"))]
    for folder in dict.fromkeys(str(f) for f in folders):
        if folder not in sys.path:
            sys.path.append(folder)
