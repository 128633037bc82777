"""The Ray Tune integration on a real local Ray with 2 CPUs: real trials train small MLPs on a synthetic task, call
warm_start, save model.pt checkpoints, and KeeperCallback registers them through the real keeper service, run
with the shipped defaults (only the zoo's place and a namespace of its own per test are set). Ray starts once, and
the trials of an experiment reuse their actors (``reuse_actors=True``, Tune's setting for many short trials: a
process imports torch and keeper once, not once per trial), except where a test depends on each trial starting
in a fresh process, as the README's Tune example runs them. Trials under Ray Train and Lightning, and the
frameworks' checkpoint layouts: tests/test_frameworks.py."""

from __future__ import annotations

import os
import tempfile

import pytest
import ray
import torch
from ray import tune

from keeper.errors import ConfigError, KeeperError
from keeper.tune_integration import ARCHITECTURE_FILE, KeeperCallback, warm_start
from keeper.tune_integration.checkpoint import checkpoint_onnx
from keeper.zoo import Zoo

# starts Ray on loopback once (conftest's local_ray); `-m "not ray"` leaves these out
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]


def _spec(widths: list[int]) -> dict:
    """A trial's architecture, as Tune's config holds it: an MLP's hidden widths."""
    return {"widths": list(widths)}


def build(spec: dict) -> torch.nn.Module:
    """The MLP of ``spec`` over 40-sample signals, 10 classes; deterministic given ``torch.manual_seed``."""
    layers, width = [torch.nn.Flatten()], 40
    for w in spec["widths"]:
        layers += [torch.nn.Linear(width, w), torch.nn.ReLU()]
        width = w
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def example_input(spec: dict) -> torch.Tensor:
    return torch.randn(2, 1, 40)


def _train(model: torch.nn.Module, steps: int, seed: int) -> float:
    """``steps`` of Adam on a fixed synthetic 10-class task (a signal's label: its largest of 10 fixed random
    projections), batches drawn by ``seed``; returns the accuracy on the task's held-out fifth."""
    data = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 1, 40, generator=data)
    y = (x.flatten(1) @ torch.randn(40, 10, generator=data)).argmax(1)
    draw = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        batch = torch.randint(0, 800, (128,), generator=draw)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        opt.step()
    with torch.no_grad():
        return (model(x[800:]).argmax(1) == y[800:]).float().mean().item()


def _trainable(service: dict):
    def trainable(config: dict) -> None:
        torch.set_num_threads(1)
        if config.get("fail"):
            raise RuntimeError("this trial fails on purpose")
        spec = _spec(config["widths"])
        model = build(spec)
        result = warm_start(model, example_input(spec), config=service, noise=0.0)
        for step in range(config.get("reports", 1)):
            accuracy = _train(model, steps=30, seed=step)
            with tempfile.TemporaryDirectory() as d:
                torch.save(model.state_dict(), os.path.join(d, "model.pt"))
                tune.report({"accuracy": accuracy, "parent": result.parent or "", "score": result.score,
                             "reason": result.reason}, checkpoint=tune.Checkpoint.from_directory(d))
    return trainable


class RecordingCallback(KeeperCallback):
    """KeeperCallback that keeps the experiment's Trial objects for the test to replay hooks."""

    def on_experiment_end(self, trials, **info):
        super().on_experiment_end(trials, **info)
        self.trials = list(trials)


def _tuner(service, tmp_path, widths: list[list[int]], callback, concurrent: int = 1, name: str = "exp",
           extra: dict | None = None, scheduler=None, reuse: bool = True) -> tune.Tuner:
    space = {"widths": tune.grid_search(widths), **(extra or {})}
    return tune.Tuner(_trainable(service), param_space=space,
                      tune_config=tune.TuneConfig(max_concurrent_trials=concurrent, scheduler=scheduler,
                                                  metric="accuracy" if scheduler else None,
                                                  mode="max" if scheduler else None, reuse_actors=reuse),
                      run_config=tune.RunConfig(name=name, storage_path=str(tmp_path / "results"),
                                                callbacks=[callback], verbose=0))


def _registers(service) -> int:
    from keeper.actors.launcher import find

    return ray.get(find(service).stats.remote(), timeout=30)["registers"]


