"""Tune trials that train with the frameworks users train with, on a real local Ray with 2 CPUs: Ray Train workers
(TorchTrainer) inside a trial, a LightningModule under ray.train.lightning, and the checkpoint layouts the callback
reads (model.pt, pytorch_model.bin, Lightning's checkpoint.ckpt), through the real keeper service with the shipped
defaults (only the zoo's place and a namespace of its own per test are set). Ray starts once. The plain trials of
the Tune integration: tests/test_tune.py."""

from __future__ import annotations

import os
import tempfile

import pytest
import ray
import torch
from ray import tune

from keeper.errors import KeeperError
from keeper.tune_integration import ARCHITECTURE_FILE, KeeperCallback, warm_start
from keeper.zoo import Zoo

# starts Ray on loopback once (conftest's local_ray); `-m "not ray"` leaves these out
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]


def _mlp(widths: list[int]) -> torch.nn.Module:
    """An MLP of ``widths`` over 16 features, 4 classes; deterministic given ``torch.manual_seed``."""
    layers, width = [], 16
    for w in widths:
        layers += [torch.nn.Linear(width, w), torch.nn.ReLU()]
        width = w
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 4))


def _train_loop(config: dict) -> None:
    """One Ray Train worker: a model whose initial weights differ per rank, warm_start, then every rank's
    weights compared on rank 0 (all-gathered), and rank 0's checkpoint reported."""
    import ray.train
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(100 + rank)  # unequal inits: equal weights afterwards prove the broadcast
    model = _mlp(config["widths"])
    result = warm_start(model, torch.randn(2, 16), config=config["service"])
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
def test_a_ray_train_trial_warms_once_and_every_worker_gets_the_same_weights(service, tmp_path):
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

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

    assert ray.get(find(service).stats.remote(), timeout=30)["queries"] == 1
    # one template per architecture in the zoo's store (Tune copies the run's checkpoint into its own trial
    # directory, so the callback finds the template from the checkpoint's state_dict), and both trials registered
    assert len(list((tmp_path / "zoo" / "templates").glob("*.onnx"))) == 2
    assert len(cb.registered) == 2 and len(Zoo(service["zoo"])) == 2, cb.outcomes


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


def test_a_lightning_module_under_ray_train_in_a_tune_trial_is_warmed_and_its_ckpt_registered(service, tmp_path):
    """ray.train.lightning inside a Tune trial: warm_start on the LightningModule's network in the Train worker
    inherits from a model already in the zoo, and the callback registers Lightning's checkpoint.ckpt (its state_dict
    under the attribute prefix 'net.'), the architecture found in the zoo's store."""
    pytest.importorskip("lightning")
    import json

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    from keeper.torch_support import register

    report = str(tmp_path / "warm.json")
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


def test_checkpoints_keeper_cannot_read_whole_reach_the_zoo_never_and_repeated_weights_are_recorded(service, tmp_path):
    """register_trial (the callback's task, called here directly against the real service): each bad input is one
    line naming the file and leaves the zoo as it was; the same weights registered by a second trial are recorded
    on the stored model instead of refused."""
    import pyarrow.fs as pafs
    from ray.train import Checkpoint

    from keeper.actors import start
    from keeper.torch_support.templates import architecture_template
    from keeper.torch_support.export import export_graph
    from keeper.tune_integration.checkpoint import register_trial

    handle = start(service)
    model = _mlp([16])
    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    (trial_dir / ARCHITECTURE_FILE).write_bytes(
        architecture_template(export_graph(model, torch.randn(2, 16)), model.state_dict()))

    def register(files: dict, name: str, accuracy: float = 0.5) -> dict:
        d = tmp_path / f"ckpt-{name}"
        d.mkdir()
        for file, content in files.items():
            (d / file).parent.mkdir(exist_ok=True)
            torch.save(content, d / file) if not isinstance(content, bytes) else (d / file).write_bytes(content)
        return register_trial(handle, Checkpoint.from_directory(str(d)), pafs.LocalFileSystem(), str(trial_dir),
                              accuracy, name, None, {}, 60, service["zoo"])

    other = _mlp([16]).state_dict()
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
