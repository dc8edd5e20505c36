"""compare's node count is the one ``flwr run`` would use for the app, and it says where it came from."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from runner_apps import make_app

from lips_flwr.errors import ConfigError
from lips_flwr.experiments.compare.federation import flower_config_path, flower_default, node_count

APP_FEDERATIONS = """
[tool.flwr.federations]
default = "local-sim"

[tool.flwr.federations.local-sim]
options.num-supernodes = {nodes}
"""
USER_CONFIG = """[superlink]
default = "local"

[superlink.local]
address = ":local:"
options.num-supernodes = {nodes}
"""


@pytest.fixture
def flwr_home(tmp_path, monkeypatch) -> Path:
    """A Flower home of the test's own (the machine's ``~/.flwr`` must not decide a test)."""
    home = tmp_path / "flwr_home"
    home.mkdir()
    monkeypatch.setenv("FLWR_HOME", str(home))
    return home


def with_federation(app: Path, nodes: object) -> Path:
    toml = app / "pyproject.toml"
    toml.write_text(toml.read_text() + APP_FEDERATIONS.format(nodes=nodes))
    return app


def test_without_any_federation_it_is_flowers_default_of_2(tmp_path, flwr_home):
    from flwr.cli.constant import DEFAULT_FLOWER_CONFIG_TOML

    app = make_app(tmp_path / "app")
    count = node_count(app)
    assert (count.nodes, flower_default()) == (2, 2) and count.source.startswith("Flower's default")
    (flwr_home / "config.toml").write_text(DEFAULT_FLOWER_CONFIG_TOML)  # what `flwr run` writes first
    assert node_count(app).nodes == 2


def test_the_users_flower_config_gives_it_as_flwr_reads_it(tmp_path, flwr_home):
    from flwr.cli.flower_config import read_superlink_connection

    (flwr_home / "config.toml").write_text(USER_CONFIG.format(nodes=6))
    assert flower_config_path() == flwr_home / "config.toml"
    count = node_count(make_app(tmp_path / "app"))
    assert count.nodes == 6 == read_superlink_connection(None).options.num_supernodes
    assert str(count) == f"6 nodes, from your Flower config's [superlink.local] ({flwr_home / 'config.toml'})"


def test_the_apps_own_federation_comes_before_the_users_config(tmp_path, flwr_home):
    from flwr.cli.config_utils import validate_federation_in_project_config

    (flwr_home / "config.toml").write_text(USER_CONFIG.format(nodes=6))
    app = with_federation(make_app(tmp_path / "app"), 7)
    count = node_count(app)
    assert count.nodes == 7 and count.source.startswith("the app's [tool.flwr.federations.local-sim]")
    project = tomllib.loads((app / "pyproject.toml").read_text())
    _, federation = validate_federation_in_project_config(None, project)
    assert federation["options"]["num-supernodes"] == 7  # as `flwr run` migrates it


def test_the_flag_and_a_run_config_files_federation_come_first(tmp_path, flwr_home):
    app = with_federation(make_app(tmp_path / "app"), 7)
    assert node_count(app, 3, {"num-supernodes": 5}).source == "--num-supernodes"
    assert node_count(app, None, {"num-supernodes": 5}).nodes == 5
    assert node_count(app, None, {}).nodes == 7


@pytest.mark.parametrize("bad", ["0", "'4'", "true"])
def test_a_bad_count_names_its_file(tmp_path, flwr_home, bad):
    app = with_federation(make_app(tmp_path / "app"), bad)
    with pytest.raises(ConfigError, match=r"app's \[tool\.flwr\.federations\.local-sim\] .*pyproject\.toml"):
        node_count(app)
    (flwr_home / "config.toml").write_text(USER_CONFIG.format(nodes=bad))
    with pytest.raises(ConfigError, match="config.toml.*num-supernodes must be an integer >= 1"):
        node_count(make_app(tmp_path / "plain"))


@pytest.mark.slow
def test_compare_prints_the_count_and_its_source_and_the_summary_records_both(tmp_path, flwr_home, capsys):
    pytest.importorskip("matplotlib")  # (the command asks for its extras first)
    from lips_flwr.experiments.compare import cli

    (flwr_home / "config.toml").write_text(USER_CONFIG.format(nodes=3))
    app = make_app(tmp_path / "app", lips=True, rounds=2)
    out = tmp_path / "out"
    code = cli.main(["compare", str(app), "--seeds", "1", "--engine", "sequential", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert printed.splitlines()[0] == ("lips-flwr compare: 3 nodes, from your Flower config's "
                                       f"[superlink.local] ({flwr_home / 'config.toml'})")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_nodes"] == 3 and summary["num_nodes_from"].startswith("your Flower config's")