@pytest.mark.slow  # > 20 s on two idle cores
def test_four_sequential_trials_warm_from_their_predecessors_and_nothing_registers_twice(service, tmp_path):
    cb = RecordingCallback(metric="accuracy", mode="max", config=service)
    widths = [[64, 32], [64, 48], [96, 32], [64, 32, 32]]
    grid = _tuner(service, tmp_path, widths, cb).fit()
    assert not grid.errors
    rows = grid.get_dataframe()
    rows = rows.sort_values("trial_id")
    parents = list(rows["parent"])
    assert parents[0] == "", "the first trial has nothing to inherit from"
    assert all(p for p in parents[1:]), f"every later trial is warmed: {parents}"
    assert all(s > 0.3 for s in rows["score"][1:])
    zoo = Zoo(service["zoo"])
    assert len(zoo) == 4 and len(cb.registered) == 4
    # trials' state_dicts are registered as a graph plus safetensors weights: no weight goes through ONNX
    from keeper.store.stored import WEIGHTS_EXTRA

    assert all(WEIGHTS_EXTRA in r.extra_checksums for r in zoo.store.records())
    # every trial directory holds the architecture template the callback read
    for trial in cb.trials:
        assert trial.storage.storage_filesystem.get_file_info(
            f"{trial.storage.trial_fs_path}/{ARCHITECTURE_FILE}").size > 0
    # the parents named are zoo models
    assert set(parents[1:]) <= set(zoo.names())
    # each trial is registered with how it was obtained (warm_start's lineage, read from the trial directory)
    lineages = [r.summary.get("lineage") for r in zoo.store.records()]
    assert all(lin is not None for lin in lineages), "every trial called warm_start, so every one has a lineage"
    assert sorted(lin["parent"] for lin in lineages if lin["parent"]) == sorted(parents[1:])
    assert all(lin["clean"] for lin in lineages), "MLPs widened and deepened from MLPs stay clean"

    before = _registers(service)
    restored = KeeperCallback(metric="accuracy", mode="max", config=service)
    restored.set_state(cb.get_state())
    for trial in cb.trials:
        restored.on_trial_complete(0, cb.trials, trial)
    restored.on_experiment_end(cb.trials)  # registrations run in the registrar; the experiment's end waits for them
    assert _registers(service) == before, "a restored callback registers no trial again"
    fresh = KeeperCallback(metric="accuracy", mode="max", config=service)
    fresh.on_trial_complete(0, cb.trials, cb.trials[0])
    fresh.on_experiment_end(cb.trials)
    assert _registers(service) == before + 1, "without the state the same trial would be registered again"
    assert len(Zoo(service["zoo"])) == 4, "and the zoo stores identical content once"


def test_errored_trial_is_not_registered_and_restore_resumes_cleanly(service, tmp_path):
    marker = tmp_path / "fail-once"
    cb = KeeperCallback(metric="accuracy", mode="max", config=service)

    def trainable(config):
        if config["widths"] == [32, 32] and not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError("this trial fails on purpose")
        return _trainable(service)(config)

    tuner = tune.Tuner(trainable, param_space={"widths": tune.grid_search([[64, 32], [32, 32]])},
                       tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
                       run_config=tune.RunConfig(name="restore", storage_path=str(tmp_path / "results"),
                                                 callbacks=[cb], verbose=0))
    grid = tuner.fit()
    assert len(grid.errors) == 1
    assert len(Zoo(service["zoo"])) == 1 and len(cb.registered) == 1
    assert "errored" in cb.outcomes.values()
    before = _registers(service)

    path = str(tmp_path / "results" / "restore")
    again = tune.Tuner.restore(path, trainable, restart_errored=True)
    grid = again.fit()
    assert not grid.errors
    # only the rerun trial is new in the zoo; the one registered before was not sent again
    assert _registers(service) == before + 1
    assert len(Zoo(service["zoo"])) == 2


class WidenTheBest:
    """A minimal evolutionary search algorithm (a Tune Searcher): each suggestion widens the first layer of the
    best architecture finished so far, so every architecture is new and only known once a trial is done."""

    def __new__(cls):
        from ray.tune.search import Searcher

        class _Widen(Searcher):
            def __init__(self):
                super().__init__(metric="accuracy", mode="max")
                self.configs, self.best = {}, None

            def suggest(self, trial_id):
                base = self.best[1] if self.best else [48, 32]
                self.configs[trial_id] = {"widths": [base[0] + 8 * len(self.configs)] + base[1:]}
                return self.configs[trial_id]

            def on_trial_complete(self, trial_id, result=None, error=False):
                if result and not error and (self.best is None or result["accuracy"] > self.best[0]):
                    self.best = (result["accuracy"], self.configs[trial_id]["widths"])

        return _Widen()


