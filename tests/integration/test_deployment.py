"""End-to-end: a real deployment on 127.0.0.1, as in examples/deployment/README.md.

`flower-superlink` (TLS with certificates from examples/deployment/make_certs.sh,
or `--insecure`), `flower-supernode` processes, each with its own
`--node-config`, Flower home and Runtime API port, and LIPS rounds of
examples/quickstart-message started with `flwr run <app> <connection>`; the
SuperLink connections live in the config.toml of a private FLWR_HOME (never
~/.flwr). Every process is started in a session of its own and stopped with
its whole tree, by pid, however the test ends; the fixture then checks that
no process is left that mentions the test's directory.

Each message starts a fresh ClientApp process on its SuperNode (~4 s of CPU
with torch), so the runs are short: 1 or 2 rounds, 1 local epoch. The crash
case also waits for Flower's heartbeat timeout (60 s after the last heartbeat
in 1.42, not configurable), so it takes over a minute on any machine.
LIPS_IT_DEPLOY_TIMEOUT (seconds, default 300) bounds each wait for a run.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lips_flwr.persistence.checkpoint import load_checkpoint
from lips_flwr.experiments.local_flower import (
    LocalFlower,
    _cmdline,
    _free_port,
    _tree,
    find_processes,
    local_flower,
    running,
    stop_tree,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
APP = REPO_ROOT / "examples" / "quickstart-message"
MAKE_CERTS = REPO_ROOT / "examples" / "deployment" / "make_certs.sh"
README = REPO_ROOT / "examples" / "deployment" / "README.md"  # the deployment recipe

TLS = "lips-deploy"  # the deployment README's SuperLink connections
INSECURE = "lips-deploy-insecure"
TAU0 = 0.5
TIMEOUT_S = float(os.environ.get("LIPS_IT_DEPLOY_TIMEOUT", "300"))


@dataclass
class Deployment:
    """A SuperLink and SuperNodes on 127.0.0.1, each process in a session of its own."""

    root: Path
    cli: LocalFlower  # `flwr` with a private FLWR_HOME whose config.toml names the SuperLink
    port: int
    tls: bool = True
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    expected_to_exit: set[str] = field(default_factory=set)

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def connection(self) -> str:
        return TLS if self.tls else INSECURE

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        env = dict(self.cli.env, FLWR_HOME=str(self.root / name))  # one Flower home each
        with open(self.root / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(
                argv, env=env, cwd=self.root, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def start_superlink(self, *extra: str) -> None:
        # deployment README: flower-superlink --host 127.0.0.1 --port 9093 --ssl-ca-certfile ... (or --insecure)
        security = [
            "--ssl-ca-certfile", str(self.certs / "ca.crt"),
            "--ssl-certfile", str(self.certs / "server.pem"),
            "--ssl-keyfile", str(self.certs / "server.key"),
        ] if self.tls else ["--insecure"]
        self.start("superlink", ["flower-superlink", "--host", "127.0.0.1",
                                 "--port", str(self.port), *security, *extra])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.check_alive("superlink")
            if "Uvicorn running on" in self.log("superlink"):
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return
                except OSError:
                    pass
            time.sleep(0.3)
        raise TimeoutError(f"SuperLink not listening after 60 s:\n{self.log('superlink')[-3000:]}")

    def start_supernode(self, i: int, num_partitions: int, *extra: str,
                        node_config: str = "") -> subprocess.Popen:
        # deployment README: flower-supernode --superlink ... --root-certificates ... --port ... --node-config ...
        security = ["--root-certificates", str(self.certs / "ca.crt")] if self.tls else ["--insecure"]
        return self.start(f"supernode-{i}", [
            "flower-supernode", "--superlink", f"127.0.0.1:{self.port}", *security,
            "--port", str(_free_port()), *extra,
            "--node-config", f"partition-id={i} num-partitions={num_partitions} {node_config}".strip(),
        ])

    def wait_for_nodes(self, n: int, timeout: float = 90) -> None:
        """Until the SuperLink has activated ``n`` SuperNodes; fails if one we need has exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in self.procs:
                if name not in self.expected_to_exit:
                    self.check_alive(name)
            if self.log("superlink").count("Activated node_id=") >= n:
                return
            time.sleep(0.5)
        raise TimeoutError(f"fewer than {n} SuperNodes connected:\n{self.log('superlink')[-3000:]}")

    def check_alive(self, name: str) -> None:
        if self.procs[name].poll() is not None:
            raise RuntimeError(f"{name} exited with {self.procs[name].returncode}:\n"
                               f"{self.log(name)[-3000:]}")

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.cli.cli(*args, timeout=timeout)

    def run(self, run_config: str) -> str:
        # deployment README: flwr run examples/quickstart-message lips-deploy --format json --run-config "..."
        proc = self.flwr("run", str(APP), self.connection, "--format", "json",
                         "--run-config", run_config)
        try:
            out = json.loads(proc.stdout[proc.stdout.index("{"):])
        except ValueError:
            out = {}
        assert proc.returncode == 0 and out.get("success"), proc.stdout + proc.stderr
        return str(out["run-id"])

    def status(self, run_id: str) -> str:
        proc = self.flwr("ls", self.connection, "--run-id", run_id, "--format", "json", timeout=60)
        try:
            runs = json.loads(proc.stdout[proc.stdout.index("{"):]).get("runs") or []
        except ValueError:
            return "unknown"
        return runs[0]["status"] if runs else "unknown"

    def logs(self, run_id: str) -> str:
        proc = self.flwr("log", run_id, self.connection, "--show", timeout=60)
        return proc.stdout + proc.stderr

    def wait(self, run_id: str, results: Path, timeout: float = TIMEOUT_S) -> str:
        """Status once the run is finished:*, from `flwr ls --run-id ID --format json`.

        Each `flwr ls` costs about a second of CPU, which the SuperNodes need:
        while the results file (the app writes it last) is missing, ask every
        15 s only, to notice a failed run; then every second.
        """
        deadline = time.monotonic() + timeout
        next_ls = time.monotonic() + 15
        while time.monotonic() < deadline:
            if results.exists() or time.monotonic() >= next_ls:
                status = self.status(run_id)
                if status.startswith("finished"):
                    return status
                next_ls = time.monotonic() + 15
            time.sleep(1)
        self.flwr("stop", run_id, self.connection, timeout=60)
        raise TimeoutError(f"run {run_id} not finished after {timeout:.0f}s\n"
                           f"{self.logs(run_id)[-4000:]}")

    def close(self) -> None:
        """Stop every process this deployment started, with their children, by pid.

        SIGTERM to the SuperLink and SuperNodes (each stops its SuperExec and
        app processes), then SIGTERM to anything left, then SIGKILL.
        """
        stop_tree([p.pid for p in self.procs.values()], grace_s=5.0)
        for proc in self.procs.values():  # reap our direct children
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _config_toml(port: int, certs: Path, default: str) -> str:
    """The deployment README's SuperLink connections, for a SuperLink on 127.0.0.1:``port``."""
    return (
        f'[superlink]\ndefault = "{default}"\n\n'
        f'[superlink.{TLS}]\naddress = "127.0.0.1:{port}"\n'
        f'root-certificates = "{certs / "ca.crt"}"\n\n'
        f'[superlink.{INSECURE}]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )


@pytest.fixture
def make_deployment(tmp_path: Path) -> Iterator:
    """make_deployment(tls=True) -> a Deployment with certificates and the CLI's connections."""
    made: list[Deployment] = []

    def make(tls: bool = True) -> Deployment:
        root = tmp_path / "deploy"
        root.mkdir()
        cli = local_flower(root / "cli", pythonpath=[str(REPO_ROOT)], cwd=REPO_ROOT)
        dep = Deployment(root=root, cli=cli, port=_free_port(), tls=tls)
        made.append(dep)
        if tls:
            if shutil.which("openssl") is None:
                pytest.skip("openssl is needed to make the TLS certificates")
            # deployment README: examples/deployment/make_certs.sh --out $D/certs --supernode-keys 3
            subprocess.run(["bash", str(MAKE_CERTS), "--out", str(dep.certs), "--supernode-keys", "3"],
                           check=True, capture_output=True, text=True, timeout=60)
        (root / "cli" / "config.toml").write_text(_config_toml(dep.port, dep.certs, dep.connection))
        return dep

    try:
        yield make
    finally:
        for dep in made:
            seen = _tree([p.pid for p in dep.procs.values()])
            dep.close()
            left = find_processes(str(dep.root))  # anything using our certificates, homes, logs
            left += [pid for pid in seen if running(pid) and pid not in left]
            assert not left, f"processes left running: {left}"


def _run_config(rounds: int, every: int, results: Path, mask_last_round: bool = False) -> str:
    """``mask_last_round``: the final round masks too (LIPS spares it by default: issue 35)."""
    return (f"num-server-rounds={rounds} every={every} tau0={TAU0} local-epochs=1 "
            f"results-path='{results}'" + (" mask-last-round=true" if mask_last_round else ""))


def _resume_config(results: Path, checkpoint: Path) -> str:
    """The deployment README's restart: 4 rounds, masks on rounds 1 and 3, a checkpoint, resume='auto'."""
    return _run_config(rounds=4, every=2, results=results) + (
        f" checkpoint-path='{checkpoint}' resume='auto'")


def _state_node_config(folder: Path) -> str:
    return f"lips-state-dir='{folder}'"


def _check_masks(results: Path, rounds: int, mask_rounds: set[int]) -> None:
    data = json.loads(results.read_text())  # valid JSON, written atomically by the ServerApp
    assert data["run_config"]["num-server-rounds"] == rounds
    train = {int(k): v for k, v in data["train_metrics"].items()}
    assert sorted(train) == list(range(1, rounds + 1))
    for rnd, metrics in train.items():
        masked = rnd in mask_rounds
        assert metrics["lips-mask-round"] == int(masked), (rnd, metrics)
        assert (metrics["lips-zeros"] > 0) == masked, (rnd, metrics)
        if masked:
            tau = TAU0 * (1 - (rnd - 1) / rounds)
            assert math.isclose(metrics["lips-tau"], tau, rel_tol=1e-6), (rnd, metrics)
        assert math.isfinite(metrics["train-loss"]), (rnd, metrics)
    # No temporary file of the atomic write is left next to it.
    assert not [p.name for p in results.parent.iterdir() if p.name.startswith(f".{results.name}.")]


def _by_round(logs: str) -> dict[int, str]:
    parts = re.split(r"\[ROUND (\d+)/\d+\]", logs)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_tls_deployment_runs_lips(make_deployment, tmp_path: Path):
    """3 SuperNodes over TLS; every=2 over 2 rounds: LIPS masks round 1 (tau0), not round 2."""
    dep = make_deployment()
    dep.start_superlink()
    for i in range(3):
        dep.start_supernode(i, 3)
    dep.wait_for_nodes(3)

    t0 = time.monotonic()
    results = tmp_path / "results.json"
    run_id = dep.run(_run_config(rounds=2, every=2, results=results))
    status = dep.wait(run_id, results)
    logs = dep.logs(run_id)
    assert status == "finished:completed", logs[-4000:]

    _check_masks(results, rounds=2, mask_rounds={1})
    assert {int(r) for r in re.findall(r"LIPS: round (\d+) masked", logs)} == {1}, logs[-4000:]
    assert logs.count("Received 3 results and 0 failures") == 4, logs[-4000:]  # train + evaluate
    for i in range(3):  # every SuperNode ran the ClientApp
        assert "Start `flwr-clientapp` process" in dep.log(f"supernode-{i}")
    print(f"\nTLS deployment: run {run_id} took {time.monotonic() - t0:.1f}s")


@pytest.mark.parametrize("how", ["crash", "stop"])
def test_supernode_lost_mid_run(make_deployment, tmp_path: Path, how: str):
    """One of three SuperNodes goes away in round 2; FedAvg needs 2, so the run goes on.

    crash: SIGKILL to its whole process group (SuperNode, SuperExec, ClientApp), as
    when a device loses power; the SuperLink gives up on it when its heartbeats
    stop (Flower 1.42: one every ~25 s, offline 60 s after the last one) and
    answers the ServerApp with an error reply for its message.
    stop: SIGTERM to the SuperNode, which deactivates itself on the way out.
    every=1 and mask-last-round: LIPS masks both rounds, round 2 (the final one) from the two
    replies that came.
    """
    dep = make_deployment()
    dep.start_superlink()
    for i in range(3):
        dep.start_supernode(i, 3)
    dep.wait_for_nodes(3)

    t0 = time.monotonic()
    results = tmp_path / "results.json"
    run_id = dep.run(_run_config(rounds=2, every=1, results=results, mask_last_round=True))

    # Mid-run: the victim has received its round-2 train message (round 1 is done).
    victim = dep.procs["supernode-2"]
    deadline = time.monotonic() + TIMEOUT_S
    while dep.log("supernode-2").count("Receiving: train message") < 2:
        assert time.monotonic() < deadline, dep.logs(run_id)[-4000:]
        dep.check_alive("supernode-2")
        time.sleep(0.5)
    if how == "crash":
        group = _tree([victim.pid])
        os.killpg(victim.pid, signal.SIGKILL)
        stop_tree(list(group), grace_s=1.0)  # anything that had left the group
    else:
        os.kill(victim.pid, signal.SIGTERM)
    victim.wait(timeout=30)
    t_kill = time.monotonic()

    status = dep.wait(run_id, results)
    logs = dep.logs(run_id)
    assert status == "finished:completed", logs[-4000:]
    by_round = _by_round(logs)
    assert sorted(by_round) == [1, 2], logs[-4000:]
    assert by_round[1].count("Received 3 results and 0 failures") == 2, by_round[1]
    # Round 2: the lost node's train reply is an error, the two others aggregate;
    # evaluation then samples only the two nodes that are left.
    assert "aggregate_train: Received 2 results and 1 failures" in by_round[2], by_round[2]
    assert "Node Unavailable" in by_round[2], by_round[2]
    assert "configure_evaluate: Sampled 2 nodes (out of 2)" in by_round[2], by_round[2]
    assert "aggregate_evaluate: Received 2 results and 0 failures" in by_round[2], by_round[2]

    _check_masks(results, rounds=2, mask_rounds={1, 2})
    print(f"\nSuperNode {how} in round 2: run {run_id} took {time.monotonic() - t0:.1f}s "
          f"({time.monotonic() - t_kill:.1f}s after the kill)")


def test_server_killed_mid_run_resumes_from_its_checkpoint(make_deployment, tmp_path: Path):
    """The ServerApp process is SIGKILLed after round 2 of 4; the same `flwr run` resumes.

    The deployment README's restart (docs/restart.md explains it): the run
    config names a checkpoint and resume='auto', and each SuperNode's node
    config a lips-state-dir. The second run starts
    at the round after the checkpoint, masks on the same schedule (every=2:
    rounds 1 and 3), its clients continue with their FedBN state from disk,
    and it returns the Result of all 4 rounds (the earlier ones from the
    checkpoint), which the app writes to its file.
    """
    dep = make_deployment()
    dep.start_superlink()
    for i in range(3):
        dep.start_supernode(i, 3, node_config=_state_node_config(tmp_path / "clients"))
    dep.wait_for_nodes(3)

    t0 = time.monotonic()
    results, checkpoint = tmp_path / "results.json", tmp_path / "state" / "lips.npz"
    config = _resume_config(results, checkpoint)
    first = dep.run(config)
    deadline = time.monotonic() + TIMEOUT_S
    while not checkpoint.exists() or load_checkpoint(checkpoint).round < 2:
        assert time.monotonic() < deadline, dep.logs(first)[-4000:]
        time.sleep(0.2)
    servers = [pid for pid in _tree([dep.procs["superlink"].pid])
               if any("flwr-serverapp" in arg for arg in _cmdline(pid))]
    assert servers, "no flwr-serverapp process under the SuperLink"
    for pid in servers:
        os.kill(pid, signal.SIGKILL)
    done = load_checkpoint(checkpoint).round  # the last checkpoint written before the kill
    assert 2 <= done < 4
    dep.flwr("stop", first, dep.connection, timeout=60)
    assert not dep.status(first).endswith("completed")
    assert not results.exists()  # the app writes it at the end

    second = dep.run(config)
    status = dep.wait(second, results)
    logs = dep.logs(second)
    assert status == "finished:completed", logs[-4000:]
    assert f"rounds 1-{done} are done, continuing with round {done + 1} of 4" in logs, logs[-4000:]
    assert {int(r) for r in re.findall(r"LIPS: round (\d+) masked", logs)} == {
        r for r in (1, 3) if r > done}, logs[-4000:]
    _check_masks(results, rounds=4, mask_rounds={1, 3})  # all 4 rounds, on one schedule
    final = load_checkpoint(checkpoint)
    assert final.round == 4 and sorted(final.history["train"], key=int) == ["1", "2", "3", "4"]
    # No temporary file left; beside the checkpoint only its history and its lock (docs/restart.md).
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == [
        "lips.npz", "lips.npz.history.jsonl", "lips.npz.lock"]
    # Each client kept its FedBN tensors under the run's key, and the resumed run read them.
    assert sorted(p.name for p in (tmp_path / "clients").iterdir()) == sorted(
        f"lips-client-{final.run_key}-{i}{last}.npz" for i in range(3) for last in ("", ".prev"))
    restored = sum(dep.log(f"supernode-{i}").count("LIPS: client state restored") for i in range(3))
    assert restored == 3, [dep.log(f"supernode-{i}")[-2000:] for i in range(3)]  # once per node
    print(f"\nServer killed after round {done}: resumed and finished in "
          f"{time.monotonic() - t0:.1f}s in all")


def test_insecure_local_try(make_deployment, tmp_path: Path):
    """The deployment README's first try without certificates: --insecure everywhere, 2 SuperNodes, 1 round."""
    dep = make_deployment(tls=False)
    dep.start_superlink()
    for i in range(2):
        dep.start_supernode(i, 2)
    dep.wait_for_nodes(2)

    results = tmp_path / "results.json"
    run_id = dep.run(_run_config(rounds=1, every=1, results=results, mask_last_round=True))
    status = dep.wait(run_id, results)
    assert status == "finished:completed", dep.logs(run_id)[-4000:]
    _check_masks(results, rounds=1, mask_rounds={1})


def test_supernode_authentication(make_deployment):
    """--enable-supernode-auth: a registered key connects, an unknown key is turned away."""
    dep = make_deployment()
    dep.start_superlink("--enable-supernode-auth")
    # deployment README: flwr supernode register $D/certs/supernode-0.pub lips-deploy
    reg = dep.flwr("supernode", "register", str(dep.certs / "supernode-0.pub"), TLS,
                   "--format", "json")
    assert reg.returncode == 0 and '"success": true' in reg.stdout, reg.stdout + reg.stderr
    node_id = json.loads(reg.stdout[reg.stdout.index("{"):])["node-id"]

    dep.start_supernode(0, 2, "--auth-supernode-private-key", str(dep.certs / "supernode-0"))
    stranger = dep.start_supernode(1, 2, "--auth-supernode-private-key",
                                   str(dep.certs / "supernode-1"))
    dep.expected_to_exit.add("supernode-1")
    assert stranger.wait(timeout=60) != 0
    assert "Failed to activate SuperNode" in dep.log("supernode-1"), dep.log("supernode-1")
    dep.wait_for_nodes(1)
    assert f"Activated node_id={node_id}" in dep.log("superlink")
    assert dep.log("superlink").count("Activated node_id=") == 1
    dep.check_alive("supernode-0")

    nodes = dep.flwr("supernode", "ls", TLS, "--format", "json")
    listed = json.loads(nodes.stdout[nodes.stdout.index("{"):])
    assert [str(n["node-id"]) for n in listed["nodes"] if n["status"] == "online"] == [str(node_id)], listed


def test_readme_deployment_commands_match_the_tests():
    """examples/deployment/README.md's commands use the programs and flags these tests run."""
    text = README.read_text()
    section = text[text.index("## Deploy to real machines"):]
    end = section.find("\n## ", 3)
    section = section if end < 0 else section[:end]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    commands = [[word.rstrip(";") for word in shlex.split(line, comments=True)]
                for block in blocks for line in block.replace("\\\n", " ").splitlines()
                if line.strip()]

    def flags(program: str, *first: str) -> list[set[str]]:
        found = []
        for argv in commands:
            for k, word in enumerate(argv):
                if word.endswith(program) and argv[k + 1: k + 1 + len(first)] == list(first):
                    found.append({w for w in argv[k:] if w.startswith("--")})
        assert found, f"no `{program} {' '.join(first)}` in the deployment README's section"
        return found

    tls = {"--host", "--port", "--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"}
    assert flags("flower-superlink") == [tls, {"--host", "--port", "--insecure"},
                                         tls | {"--enable-supernode-auth"}]
    node = {"--superlink", "--port", "--node-config"}
    tls_node = node | {"--root-certificates"}
    assert flags("flower-supernode") == [tls_node, tls_node, node | {"--insecure"},
                                         tls_node | {"--auth-supernode-private-key"}]
    assert all(f == {"--format", "--run-config"} for f in flags("flwr", "run"))
    assert flags("make_certs.sh") == [{"--out", "--supernode-keys"}]
    assert flags("flwr", "supernode", "register")
    flwr_commands = [argv[k:] for argv in commands for k, w in enumerate(argv) if w.endswith("flwr")]
    assert len(flwr_commands) == 10, flwr_commands
    for argv in flwr_commands:  # every `flwr` command names its SuperLink connection
        assert TLS in argv or INSECURE in argv, argv
    assert _config_toml(9093, Path("$D/certs"), TLS) in section
    for rounds, every, last in ((2, 2, False), (1, 1, True)):  # test_tls_deployment_runs_lips, _insecure_local_try
        assert _run_config(rounds, every, Path("$D/results.json"), mask_last_round=last) in section
    # test_server_killed_mid_run_resumes_from_its_checkpoint
    assert _resume_config(Path("$D/results.json"), Path("$D/state/lips.npz")) in section
    assert f'num-partitions=3 {_state_node_config(Path("$D/client-state"))}"' in section
