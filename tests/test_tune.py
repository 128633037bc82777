"""The Ray Tune integration on a real local Ray with 2 CPUs: real trials train small MLPs on a synthetic task, call
warm_start, save model.pt checkpoints, and KeeperCallback registers them through the real keeper service, run
with the shipped defaults (only the zoo's place and a namespace of its own per test are set). Ray starts once."""

from __future__ import annotations

import os
import tempfile
import uuid

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


def _service(tmp_path) -> dict:
    return {"zoo": str(tmp_path / "zoo"), "namespace": f"tune-{uuid.uuid4().hex[:8]}"}


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
                tune.report({"accuracy": accuracy, "parent": result.parent or "",
                             "score": result.score}, checkpoint=tune.Checkpoint.from_directory(d))
    return trainable


class RecordingCallback(KeeperCallback):
    """KeeperCallback that keeps the experiment's Trial objects for the test to replay hooks."""

    def on_experiment_end(self, trials, **info):
        super().on_experiment_end(trials, **info)
        self.trials = list(trials)


def _tuner(service, tmp_path, widths: list[list[int]], callback, concurrent: int = 1, name: str = "exp",
           extra: dict | None = None, scheduler=None) -> tune.Tuner:
    space = {"widths": tune.grid_search(widths), **(extra or {})}
    return tune.Tuner(_trainable(service), param_space=space,
                      tune_config=tune.TuneConfig(max_concurrent_trials=concurrent, scheduler=scheduler,
                                                  metric="accuracy" if scheduler else None,
                                                  mode="max" if scheduler else None),
                      run_config=tune.RunConfig(name=name, storage_path=str(tmp_path / "results"),
                                                callbacks=[callback], verbose=0))


def _registers(service) -> int:
    from keeper.actors.launcher import find

    return ray.get(find(service).stats.remote(), timeout=30)["registers"]


@pytest.mark.slow  # > 20 s on two idle cores
def test_four_sequential_trials_warm_from_their_predecessors_and_nothing_registers_twice(tmp_path):
    service = _service(tmp_path)
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
    from keeper.stored import WEIGHTS_EXTRA

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