def test_trials_suggested_by_a_search_algorithm_warm_and_register(service, tmp_path):
    from ray.tune.search import ConcurrencyLimiter

    cb = KeeperCallback(metric="accuracy", mode="max", config=service)
    grid = tune.Tuner(_trainable(service),
                      tune_config=tune.TuneConfig(search_alg=ConcurrencyLimiter(WidenTheBest(), max_concurrent=1),
                                                  num_samples=3, reuse_actors=True),
                      run_config=tune.RunConfig(name="searched", storage_path=str(tmp_path / "results"),
                                                callbacks=[cb], verbose=0)).fit()
    assert not grid.errors
    rows = grid.get_dataframe()
    # a searcher's trial ids are random; its suggestions grow the first layer, so order by that
    rows = rows.assign(first=[w[0] for w in rows["config/widths"]]).sort_values("first")
    assert rows["first"].is_unique, f"the searcher proposed three architectures: {list(rows['config/widths'])}"
    parents = list(rows["parent"])
    assert parents[0] == "" and all(parents[1:]), f"trials after the first are warmed: {parents}"
    assert len(Zoo(service["zoo"])) == 3 and len(cb.registered) == 3


def test_two_concurrent_trials_both_warm(service, tmp_path):
    from keeper.torch_support import register

    # a seed model in the zoo before the pair starts (how a finished trial reaches the zoo is checked above)
    seed = _spec([64, 32])
    register(build(seed), example_input(seed), Zoo(service["zoo"]), 0.5, "seed")
    assert len(Zoo(service["zoo"])) == 1
    cb = KeeperCallback(metric="accuracy", mode="max", config=service, wait_for_registration=False)
    grid = _tuner(service, tmp_path, [[64, 48], [80, 32]], cb, concurrent=2, name="pair").fit()
    assert not grid.errors
    assert all(p for p in grid.get_dataframe()["parent"]), "both concurrent trials inherit from the seed model"
    assert len(Zoo(service["zoo"])) == 3


def test_asha_stopped_trials_are_registered_with_their_metric(service, tmp_path):
    from ray.tune.schedulers import ASHAScheduler

    cb = KeeperCallback(metric="accuracy", mode="max", config=service)
    asha = ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)
    # sequential trials make ASHA's decisions independent of timing: the last, a 4-unit MLP, reaches rung 1
    # after two wide models have recorded there, and falls below their median
    grid = _tuner(service, tmp_path, [[64, 32], [48, 32], [4]], cb, concurrent=1, name="asha",
                  extra={"reports": 4}, scheduler=asha).fit()
    assert not grid.errors
    rows = grid.get_dataframe()
    iterations = dict(zip(rows["config/widths"].map(tuple), rows["training_iteration"]))
    assert iterations[(4,)] < 4, f"ASHA stops the narrow trial early: {iterations}"
    zoo = Zoo(service["zoo"])
    assert len(cb.registered) == 3 and len(zoo) == 3
    best = {r.name: r.accuracy for r in zoo}
    # each model's accuracy is its trial's best reported accuracy
    df = grid.get_dataframe(filter_metric="accuracy", filter_mode="max")
    assert sorted(round(a, 6) for a in best.values()) == sorted(round(a, 6) for a in df["accuracy"])


def _curve_trainable(service: dict, curves: list[list[float]]):
    """Trials of one architecture whose reported accuracies follow ``curves[index]`` (the curve the search rule
    reads); each trains a few steps per report, so every trial's weights are its own."""
    def trainable(config: dict) -> None:
        torch.set_num_threads(1)
        spec = _spec([40, 24])
        torch.manual_seed(config["index"])
        model = build(spec)
        result = warm_start(model, example_input(spec), config=service, noise=0.0)
        for step, accuracy in enumerate(curves[config["index"]]):
            _train(model, steps=5, seed=step)
            with tempfile.TemporaryDirectory() as d:
                torch.save(model.state_dict(), os.path.join(d, "model.pt"))
                tune.report({"accuracy": accuracy, "parent": result.parent or "", "reason": result.reason},
                            checkpoint=tune.Checkpoint.from_directory(d))
    return trainable


