"""``lips-flwr compare``: endpoint, paired test and verdict, inertia verdict, environments, the CLI.

Most tests build result files by hand (what the runner writes); the CLI ones
run the tiny numpy app of ``runner_apps.py`` on the batched Grid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("scipy")

from runner_apps import make_app  # noqa: E402

from lips_flwr.errors import ConfigError  # noqa: E402
from lips_flwr.experiments.compare import Comparison, cli, default_goal, default_metric, summarize  # noqa: E402
from lips_flwr.experiments.runner.provenance import provenance  # noqa: E402
from lips_flwr.experiments.runner.store import read_result, write_result  # noqa: E402
from lips_flwr.experiments.stats import paired, verdict  # noqa: E402

LAYERS = {"all": ["first.weight", "mid.weight", "last.weight"], "middle": ["mid.weight"]}


def observed(accs: list[float], steps: dict[str, list[float]] | None = None,
             keys=("loss", "acc", "n")) -> dict:
    rounds = {}
    for r, acc in enumerate(accs, start=1):
        entry = {"train": {"metrics": {"loss": 1.0}, "replies": 3, "errors": 0},
                 "evaluate": {"metrics": {"loss": 1 - acc, "acc": acc, "n": 3.0}, "replies": 3, "errors": 0}}
        if steps:
            entry["relative_step"] = {layer: s[r - 1] for layer, s in steps.items()}
        rounds[str(r)] = entry
    return {"rounds": rounds, "layers": LAYERS, "evaluate_keys": list(keys), "first_round": 1}


def write_runs(folder: Path, a: dict[int, list[float]], b: dict[int, list[float]], env_b: dict | None = None,
               steps: dict[str, list[float]] | None = None) -> dict:
    results = {}
    folder.mkdir(parents=True, exist_ok=True)
    for arm, curves in (("a", a), ("b", b)):
        for seed, accs in curves.items():
            path = folder / f"{arm}-seed{seed}.json"
            record = provenance("sequential", "t", 1.0)
            if arm == "b" and env_b:
                record.update(env_b)
            write_result(path, {"engine": "sequential", "seed": seed}, record, observed(accs, steps), None)
            results[f"{arm}-seed{seed}"] = read_result(path)
    return results


def test_the_endpoint_is_the_mean_of_the_last_k_evaluated_rounds_and_b_minus_a_is_tested(tmp_path):
    a = {1: [0.1, 0.5, 0.6], 2: [0.1, 0.4, 0.5], 3: [0.2, 0.6, 0.6]}
    b = {1: [0.1, 0.6, 0.7], 2: [0.1, 0.5, 0.62], 3: [0.2, 0.7, 0.74]}
    results = write_runs(tmp_path, a, b)
    summary = summarize(Comparison(tmp_path, (1, 2, 3), last=2), results)
    assert summary["metric"] == "acc" and summary["last"] == 2  # the first evaluate key with "acc"
    assert summary["endpoint_a"] == pytest.approx([0.55, 0.45, 0.6])
    assert summary["endpoint_b"] == pytest.approx([0.65, 0.56, 0.72])
    test = paired([0.1, 0.11, 0.12])
    assert summary["diff_mean"] == pytest.approx(0.11) and summary["ci95"] == pytest.approx(
        [test["ci_low"], test["ci_high"]])
    assert summary["p_t"] == pytest.approx(test["p_t"]) and summary["p_sign"] == pytest.approx(0.25)
    assert verdict(test, test["p_t"]) == "supported" and summary["verdict"] == "B better"
    assert summary["goal"] == "max"  # (an accuracy: higher is better)
    assert summarize(Comparison(tmp_path, (1, 2, 3)), results)["last"] == 3  # min(10, rounds)
    assert summary["environments"] == [{"seed": s, "same": True, "differing": []} for s in (1, 2, 3)]
    assert summary["error_replies"] == {}
    made = summary["provenance"]["summary"]  # what made the summary, and each run's code
    assert {"lips_flwr", "git", "python", "numpy", "torch", "flwr", "made"} <= set(made)
    assert sorted(summary["provenance"]["runs"]) == [f"{arm}-seed{s}" for arm in "ab" for s in (1, 2, 3)]
    assert summary["provenance"]["runs"]["b-seed2"]["file"] == "b-seed2.json"
    assert json.loads(json.dumps(summary)) == summary  # plain JSON


def test_a_lower_is_better_metric_turns_the_verdict_and_goal_overrides_the_default(tmp_path):
    """``--metric loss`` where B's loss is higher on every seed read "supported" under "Does it help?"."""
    pytest.importorskip("matplotlib")
    from lips_flwr.experiments.compare.report import write_report

    a = {1: [0.5, 0.6], 2: [0.5, 0.7], 3: [0.5, 0.8]}
    b = {1: [0.5, 0.5], 2: [0.5, 0.59], 3: [0.5, 0.71]}  # B's accuracy lower, so its loss (1 - acc) higher
    results = write_runs(tmp_path, a, b)
    comparison = Comparison(tmp_path, (1, 2, 3), metric="loss", last=1)
    summary = summarize(comparison, results)
    assert summary["goal"] == "min" and summary["differences"] == pytest.approx([0.1, 0.11, 0.09])
    assert summary["verdict"] == "B worse"
    write_report(comparison, summary, results, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "lower is better (--goal min)" in text and "**Verdict: B worse**" in text
    assert "B better on 0 of 3 seeds" in text and "supported" not in text
    told = summarize(Comparison(tmp_path, (1, 2, 3), metric="loss", last=1, goal="max"), results)
    assert told["goal"] == "max" and told["verdict"] == "B better"
    assert summarize(Comparison(tmp_path, (1, 2, 3), last=1), results)["verdict"] == "B worse"  # acc, max
    for name, goal in (("eval_loss", "min"), ("test-error", "min"), ("top1_err", "min"), ("acc", "max"),
                       ("f1", "max")):
        assert default_goal(name) == goal


@pytest.mark.parametrize("weight", ["num-examples", "num_examples"])
def test_the_weight_key_is_refused_as_a_metric_before_anything_runs(tmp_path, weight):
    with pytest.raises(ConfigError, match=f"--metric {weight}: .* the weight of the clients' replies"):
        Comparison(tmp_path, (1,), metric=weight).specs()


def test_one_seed_gets_no_test_and_bad_requests_clear_errors(tmp_path):
    results = write_runs(tmp_path, {1: [0.5, 0.6]}, {1: [0.5, 0.7]})
    summary = summarize(Comparison(tmp_path, (1,)), results)
    assert summary["verdict"] == "no test (one seed)" and summary["ci95"] is None and summary["n"] == 1
    with pytest.raises(ValueError, match="--last 3: the runs have 2 evaluated rounds"):
        summarize(Comparison(tmp_path, (1,), last=3), results)
    with pytest.raises(ValueError, match=r"metric 'f1' is in no round"):
        summarize(Comparison(tmp_path, (1,), metric="f1"), results)
    path = tmp_path / "x.json"
    write_result(path, {}, {}, observed([0.5], keys=("loss", "n")), None)
    with pytest.raises(ValueError, match=r"has 'acc' in its name \(the clients report \['loss', 'n'\]\)"):
        default_metric(read_result(path))


def test_identical_differences_get_no_t_test_and_the_report_says_so(tmp_path):
    """Zero variance gave p_t = 0 and a CI [m, m]: "supported" from two seeds."""
    pytest.importorskip("matplotlib")
    from lips_flwr.experiments.compare.report import write_report

    a = {1: [0.5, 0.5], 2: [0.25, 0.25]}
    b = {1: [0.5, 0.625], 2: [0.25, 0.375]}  # B - A = +0.125 on both seeds (exact in binary)
    results = write_runs(tmp_path, a, b)
    comparison = Comparison(tmp_path, (1, 2), last=1)
    summary = summarize(comparison, results)
    assert summary["differences"] == [0.125, 0.125] and summary["sd"] == 0.0
    assert summary["ci95"] is None and summary["p_t"] is None and summary["p_sign"] == 0.5
    assert summary["verdict"] == "no test (zero variance)"
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary  # plain JSON: no NaN
    write_report(comparison, summary, results, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "B - A: +0.1250 on every one of the 2 seeds: zero variance, so no t-test and no CI" in text
    assert "**Verdict: no test (zero variance)**" in text and "supported" not in text


def test_the_report_says_when_paired_runs_ran_in_different_environments(tmp_path):
    pytest.importorskip("matplotlib")
    from lips_flwr.experiments.compare.report import write_report

    a = {1: [0.5, 0.6], 2: [0.5, 0.61]}
    b = {1: [0.5, 0.62], 2: [0.5, 0.6]}
    results = write_runs(tmp_path, a, b, env_b={"torch": "0.0-other", "threads": {"torch": 64}})
    comparison = Comparison(tmp_path, (1, 2), last=1)
    summary = summarize(comparison, results)
    assert summary["environments"][0] == {"seed": 1, "same": False, "differing": ["torch", "threads"]}
    write_report(comparison, summary, results, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "Not every seed's two runs ran in one environment" in text
    assert "- seed 1: different: torch, threads" in text
    assert "**Verdict: no difference detected**" in text and "| 1 | 0.6000 | 0.6200 | +0.0200 |" in text
    assert "A: the app with LIPS off" in text
    for name in ("curves.png", "inertia.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    same = write_runs(tmp_path / "same", a, b)
    write_report(comparison, summarize(comparison, same), same, tmp_path / "same")
    assert "Each seed's two runs ran in one environment" in (tmp_path / "same" / "report.md").read_text()


def test_arm_as_inertia_verdict_follows_the_protocols_rule(tmp_path):
    rounds = 20
    slow_middle = {"first.weight": [0.1] * 6 + [0.05] * 14, "mid.weight": [0.1] * 6 + [0.005] * 14,
                   "last.weight": [0.1] * 6 + [0.05] * 14}
    accs = [0.5] * rounds
    results = write_runs(tmp_path, {s: accs for s in (1, 2)}, {s: accs for s in (1, 2)}, steps=slow_middle)
    inertia = summarize(Comparison(tmp_path, (1, 2)), results)["inertia_a"]
    assert inertia["verdict"] == "arises" and inertia["arises_in"] == 2
    assert inertia["middle"] == pytest.approx(0.05) and inertia["edges"] == pytest.approx(0.5)
    together = {k: [0.1] * 6 + [0.01] * 14 for k in slow_middle}
    results = write_runs(tmp_path / "t", {1: accs, 2: accs}, {1: accs, 2: accs}, steps=together)
    assert summarize(Comparison(tmp_path, (1, 2)), results)["inertia_a"]["verdict"] == "does not arise"
    eight = {k: v[:8] for k, v in together.items()}
    short = write_runs(tmp_path / "s", {1: accs[:8]}, {1: accs[:8]}, steps=eight)
    assert summarize(Comparison(tmp_path, (1,)), short)["inertia_a"]["verdict"] == "not measured"


def test_arms_are_lips_off_by_default_and_overrides_otherwise(tmp_path):
    specs = Comparison(tmp_path, (5, 6), run_config={"lr": 0.1}, num_nodes=2).specs()  # (no app to read)
    assert [s.name for s in specs] == ["a-seed5", "b-seed5", "a-seed6", "b-seed6"]
    assert [s.lips_off for s in specs] == [True, False, True, False]
    assert all(s.overrides == {"lr": 0.1} and s.require_evaluate for s in specs)
    custom = Comparison(tmp_path, (5,), a={"tau0": 0.0}, b={"tau0": 0.7}, num_nodes=2).specs()
    assert [(s.lips_off, dict(s.overrides)) for s in custom] == [(False, {"tau0": 0.0}),
                                                                 (False, {"tau0": 0.7})]
    with pytest.raises(ValueError, match="engine auto, sequential or stacked"):
        Comparison(tmp_path, (5,), engine="flwr").specs()
    with pytest.raises(ValueError, match="distinct"):
        Comparison(tmp_path, (5, 5)).specs()


# --------------------------------------------------------------------------- the command


def test_the_command_asks_for_the_extras_it_lacks(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "missing_extras", lambda: ["matplotlib"])
    assert cli.main(["compare", str(tmp_path), "--seeds", "1", "--out", str(tmp_path / "o")]) == 2
    assert 'pip install "lips-flwr[examples]"' in capsys.readouterr().err


@pytest.mark.parametrize("argument", [["--seeds", "1,2,1"], ["--seeds", "1,2", "--last", "0"],
                                      ["--seeds", "1,2", "--num-supernodes", "0"],
                                      ["--seeds", "1", "--jobs", "0"]])
def test_usage_errors_exit_2_before_anything_runs(tmp_path, capsys, argument):
    """As the docstring promises: a seed twice exited 1, ``--last 0`` was found only after every run."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["compare", str(tmp_path / "app"), *argument, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument" in err and ("each seed once" in err or "an integer >= 1, got '0'" in err)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_failing_app_exits_non_zero_with_its_clients_error(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # (the command asks for its extras first)
    app = make_app(tmp_path / "app", fail=True, lips=True)  # (arm A forces LIPS off: the app builds one)
    code = cli.main(["compare", str(app), "--seeds", "1", "--num-supernodes", "2", "--engine", "sequential",
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and "a run failed" in err
    assert "RuntimeError: tiny app: this ClientApp fails on every call" in err
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.slow
def test_a_run_with_no_aggregate_in_most_rounds_fails_with_the_strategys_reasons(tmp_path, capsys):
    """``--run-config lr=nan``: every reply dropped every round, and compare wrote a verdict (+0.0000)."""
    pytest.importorskip("matplotlib")
    app = make_app(tmp_path / "app", lips=True)
    code = cli.main(["compare", str(app), "--seeds", "1", "--num-supernodes", "2", "--engine", "sequential",
                     "--jobs", "1", "--run-config", "lr=nan", "--out", str(tmp_path / "out")])  # (a-seed1 fails)
    err = capsys.readouterr().err
    assert code == 1 and "a run failed" in err
    assert ("3 of its 3 trained rounds did not move the global model (the model unchanged: rounds 1, 2, 3)"
            in err)
    assert "(round 3) LIPS: ignoring reply from node 1000: NaN or Inf in arrays" in err  # the reasons
    assert not (tmp_path / "out" / "summary.json").exists()


def test_summary_and_report_flag_each_round_that_did_not_move_the_model(tmp_path):
    pytest.importorskip("matplotlib")
    from lips_flwr.experiments.compare.report import write_report

    steps = {"first.weight": [0.1, 0.0, 0.1], "mid.weight": [0.1, 0.0, 0.1], "last.weight": [0.1, 0.0, 0.1]}
    results = write_runs(tmp_path, {1: [0.5, 0.6, 0.7]}, {1: [0.5, 0.6, 0.8]}, steps=steps)
    comparison = Comparison(tmp_path, (1,))
    summary = summarize(comparison, results)
    assert summary["stalled_rounds"] == {"a-seed1": {"unchanged": [2]}, "b-seed1": {"unchanged": [2]}}
    write_report(comparison, summary, results, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "**Rounds that did not move the global model**" in text
    assert "- b-seed1: global model unchanged in rounds 2" in text


def test_every_output_file_is_written_through_a_temporary_file(tmp_path, monkeypatch):
    """report.md was written in place: a crash mid-write left half a report."""
    pytest.importorskip("matplotlib")
    from lips_flwr.experiments import results as results_module
    from lips_flwr.experiments.compare.out import OUTPUTS
    from lips_flwr.experiments.compare.report import write_report

    written = []
    real = results_module.write_atomic
    monkeypatch.setattr(results_module, "write_atomic", lambda path, write: (written.append(Path(path).name),
                                                                          real(path, write)))
    runs = write_runs(tmp_path / "runs", {1: [0.5, 0.6], 2: [0.5, 0.7]}, {1: [0.5, 0.7], 2: [0.5, 0.71]})
    comparison = Comparison(tmp_path, (1, 2), last=1)
    written.clear()
    write_report(comparison, summarize(comparison, runs), runs, tmp_path)
    assert sorted(written) == sorted(OUTPUTS) and written[-1] == "summary.json"  # the summary last
    assert all((tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~_umask() for name in OUTPUTS)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _umask() -> int:
    from lips_flwr.experiments.results import _umask as umask

    return umask()


@pytest.mark.slow
def test_a_sweep_that_replaces_runs_removes_the_old_report_first(tmp_path, capsys):
    """A --recompute that failed after its runs left the old report beside the runs it had replaced."""
    pytest.importorskip("matplotlib")
    app = make_app(tmp_path / "app", lips=True, rounds=2)
    out = tmp_path / "out"
    base = ["compare", str(app), "--seeds", "1", "--num-supernodes", "2", "--engine", "sequential",
            "--out", str(out)]
    assert cli.main(base) == 0
    assert (out / "report.md").exists() and (out / "summary.json").exists()
    assert cli.main([*base, "--metric", "accuracy"]) == 0  # every run reused: the report stays, rewritten
    assert "removing the report" not in capsys.readouterr().out
    code = cli.main([*base, "--recompute", "--run-config", "lr=0.2", "--last", "5"])  # fails after its runs
    captured = capsys.readouterr()
    assert code == 1 and "--last 5: the runs have 2 evaluated rounds" in captured.err
    assert "removing the report of earlier runs" in captured.out
    assert not any((out / name).exists() for name in ("report.md", "summary.json", "curves.png",
                                                      "inertia.png"))
    assert read_result(out / "runs" / "b-seed1.json").identity["run_config"]["lr"] == 0.2


# --------------------------------------------------------------------------- user errors: one line, exit 1


def _no_access(monkeypatch, denied: str):
    from lips_flwr.experiments.compare import out as compare_out

    real = compare_out.os.access
    monkeypatch.setattr(compare_out.os, "access",
                        lambda p, mode: real(p, mode) and not str(p).endswith(denied))


def _result_without_identity(out: Path) -> None:
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "a-seed1.json").write_text(json.dumps({"format": "lips-flwr-result/1", "provenance": {},
                                                           "observed": None, "app": None}))


def _old_style_result(out: Path) -> None:
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "a-seed1.json").write_text(json.dumps({"run_config": {"num-server-rounds": 2}}))


USER_ERRORS = {  # name: (set-up(app, out, monkeypatch), extra arguments, what the last line says)
    "out is a file": (lambda app, out, mp: out.write_text("x"), [], "is a file: give a folder"),
    "out below a file": (lambda app, out, mp: out.write_text("x"), ["--out-child"], "a file: give a folder"),
    "out unwritable": (lambda app, out, mp: _no_access(mp, out.parent.name), [],
                       "is not writable: give a folder you can write"),
    "runs read-only": (lambda app, out, mp: ((out / "runs").mkdir(parents=True), _no_access(mp, "runs")), [],
                       "runs' is read-only: compare writes its runs there"),
    "summary.json a folder": (lambda app, out, mp: (out / "summary.json").mkdir(parents=True), [],
                              "summary.json' is a folder where compare writes its summary.json"),
    "result without identity": (lambda app, out, mp: _result_without_identity(out), [],
                                "--recompute, runs them again and replaces those files"),
    "result path a folder": (lambda app, out, mp: (out / "runs" / "a-seed1.json").mkdir(parents=True),
                             ["--recompute"],
                             "a-seed1.json' is a folder where the result file of run a-seed1"),
    "old-style result": (lambda app, out, mp: _old_style_result(out), [],
                         "hold no per-round observations"),
    "broken pyproject": (lambda app, out, mp: (app / "pyproject.toml").write_text("[project\nname = 1"), [],
                         "pyproject.toml' is not valid TOML"),
    "unknown key": (lambda app, out, mp: None, ["--run-config", "nosuch=1"], "unknown run-config keys"),
    "app without LIPS": (lambda app, out, mp: make_app(app, rounds=2), [],
                         "builds no LIPS strategy, so arm A (LIPS off) would be the app as written: swap "
                         "LIPS in as the README's \"Swap LIPS into your existing project\" shows"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(USER_ERRORS))
def test_each_user_error_ends_with_one_line_naming_the_file_or_the_fix(tmp_path, capsys, monkeypatch, case):
    """These printed a traceback (KeyError, IsADirectoryError, NotADirectoryError, ...) or a bare message."""
    pytest.importorskip("matplotlib")
    set_up, extra, says = USER_ERRORS[case]
    app = make_app(tmp_path / "app", lips=True, rounds=2)
    out = tmp_path / "out"
    set_up(app, out, monkeypatch)
    target = out / "child" if "--out-child" in extra else out
    extra = [x for x in extra if x != "--out-child"]
    made_before = out.exists()
    code = cli.main(["compare", str(app), "--seeds", "1", "--num-supernodes", "2", "--engine", "sequential",
                     "--jobs", "1", "--out", str(target), *extra])  # (2 jobs: b's run would finish, kept)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert code == 1 and "Traceback" not in err
    assert last.startswith("lips-flwr compare: ") and says in last
    assert case != "result without identity" or "a-seed1.json' is a damaged result file: no identity" in err
    if not made_before:  # a refused invocation leaves no empty out/ nor runs/
        assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["result without identity", "old-style result"])
def test_recompute_gets_past_a_damaged_or_old_style_result_file(tmp_path, capsys, case):
    pytest.importorskip("matplotlib")
    app = make_app(tmp_path / "app", lips=True, rounds=2)
    out = tmp_path / "out"
    USER_ERRORS[case][0](app, out, None)
    code = cli.main(["compare", str(app), "--seeds", "1", "--num-supernodes", "2", "--engine", "sequential",
                     "--out", str(out), "--recompute"])
    assert code == 0, capsys.readouterr().err
    assert read_result(out / "runs" / "a-seed1.json").observed["rounds"]


def test_ctrl_c_says_how_to_continue_and_exits_130(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")  # (without it the CLI stops at once, exit 2, naming the extra)
    from lips_flwr.experiments import compare

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "run_compare", stopped)
    code = cli.main(["compare", str(tmp_path), "--seeds", "1", "--num-supernodes", "2",
                     "--out", str(tmp_path / "out")])
    assert code == 130
    assert capsys.readouterr().err.strip() == "lips-flwr compare: stopped; run the same command to continue"


# --------------------------------------------------------------------------- what LIPS did


def test_the_report_shows_each_arms_mask_rounds_tau_and_masked_fraction_per_layer_group(tmp_path):
    """Neither report.md nor the curves said when arm B masked, how much, or in which layers."""
    pytest.importorskip("matplotlib")
    from lips_flwr.experiments.compare.report import mark_mask_rounds, write_report

    results = write_runs(tmp_path, {1: [0.5] * 6, 2: [0.5] * 6}, {1: [0.5] * 6, 2: [0.6] * 6})
    for seed in (1, 2):  # arm B masked in rounds 1 and 6 (every=5, tau0=0.5 decaying), as the runner records
        path = tmp_path / f"b-seed{seed}.json"
        data = json.loads(path.read_text())
        rounds = data["observed"]["rounds"]
        rounds["1"]["strategy"] = {"lips-mask-round": 1, "lips-tau": 0.5}
        rounds["1"]["zeros"] = {"first": 0.0, "middle": 0.5, "last": 0.0}
        rounds["6"]["strategy"] = {"lips-mask-round": 1, "lips-tau": 0.25}
        rounds["6"]["zeros"] = {"first": 0.0, "middle": 0.25 + 0.01 * seed, "last": 0.0}
        rounds["3"]["strategy"] = {"lips-mask-round": 0, "lips-tau": 0.0}
        path.write_text(json.dumps(data))
        results[f"b-seed{seed}"] = read_result(path)
    comparison = Comparison(tmp_path, (1, 2), last=2)
    summary = summarize(comparison, results)
    assert summary["lips"]["a"]["mask_rounds"] == [] and summary["lips"]["b"]["mask_rounds"] == [1, 6]
    assert summary["lips"]["b"]["rounds"]["6"] == {"tau": 0.25, "runs": 2, "zeros": {
        "first": 0.0, "middle": pytest.approx(0.265), "last": 0.0}}
    assert summary["lips"]["b"]["in_endpoint_window"] == [6]  # the last 2 evaluated rounds: 5 and 6
    write_report(comparison, summary, results, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "## What LIPS did" in text and "- arm A: no mask round (nothing masked)." in text
    assert "- arm B: mask rounds 1, 6 (over its 2 runs)." in text
    assert "  | 6 | 0.2500 | 2 | 0.000 | 0.265 | 0.000 |" in text
    assert "Mask rounds 6 fall inside the endpoint window (the last 2 evaluated rounds)" in text
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    mark_mask_rounds(ax, summary)
    marks = sorted(line.get_xdata()[0] for line in ax.get_lines() if len(line.get_xdata()) == 2)
    assert marks == [1, 6] and "LIPS mask rounds (B)" in [line.get_label() for line in ax.get_lines()]
    plt.close(fig)


def test_the_committed_quick_comparison_still_reads_with_its_mask_rounds():
    """Result files written before the runner kept the strategy's metrics: their app records tell."""
    from unit_paths import REPO

    from lips_flwr.experiments.compare.report import report_text

    folder = REPO / "docs" / "results" / "compare-quick"
    written = json.loads((folder / "summary.json").read_text())
    seeds = tuple(written["seeds"])
    results = {f"{arm}-seed{s}": read_result(folder / "runs" / f"{arm}-seed{s}.json") for arm in "ab"
               for s in seeds}
    comparison = Comparison(folder, seeds, metric=written["metric"], last=written["last"],
                            run_config=written["run_config"], num_nodes=written["num_nodes"])
    summary = summarize(comparison, results)
    assert summary["differences"] == pytest.approx(written["differences"])
    assert summary["lips"]["a"]["mask_rounds"] == []
    assert summary["lips"]["b"]["mask_rounds"][:2] == [1, 6]
    assert summary["lips"]["b"]["rounds"]["1"]["zeros"] is None
    assert "(not recorded)" in report_text(comparison, summary)


# --------------------------------------------------------------------------- a report a newcomer reads right


def test_the_report_reads_right_to_a_newcomer(tmp_path, monkeypatch):
    """The title was the folder's name, the 2-seed CI a bare interval, the inertia line said no numbers."""
    pytest.importorskip("matplotlib")
    from lips_flwr.experiments.compare import report as compare_report

    results = write_runs(tmp_path, {1: [0.5, 0.6, 0.6, 0.7, 0.7, 0.7], 2: [0.5, 0.6, 0.6, 0.7, 0.7, 0.71]},
                         {1: [0.5, 0.6, 0.6, 0.7, 0.7, 0.9], 2: [0.5, 0.6, 0.6, 0.7, 0.7, 0.72]})
    for name in results:  # the app's name, as the runner's identity holds it (from its pyproject.toml)
        path = tmp_path / f"{name}.json"
        data = json.loads(path.read_text())
        data["identity"]["app"] = {"name": "my-flower-app", "digest": "x"}
        path.write_text(json.dumps(data))
        results[name] = read_result(path)
    comparison = Comparison(tmp_path / "some-folder", (1, 2), last=1)
    summary = summarize(comparison, results)
    figures = []
    monkeypatch.setattr(compare_report, "write_bytes_atomic", lambda path, data: None)
    real_save = compare_report._save
    monkeypatch.setattr(compare_report, "_save", lambda plt, fig, path: (figures.append(fig.axes[0]
                                                                                        .get_xticks()),
                                                                         real_save(plt, fig, path)))
    compare_report.write_report(comparison, summary, results, tmp_path)
    text = compare_report.report_text(comparison, summary)
    assert text.startswith("# Does it help? `my-flower-app`: B vs A over 2 paired seeds")
    assert "- endpoint: one number per run, the mean of its last 1 evaluated rounds of the clients'" in text
    assert "**2 seeds cannot bound the effect**" in text and "95% CI [" not in text
    assert "(paired t-test over 2 seeds at 95%, with the exact sign test beside it: *B better* when" in text
    assert "Inertia (arm A): not measured: it needs 16 rounds or more; this run has 6" in text
    assert all(float(t).is_integer() for ticks in figures for t in ticks)  # integer round ticks


def test_round_ticks_are_integers(tmp_path, monkeypatch):
    """Two rounds got ticks at 1.0, 1.2, ... 2.0."""
    pytest.importorskip("matplotlib")
    from lips_flwr.experiments.compare import report as compare_report

    steps = {"first.weight": [0.1, 0.1], "mid.weight": [0.1, 0.1], "last.weight": [0.1, 0.1]}
    results = write_runs(tmp_path, {1: [0.5, 0.6], 2: [0.5, 0.7]}, {1: [0.5, 0.7], 2: [0.5, 0.8]},
                         steps=steps)
    summary = summarize(Comparison(tmp_path, (1, 2), last=1), results)
    ticks = []
    monkeypatch.setattr(compare_report, "_save",
                        lambda plt, fig, path: (ticks.append(fig.axes[0].get_xticks()), plt.close(fig)))
    compare_report.plot_curves(summary, results, tmp_path / "c.png")
    compare_report.plot_inertia(summary, results, tmp_path / "i.png")
    assert len(ticks) == 2 and all(float(t).is_integer() for found in ticks for t in found)


# --------------------------------------------------------------------------- the ServerApp's metrics


def test_the_serverapps_own_evaluation_is_a_metric_too_and_the_report_says_so(tmp_path):
    """An app that measures accuracy with evaluate_fn: --metric accuracy failed, after every run."""
    pytest.importorskip("matplotlib")
    from lips_flwr.experiments.compare.report import report_text

    results = write_runs(tmp_path, {1: [0.5, 0.6], 2: [0.5, 0.6]}, {1: [0.5, 0.6], 2: [0.5, 0.6]})
    for name, result in list(results.items()):
        data = json.loads(result.path.read_text())
        for r, entry in data["observed"]["rounds"].items():
            accuracy = 0.1 * int(r) + (0.05 if name[0] == "b" else 0)
            entry["server_evaluate"] = {"metrics": {"accuracy": accuracy}}
        data["observed"]["rounds"]["0"] = {"server_evaluate": {"metrics": {"accuracy": 0.0}}}
        result.path.write_text(json.dumps(data))
        results[name] = read_result(result.path)
    comparison = Comparison(tmp_path, (1, 2), metric="accuracy", last=2)
    summary = summarize(comparison, results)
    assert summary["metric_source"] == "server" and summary["endpoint_a"] == pytest.approx([0.15, 0.15])
    assert summary["differences"] == pytest.approx([0.05, 0.05])  # (round 0, the initial model, left out)
    text = report_text(comparison, summary)
    assert "the ServerApp's own evaluate metric `accuracy` (its `evaluate_fn`)" in text
    clients = summarize(Comparison(tmp_path, (1, 2), last=2), results)
    assert clients["metric"] == "acc" and clients["metric_source"] == "clients"  # the clients' acc first


@pytest.mark.slow
def test_an_unknown_metric_is_refused_after_the_first_evaluated_round_of_the_first_run(tmp_path, capsys):
    """It was found only after every run of the sweep had finished."""
    pytest.importorskip("matplotlib")
    app = make_app(tmp_path / "app", lips=True, rounds=4)
    code = cli.main(["compare", str(app), "--seeds", "1,2", "--num-supernodes", "2", "--engine", "sequential",
                     "--jobs", "1", "--metric", "nosuch", "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.strip().splitlines()[-1] == (
        "lips-flwr compare: evaluate metric 'nosuch' is in no round of ['a-seed1']; the clients report "
        "['loss', 'accuracy', 'num-examples']")
    assert "[a-seed1] round 2" in captured.out and "[a-seed1] round 4" not in captured.out
    assert "[b-seed1] started" not in captured.out
    assert not (tmp_path / "out" / "runs" / "a-seed1.json").exists()


def test_the_python_api_takes_the_node_count_flwr_run_would_use(tmp_path, monkeypatch):
    """``Comparison`` defaulted to 10 nodes where the CLI (and the docs) take ``flwr run``'s count."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))  # (no Flower config of the user's)
    app = make_app(tmp_path / "app", lips=True)
    assert {spec.num_nodes for spec in Comparison(app, (1, 2)).specs()} == {2}  # Flower's default
    assert Comparison(app, (1,)).nodes()[1].startswith("Flower's default")
    assert {spec.num_nodes for spec in Comparison(app, (1,), num_nodes=5).specs()} == {5}


def test_the_metric_watch_takes_a_metric_that_only_some_clients_report(tmp_path):
    """It checked the lowest node's first reply's keys only, and refused what summarize would read."""
    from lips_flwr.experiments.compare.metric import MetricWatch

    partial = observed([0.5], keys=("loss", "acc", "n"))
    partial["rounds"]["1"]["evaluate"]["metrics"]["rare"] = 0.25  # (another client's reply has it)
    (tmp_path / "observed.json").write_text(json.dumps(partial))
    lines: list[str] = []
    MetricWatch("rare", "a-seed1", tmp_path, lines.append)("[a-seed1] round 2/2")  # (round 1 is before it)
    assert lines == ["[a-seed1] round 2/2"]
    with pytest.raises(ConfigError, match="'nosuch' is in no round"):
        MetricWatch("nosuch", "a-seed1", tmp_path, lines.append)("[a-seed1] round 2/2")


def test_the_metric_watch_checks_the_rounds_before_its_line_whenever_it_reads_the_file(tmp_path):
    """The file is read when a line arrives: a run that went on meanwhile had evaluated the line's round
    already, and the sweep stopped a line sooner (a race compare's end-to-end test lost now and then)."""
    from lips_flwr.experiments.compare.metric import MetricWatch

    (tmp_path / "observed.json").write_text(json.dumps(observed([0.5, 0.6])))  # rounds 1 and 2 evaluated
    lines: list[str] = []
    watch = MetricWatch("nosuch", "a-seed1", tmp_path, lines.append)
    watch("[a-seed1] round 1/4")  # round 1's evaluation came after this line: not checked yet
    assert not watch.checked and lines == ["[a-seed1] round 1/4"]
    with pytest.raises(ConfigError, match="'nosuch' is in no round of \\['a-seed1'\\]"):
        watch("[a-seed1] round 2/4")
    assert watch.checked


def test_a_second_compare_into_a_folder_in_use_is_refused_before_it_deletes_anything(tmp_path, capsys):
    """It removed the running sweep's report, and a result file under --recompute, before the lock refused it."""
    pytest.importorskip("matplotlib")  # (without it the CLI stops at once, exit 2, naming the extra)
    from lips_flwr.experiments.runner.store import SweepLock

    app = make_app(tmp_path / "app", lips=True, rounds=2)
    out = tmp_path / "out"
    _old_style_result(out)  # (--recompute removes it before the sweep)
    for name in ("summary.json", "report.md"):
        (out / name).write_text("the running sweep's")
    kept = sorted(p for p in out.rglob("*"))
    with SweepLock(out / "runs"):
        code = cli.main(["compare", str(app), "--seeds", "1", "--num-supernodes", "2", "--engine",
                         "sequential", "--jobs", "1", "--recompute", "--out", str(out)])
        assert sorted(p for p in out.rglob("*") if p.name != ".sweep.lock") == kept
    err = capsys.readouterr().err
    assert code == 1 and "in use by another sweep" in err.strip().splitlines()[-1]
    assert (out / "report.md").read_text() == "the running sweep's"


@pytest.mark.slow
def test_an_app_without_lips_stops_the_runs_beside_it_at_once_with_two_jobs(tmp_path, capsys):
    """With --jobs 2, b-seed1 ran to its end (here 30 rounds of 0.4 s) before the user saw the fix."""
    pytest.importorskip("matplotlib")
    app = make_app(tmp_path / "app", lips=False, rounds=30)
    out = tmp_path / "out"
    code = cli.main(["compare", str(app), "--seeds", "1", "--num-supernodes", "2", "--engine", "sequential",
                     "--jobs", "2", "--run-config", "sleep=0.2", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1 and "builds no LIPS strategy" in captured.err.strip().splitlines()[-1]
    assert "[a-seed1] failed, as every run of this app and settings would: stopping the running runs now, " \
           "their progress kept (b-seed1)" in captured.out
    assert "[b-seed1] round 30" not in captured.out and not (out / "runs" / "b-seed1.json").exists()
    assert (out / "runs" / ".staging" / "b-seed1" / "identity.json").exists()  # (kept, to continue)


def test_a_failure_every_run_would_meet_is_told_from_a_runs_own():
    from lips_flwr.experiments.runner.sweep import app_failure
    from lips_flwr.experiments.runner.worker import NO_LIPS

    config = "Traceback (most recent call last):\n  ...\nlips_flwr.errors.ConfigError: tau0 must be in [0, 1)\n"
    assert app_failure(("failed", f"RunFailed: {NO_LIPS}", "...", None))
    assert app_failure(("failed", "ConfigError: tau0 must be in [0, 1)", config, None))
    assert not app_failure(("failed", "RuntimeError: boom", "...\nRuntimeError: boom\n", "client error"))
    assert not app_failure(("failed", "ConfigError: x", "...\nmyapp.ConfigError: x\n", None))  # (the app's own)
    assert not app_failure(None) and not app_failure(("done",))