def test_errored_trial_is_not_registered_and_restore_resumes_cleanly(tmp_path):
    service = _service(tmp_path)
    marker = tmp_path / "fail-once"
    cb = KeeperCallback(metric="accuracy", mode="max", config=service)

    def trainable(config):
        if config["widths"] == [32, 32] and not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError("this trial fails on purpose")
        return _trainable(service)(config)

    tuner = tune.Tuner(trainable, param_space={"widths": tune.grid_search([[64, 32], [32, 32]])},
                       tune_config=tune.TuneConfig(max_concurrent_trials=1),
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


def test_trials_suggested_by_a_search_algorithm_warm_and_register(tmp_path):
    from ray.tune.search import ConcurrencyLimiter

    service = _service(tmp_path)
    cb = KeeperCallback(metric="accuracy", mode="max", config=service)
    grid = tune.Tuner(_trainable(service),
                      tune_config=tune.TuneConfig(search_alg=ConcurrencyLimiter(WidenTheBest(), max_concurrent=1),
                                                  num_samples=3),
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


def test_two_concurrent_trials_both_warm(tmp_path):
    service = _service(tmp_path)
    seed = KeeperCallback(metric="accuracy", mode="max", config=service)
    _tuner(service, tmp_path, [[64, 32]], seed, name="seed").fit()
    assert len(Zoo(service["zoo"])) == 1
    cb = KeeperCallback(metric="accuracy", mode="max", config=service, wait_for_registration=False)
    grid = _tuner(service, tmp_path, [[64, 48], [80, 32]], cb, concurrent=2, name="pair").fit()
    assert not grid.errors
    assert all(p for p in grid.get_dataframe()["parent"]), "both concurrent trials inherit from the seed model"
    assert len(Zoo(service["zoo"])) == 3


def test_asha_stopped_trials_are_registered_with_their_metric(tmp_path):
    from ray.tune.schedulers import ASHAScheduler

    service = _service(tmp_path)
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
    from keeper.selection import ParentChoice
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
                        lambda trainable=None, given=None: (state, latest, "checkpoint c of t"))
    module = build(_spec([32]))
    exported = export_graph(module, example_input(_spec([32])))
    result, failed = start._restore_checkpoint(module, exported, ParentChoice(None, 0.0, uri, 0.0, 0), 0.0, None)
    assert not failed and result.parent == "checkpoint c of t" and result.preserved, (failed, result)


def test_warm_start_outside_a_service_says_how_to_start_one(tmp_path):
    spec = _spec([16])
    with pytest.raises(KeeperError, match="KeeperCallback"):
        warm_start(build(spec), example_input(spec), config={"namespace": "nobody-here"})


def _train_loop(config: dict) -> None:
    """One Ray Train worker: a model whose initial weights differ per rank, warm_start, then every rank's
    weights compared on rank 0 (all-gathered), and rank 0's checkpoint reported."""
    import ray.train
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(100 + rank)  # unequal inits: equal weights afterwards prove the broadcast
    spec = _spec(config["widths"])
    model = build(spec)
    result = warm_start(model, example_input(spec), config=config["service"])
    flat = torch.cat([t.detach().flatten() for t in model.state_dict().values()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    metrics = {"accuracy": 0.5 + 0.01 * len(config["widths"]), "same": same, "parent": result.parent or ""}
    if rank == 0:
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
    else:
        ray.train.report(metrics)


@pytest.mark.slow  # > 20 s on two idle cores
def test_a_ray_train_trial_warms_once_and_every_worker_gets_the_same_weights(tmp_path):
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    service = _service(tmp_path)
    storage = str(tmp_path / "train")

    def trial(config):
        trainer = TorchTrainer(_train_loop, train_loop_config={**config, "service": service},
                               # two workers and this trial's own 0.01 CPU fit a 2-CPU Ray with keeper beside them
                               scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                               run_config=ray.train.RunConfig(name=f"train-{tune.get_context().get_trial_id()}",
                                                              storage_path=storage))
        result = trainer.fit()
        tune.report(dict(result.metrics), checkpoint=result.checkpoint)

    cb = KeeperCallback(metric="accuracy", mode="max", config=service)
    tuner = tune.Tuner(tune.with_resources(trial, {"CPU": 0.01}),
                       param_space={"widths": tune.grid_search([[64, 32], [64, 48]])},
                       tune_config=tune.TuneConfig(max_concurrent_trials=1),
                       run_config=tune.RunConfig(name="train", storage_path=str(tmp_path / "results"),
                                                 callbacks=[cb], verbose=0))
    grid = tuner.fit()
    assert not grid.errors
    rows = grid.get_dataframe().sort_values("trial_id")
    assert list(rows["same"]) == [True, True], "every worker ends with rank 0's weights"
    assert list(rows["parent"])[0] == "" and list(rows["parent"])[1], "the second trial inherits from the first"
    # one parent choice per trial, not one per worker (the choice is the front door's only query here)
    from keeper.actors.launcher import find

    assert ray.get(find(service).stats.remote(), timeout=30)["queries"] == 2
    # one template per architecture in the zoo's store (Tune copies the run's checkpoint into its own trial
    # directory, so the callback finds the template from the checkpoint's state_dict), and both trials registered
    assert len(list((tmp_path / "zoo" / "templates").glob("*.onnx"))) == 2
    assert len(cb.registered) == 2 and len(Zoo(service["zoo"])) == 2, cb.outcomes


class KillsTheManagerMidRun(KeeperCallback):
    """Kills the ZooManager (SIGKILL) when the second trial completes, before that trial is registered."""

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.completed = getattr(self, "completed", 0) + 1
        if self.completed == 2:
            from keeper.actors.launcher import find

            self.killed = ray.get(find(self.config).manager_pid.remote(), timeout=30)
            os.kill(self.killed, 9)
        super().on_trial_complete(iteration, trials, trial, **info)


def test_a_manager_killed_mid_run_loses_nothing(tmp_path):
    service = _service(tmp_path)
    cb = KillsTheManagerMidRun(metric="accuracy", mode="max", config=service)
    grid = _tuner(service, tmp_path, [[64, 32], [64, 48], [96, 32], [64, 32, 32]], cb, concurrent=2,
                  name="kill").fit()
    assert not grid.errors and cb.killed
    from keeper.actors.launcher import find

    assert ray.get(find(service).manager_pid.remote(), timeout=60) != cb.killed
    assert len(cb.registered) == 4 and len(Zoo(service["zoo"])) == 4, cb.outcomes
    assert sum(1 for p in grid.get_dataframe()["parent"] if p) >= 2


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


# ------------------------------------------------------------------------------- frameworks' checkpoint layouts

def _lightning_loop(config: dict) -> None:
    """One Ray Train worker training a LightningModule with ray.train.lightning; warm_start on its network."""
    import json

    import lightning.pytorch as pl
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    torch.set_num_threads(1)
    module = _lightning_module(config["width"])
    warm = warm_start(module.net, torch.zeros(1, 8), config=config["service"], noise=0.0)
    with open(config["report"], "w") as f:  # what the warm start chose, for the test to read
        json.dump({"parent": warm.parent, "reason": warm.reason}, f)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), batch_size=64)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", strategy=RayDDPStrategy(),
                         plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    prepare_trainer(trainer).fit(module, data, data)


def _lightning_module(width: int):
    import lightning.pytorch as pl

    class Classifier(pl.LightningModule):
        def __init__(self, width: int):
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

        def validation_step(self, batch, _):
            self.log("accuracy", (self(batch[0]).argmax(-1) == batch[1]).float().mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Classifier(width)


def test_a_lightning_module_under_ray_train_in_a_tune_trial_is_warmed_and_its_ckpt_registered(tmp_path):
    """ray.train.lightning inside a Tune trial: warm_start on the LightningModule's network in the Train worker
    inherits from a model already in the zoo, and the callback registers Lightning's checkpoint.ckpt (its state_dict
    under the attribute prefix 'net.'), the architecture found in the zoo's store."""
    pytest.importorskip("lightning")
    import json

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    from keeper.torch_support import register

    service, report = _service(tmp_path), str(tmp_path / "warm.json")
    register(_lightning_module(16).net, torch.zeros(1, 8), Zoo(service["zoo"]), 0.6, "lit-parent")

    def trial(config):
        trainer = TorchTrainer(_lightning_loop, train_loop_config={**config, "service": service, "report": report},
                               scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
                               run_config=ray.train.RunConfig(name=f"lit-{tune.get_context().get_trial_id()}",
                                                              storage_path=str(tmp_path / "train")))
        result = trainer.fit()
        tune.report(dict(result.metrics), checkpoint=result.checkpoint)

    cb = KeeperCallback(metric="accuracy", mode="max", config=service)
    grid = tune.Tuner(tune.with_resources(trial, {"CPU": 0.01}), param_space={"width": 32},
                      run_config=tune.RunConfig(name="lit", storage_path=str(tmp_path / "results"), callbacks=[cb],
                                                verbose=0)).fit()
    assert not grid.errors
    with open(report) as f:
        assert json.load(f)["parent"] == "lit-parent"
    (tid,) = cb.models
    zoo = Zoo(service["zoo"])
    assert cb.outcomes[tid] == f"registered as {cb.models[tid]}" and len(zoo) == 2, cb.outcomes
    (ckpt,) = (tmp_path / "results").rglob("checkpoint.ckpt")
    trained = torch.load(ckpt, weights_only=True)["state_dict"]
    stored = zoo.store.get_extra(cb.models[tid], "weights.safetensors")
    from keeper.weights import open_weights

    assert sorted(float(torch.as_tensor(v).sum()) for v in open_weights(stored).values()) == pytest.approx(
        sorted(float(v.sum()) for v in trained.values()), rel=1e-6), "the registered weights are the .ckpt's"


def test_checkpoints_keeper_cannot_read_whole_reach_the_zoo_never_and_repeated_weights_are_recorded(tmp_path):
    """register_trial (the callback's task, called here directly against the real service): each bad input is one
    line naming the file and leaves the zoo as it was; the same weights registered by a second trial are recorded
    on the stored model instead of refused."""
    import pyarrow.fs as pafs
    from ray.train import Checkpoint

    from keeper.actors import start
    from keeper.torch_support.templates import architecture_template
    from keeper.torch_support.export import export_graph
    from keeper.tune_integration.checkpoint import register_trial

    service = _service(tmp_path)
    handle = start(service)
    spec = _spec([16])
    model = build(spec)
    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    (trial_dir / ARCHITECTURE_FILE).write_bytes(
        architecture_template(export_graph(model, example_input(spec)), model.state_dict()))

    def register(files: dict, name: str, accuracy: float = 0.5) -> dict:
        d = tmp_path / f"ckpt-{name}"
        d.mkdir()
        for file, content in files.items():
            (d / file).parent.mkdir(exist_ok=True)
            torch.save(content, d / file) if not isinstance(content, bytes) else (d / file).write_bytes(content)
        return register_trial(handle, Checkpoint.from_directory(str(d)), pafs.LocalFileSystem(), str(trial_dir),
                              accuracy, name, None, {}, 60, service["zoo"])

    other = build(_spec([16])).state_dict()
    bad = {"two-files": ({"model.pt": model.state_dict(), "pytorch_model.bin": other},
                         "pytorch_model.bin and model.pt hold different"),
           "no-state-dict": ({"checkpoint.ckpt": {"epoch": 1}}, "checkpoint.ckpt"),
           "refused-pickle": ({"model.pt": {"state_dict": model.state_dict(), "payload": _Payload()}}, "model.pt"),
           "extra-key": ({"model.pt": {**model.state_dict(), "head2.weight": torch.zeros(2)}}, "'head2.weight'")}
    for name, (files, named) in bad.items():
        with pytest.raises(KeeperError) as info:
            register(files, name)
        assert named in str(info.value) and "\n" not in str(info.value), (name, info.value)
        assert len(Zoo(service["zoo"])) == 0, name
    first = register({"model.pt": model.state_dict()}, "exp1-t0", 0.6)
    again = register({"model.pt": model.state_dict()}, "exp2-t0", 0.7)
    assert first["name"] == again["name"] == "exp1-t0" and again["accuracy"] == 0.7 and len(Zoo(service["zoo"])) == 1
    assert again["summary"]["trained"] == 2 and again["summary"]["again"][0]["name"] == "exp2-t0"


class _Payload:
    """What ``torch.load(weights_only=True)`` refuses to unpickle (it could run code)."""

    def __reduce__(self):
        return (os.getcwd, ())