@pytest.mark.slow  # > 20 s on two idle cores
def test_a_search_restarts_a_parent_still_improving_but_not_one_it_holds_converged(service, tmp_path):
    curves = [[0.2, 0.4, 0.6, 0.8], [0.5, 0.9, 0.9, 0.9], [0.5, 0.85, 0.85, 0.85]]
    cb = KeeperCallback(metric="accuracy", mode="max", config=service)
    grid = tune.Tuner(_curve_trainable(service, curves), param_space={"index": tune.grid_search([0, 1, 2])},
                      tune_config=tune.TuneConfig(max_concurrent_trials=1),
                      run_config=tune.RunConfig(name="rule", storage_path=str(tmp_path / "results"),
                                                callbacks=[cb], verbose=0)).fit()
    assert not grid.errors and len(cb.registered) == 3, cb.outcomes
    rows = grid.get_dataframe().sort_values("trial_id")
    parents, reasons = list(rows["parent"]), list(rows["reason"])
    assert parents[0] == "" and "holds no model yet" in reasons[0]
    assert parents[1] == cb.models[rows["trial_id"].iloc[0]] and "still improving" in reasons[1], reasons[1]
    assert parents[2] == "" and "had converged in this search" in reasons[2], reasons[2]
    assert cb.models[rows["trial_id"].iloc[1]] in reasons[2], "the reason names the parent it withheld"
    trainings = {r.name: r.summary["lineage"]["training"] for r in Zoo(service["zoo"]).store.records()}
    assert [trainings[cb.models[t]]["improving"] for t in rows["trial_id"]] == [True, False, False]
    assert {t["search"] for t in trainings.values()} == {"rule"} and all(t["reports"] == 4 for t in trainings.values())


def test_callback_checks_its_arguments_and_checkpoints():
    with pytest.raises(ConfigError, match="score_fn"):
        KeeperCallback(metric="loss", mode="min")
    with pytest.raises(ConfigError, match="mode"):
        KeeperCallback(metric="accuracy", mode="best")
    with tempfile.TemporaryDirectory() as d:
        with pytest.raises(KeeperError, match="model.pt"):
            checkpoint_onnx(d, None, "trial t")
        torch.save({"not": "a state dict"}, os.path.join(d, "model.pt"))
        with pytest.raises(KeeperError, match="state_dict"):
            checkpoint_onnx(d, None, "trial t")
        spec = _spec([16])
        torch.save(build(spec).state_dict(), os.path.join(d, "model.pt"))
        with pytest.raises(KeeperError, match="architecture is unknown"):
            checkpoint_onnx(d, None, "trial t")
        blob = checkpoint_onnx(d, None, "trial t", lambda: (build(spec), example_input(spec)))
        zoo = Zoo(os.path.join(d, "zoo"))
        assert zoo.register(blob, 0.5, "from-builder").num_params == sum(p.numel() for p in build(spec).parameters())
        wrong = _spec([24])
        with pytest.raises(KeeperError, match="another architecture"):
            checkpoint_onnx(d, None, "trial t", lambda: (build(wrong), example_input(wrong)))


def test_a_checkpoint_older_than_its_trials_architecture_is_read_with_its_own(tmp_path, monkeypatch):
    """Population-based training may change a trial's width after a checkpoint: the template beside it is then the
    trial's latest architecture's, and both the callback and a trial restoring the checkpoint use the checkpoint's
    own, found in the zoo's store by its signature."""
    from keeper.choice.selection import ParentChoice
    from keeper.torch_support import start, trial
    from keeper.torch_support.export import export_graph
    from keeper.torch_support.templates import (
        architecture_template,
        save_template,
        template_apart,
    )
    from keeper.tune_integration.checkpoint import checkpoint_model

    old, new = _spec([16]), _spec([24])
    state = build(old).state_dict()
    torch.save(state, tmp_path / "model.pt")
    latest = architecture_template(export_graph(build(new), example_input(new)))
    own = architecture_template(export_graph(build(old), example_input(old)))
    with pytest.raises(KeeperError, match="another architecture"):
        checkpoint_model(str(tmp_path), latest, "trial t")
    graph, weights = checkpoint_model(str(tmp_path), latest, "trial t", find=lambda s: own)
    assert graph == template_apart(own, state)[0] and len(weights) == len(state)

    uri = str(tmp_path / "zoo")
    save_template(uri, own, state)
    monkeypatch.setattr(trial, "checkpoint_state",
                        lambda trainable=None, given=None: trial.TrialCheckpoint(state, latest, "checkpoint c of t"))
    module = build(_spec([32]))
    exported = export_graph(module, example_input(_spec([32])))
    result, failed = start._restore_checkpoint(module, exported, ParentChoice(None, 0.0, uri, 0.0, 0), 0.0, None)
    assert not failed and result.parent == "checkpoint c of t" and result.preserved, (failed, result)


def test_warm_start_outside_a_service_says_how_to_start_one(tmp_path):
    spec = _spec([16])
    with pytest.raises(KeeperError, match="KeeperCallback"):
        warm_start(build(spec), example_input(spec), config={"namespace": "nobody-here"})


class KillsTheManagerMidRun(KeeperCallback):
    """Kills the ZooManager (SIGKILL) when the second trial completes, before that trial is registered."""

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.completed = getattr(self, "completed", 0) + 1
        if self.completed == 2:
            from keeper.actors.launcher import find

            self.killed = ray.get(find(self.config).manager_pid.remote(), timeout=30)
            os.kill(self.killed, 9)
        super().on_trial_complete(iteration, trials, trial, **info)


def test_a_manager_killed_mid_run_loses_nothing(service, tmp_path):
    cb = KillsTheManagerMidRun(metric="accuracy", mode="max", config=service)
    # trials in fresh processes (Tune's default): a reused actor starts the next trial at once, before the killed
    # manager is back, and that trial starts cold
    grid = _tuner(service, tmp_path, [[64, 32], [64, 48], [96, 32], [64, 32, 32]], cb, concurrent=2,
                  name="kill", reuse=False).fit()
    assert not grid.errors and cb.killed
    from keeper.actors.launcher import find

    assert ray.get(find(service).manager_pid.remote(), timeout=60) != cb.killed
    assert len(cb.registered) == 4 and len(Zoo(service["zoo"])) == 4, cb.outcomes
    # the two trials started after the kill were answered by the service: warmed, or withheld by the rule because
    # their parent is below a cold trial's first report (these trials report once, so both can happen)
    rows = grid.get_dataframe().sort_values("trial_id")
    later = list(zip(rows["parent"], rows["reason"]))[2:]
    assert all(p or "first result" in why for p, why in later), later


def test_a_trial_lineage_file_is_read_as_json_and_a_malformed_one_refused(tmp_path):
    import pyarrow.fs as pafs

    from keeper.errors import AdmissionError
    from keeper.tune_integration.checkpoint import _read_lineage

    fs = pafs.LocalFileSystem()
    path = str(tmp_path / "keeper-lineage.json")
    assert _read_lineage(fs, path, "trial t") is None, "no file: the trial trained from its own init"
    (tmp_path / "keeper-lineage.json").write_text('{"parent": "p", "preserved": true, "structure": 1.0}')
    assert _read_lineage(fs, path, "trial t") == {"parent": "p", "preserved": True, "structure": 1.0}
    for bad in ("[1, 2]", "not json", "{" * 70000):
        (tmp_path / "keeper-lineage.json").write_text(bad)
        with pytest.raises(AdmissionError, match="trial t: .*keeper-lineage.json.*remove the file"):
            _read_lineage(fs, path, "trial t")


def test_a_choice_made_while_the_service_boots_waits_for_the_registration_noted_before_it(service):
    """The driver never waits for the service: it notes a trial's registration in Ray's key-value store and goes on.
    A trial that asks for its parent while the front door still boots (its call queued with the driver's) still
    waits for that registration, because the front door reads the notes at the choice."""
    import threading
    import time

    import keeper.actors as ka
    from keeper.actors import notices
    from keeper.actors.config import load_config
    from onnx_mlp import mlp_onnx

    cfg = load_config(service)
    handle = ka.start(service, wait=False)  # still booting: every call queues
    key = notices.announce(cfg.name, cfg.namespace, "first")
    assert [n.name for n in notices.arriving(cfg.name, cfg.namespace, 60.0)] == ["first"]
    t0 = time.monotonic()
    choice = handle.choose.remote(mlp_onnx([48, 16, 10], seed=2))

    def register_later():  # the registration lands a second after the service answers, as a checkpoint read late
        ray.get(handle.ping.remote(), timeout=120)
        time.sleep(1.0)
        ray.get(handle.register.remote(mlp_onnx([32, 16, 10], seed=1), 0.9, "first"), timeout=120)
        notices.withdraw(key, cfg.namespace)

    thread = threading.Thread(target=register_later)
    thread.start()
    chosen = ray.get(choice, timeout=120)
    thread.join()
    assert chosen.parent == "first", f"the choice waited for the noted registration: {chosen}"
    assert time.monotonic() - t0 >= 1.0
    assert notices.arriving(cfg.name, cfg.namespace, 60.0) == []
    # a note whose writer died is dropped once older than the reader's bound
    notices.announce(cfg.name, cfg.namespace, "lost")
    time.sleep(0.1)
    assert notices.arriving(cfg.name, cfg.namespace, 0.05) == []
    assert notices.arriving(cfg.name, cfg.namespace, 60.0) == []
    notices.set_cold_bar(cfg.name, cfg.namespace, "search-a", 0.75)
    assert notices.cold_bar(cfg.name, cfg.namespace, "search-a") == 0.75
    notices.clear_cold_bar(cfg.name, cfg.namespace, "search-a")
    assert notices.cold_bar(cfg.name, cfg.namespace, "search-a") is None
