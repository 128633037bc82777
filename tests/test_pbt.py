"""KeeperPBT on a real local Ray with 2 CPUs: a population of small MLPs over width, depth and learning rate,
each member one warm_start line, KeeperCallback registering them through the real keeper service, run with the
shipped defaults (only the zoo's place and a namespace of its own per test are set). Ray starts once."""

from __future__ import annotations

import os
import tempfile
import uuid

import pytest
import torch
from ray import tune

from keeper.errors import ConfigError
from keeper.tune_integration import KeeperCallback, warm_start
from keeper.tune_integration.pbt import grows_from

# starts Ray on loopback once (conftest's local_ray); `-m "not ray"` leaves these out
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]


def _mlp_task(config: dict) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module]:
    """A population member's data (the same for all) and its MLP of the config's width and depth."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(1)
    layers, d = [], 8
    for w in [config["width"]] * config["depth"]:
        layers += [torch.nn.Linear(d, w), torch.nn.ReLU()]
        d = w
    return x, y, torch.nn.Sequential(*layers, torch.nn.Linear(d, 3))


def _pbt_trainable(service: dict, marker: str | None = None, fail_once: str | None = None):
    """A population member: an MLP of the config's width and depth, one warm_start line (which restores whatever
    checkpoint the trial starts from, any architecture), short training rounds, a checkpoint per round that
    records the loss it was saved at (and its trial; ``restored`` says whether the file ``marker`` existed when the
    trial started); the width-16 member raises the first time it starts from a checkpoint, when ``fail_once``
    names a file that does not exist yet."""

    def trainable(config: dict) -> None:
        import json

        x, y, model = _mlp_task(config)
        warm = warm_start(model, x[:2], config=service)

        def loss() -> float:
            with torch.no_grad():
                return float(torch.nn.functional.cross_entropy(model(x), y))

        source = None
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as cd:
                with open(os.path.join(cd, "meta.json")) as f:
                    source = json.load(f)
        start, opt = loss(), torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
        restored = bool(marker and os.path.exists(marker))
        if fail_once and source and config["width"] == 16 and not os.path.exists(fail_once):
            open(fail_once, "w").close()
            raise RuntimeError("this member fails once on purpose")
        for rnd in range(config["rounds"]):
            for _ in range(10):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            now = loss()
            with tempfile.TemporaryDirectory() as d:
                torch.save(model.state_dict(), os.path.join(d, "model.pt"))
                with open(os.path.join(d, "meta.json"), "w") as f:
                    json.dump({"loss": now, "width": config["width"], "depth": config["depth"],
                               "trial": tune.get_context().get_trial_id()}, f)
                metrics = {"neg_loss": -now, "parent": warm.parent or "", "preserved": bool(warm.preserved),
                           "start_loss": start, "source": json.dumps(source) if rnd == 0 and source else "",
                           "restored": restored}
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
    return trainable


def _restores(grid) -> list[tuple[dict, object]]:
    """(the meta of the checkpoint a member started from, that round's result row) for every such start."""
    import json

    out = []
    for result in grid:
        history = result.metrics_dataframe
        out += [(json.loads(row["source"]), row) for _, row in history[history["source"] != ""].iterrows()]
    return out


def _crossing(restores: list[tuple[dict, object]]) -> list[tuple[dict, object]]:
    """The starts from a checkpoint of another architecture."""
    return [(s, r) for s, r in restores if (s["width"], s["depth"]) != (r["config/width"], r["config/depth"])]


@pytest.mark.slow  # > 20 s on two idle cores
def test_keeper_pbt_exploits_across_architectures(service, tmp_path):
    """A population of 4 over width x depth x learning rate: weak trials clone strong ones of other architectures,
    keeper carries the clone's function onto their own architecture (exactly where it says preserved), and no
    trial errs."""

    from keeper.tune_integration import KeeperPBT

    def validate(config):
        if config["width"] < 4 or config["depth"] < 1:
            raise ValueError(f"width {config['width']} / depth {config['depth']} builds no MLP")

    with pytest.raises(ConfigError, match=r"hyperparam_mutations\['width'\] lists 2"):
        KeeperPBT(metric="neg_loss", mode="max", hyperparam_mutations={"width": [2, 16]},
                  architecture_keys=("width",), validate=validate, base_config={"depth": 1})
    # synch: every trial reaches the perturbation point before the bottom half clones the top half, so the two
    # exploits happen at iteration 2 whatever the machine's speed, and cross architectures (all four differ)
    pbt = KeeperPBT(time_attr="training_iteration", perturbation_interval=2, quantile_fraction=0.5, synch=True,
                    hyperparam_mutations={"lr": [0.01, 0.05, 0.2]}, architecture_keys=("width", "depth"),
                    validate=validate)
    space = {"width": tune.grid_search([8, 16]), "depth": tune.grid_search([1, 2]), "lr": 0.05, "rounds": 1000}
    cb = KeeperCallback(metric="neg_loss", mode="max", config=service)
    # the members reuse their actors (Tune's setting for PBT): an exploit restarts a member in the process it ran in
    grid = tune.Tuner(_pbt_trainable(service), param_space=space,
                      tune_config=tune.TuneConfig(scheduler=pbt, metric="neg_loss", mode="max", reuse_actors=True),
                      run_config=tune.RunConfig(name="pbt", storage_path=str(tmp_path / "results"),
                                                stop={"training_iteration": 3}, callbacks=[cb], verbose=0)).fit()
    assert not grid.errors
    exploits = [(s, r) for s, r in _restores(grid) if s["trial"] != r["trial_id"]]
    assert exploits, "the bottom half cloned the top half at iteration 2"
    for source, row in exploits:
        assert row["parent"].startswith("checkpoint"), row["parent"]
        # never thrown away: a member that grows from the clone gets its function by keeper's transforms, one that
        # would shrink takes the clone's architecture; either way it starts where the clone was (up to the default
        # symmetry-breaking noise), never back at chance
        assert grows_from({"w": source["width"], "d": source["depth"]},
                          {"w": row["config/width"], "d": row["config/depth"]}), (source, row)
        assert row["preserved"], (source, row)
        assert abs(row["start_loss"] - source["loss"]) <= 0.05 * source["loss"] + 1e-3, (source, row)
    assert pbt.took_clone_architecture == sum(1 for s, r in exploits if not _crossing([(s, r)]))


@pytest.mark.slow  # > 20 s on two idle cores
def test_keeper_pbt_resumes_after_tuner_restore(service, tmp_path):
    """A KeeperPBT run with a member that fails once is restored with Tuner.restore(resume_errored=True): it
    finishes with no errored trial, and the restored member starts from its checkpoint through warm_start (exactly
    on its own architecture, by keeper's transforms on another)."""
    import json

    from keeper.tune_integration import KeeperPBT

    marker = str(tmp_path / "restored")
    trainable = _pbt_trainable(service, marker, fail_once=str(tmp_path / "failed"))

    def validate(config):
        if config["width"] < 4 or config["depth"] < 1:
            raise ValueError(f"width {config['width']} / depth {config['depth']} builds no MLP")

    pbt = KeeperPBT(time_attr="training_iteration", perturbation_interval=1, quantile_fraction=0.5, synch=True,
                    hyperparam_mutations={"lr": [0.01, 0.05, 0.2]}, architecture_keys=("width", "depth"),
                    validate=validate)
    space = {"width": tune.grid_search([8, 16]), "depth": 1, "lr": 0.05, "rounds": 1000}
    cb = KeeperCallback(metric="neg_loss", mode="max", config=service)
    grid = tune.Tuner(trainable, param_space=space,
                      tune_config=tune.TuneConfig(scheduler=pbt, metric="neg_loss", mode="max", reuse_actors=True),
                      run_config=tune.RunConfig(name="pbt-restore", storage_path=str(tmp_path / "results"),
                                                stop={"training_iteration": 2}, callbacks=[cb], verbose=0)).fit()
    assert len(grid.errors) == 1, grid.errors
    open(marker, "w").close()
    grid = tune.Tuner.restore(str(tmp_path / "results" / "pbt-restore"), trainable, resume_errored=True).fit()
    assert not grid.errors
    resumed = 0
    for result in grid:
        assert result.metrics["training_iteration"] == 2, result.metrics
        history = result.metrics_dataframe
        after = history[history["restored"]]
        if not len(after):
            continue
        resumed += 1
        row = after.iloc[0]
        assert row["source"] and row["parent"].startswith("checkpoint"), row.to_dict()
        source = json.loads(row["source"])
        if (source["width"], source["depth"]) == (row["config/width"], row["config/depth"]):
            assert row["start_loss"] == pytest.approx(source["loss"], rel=1e-6), (source, row.to_dict())
        else:
            assert row["preserved"] and row["start_loss"] == pytest.approx(source["loss"], rel=0.05), source
    assert resumed == 1, "the errored member, and only it, trained again after the restore"


def _member_round(config: dict, report) -> tune.Checkpoint:
    """One round of a population member, in a Ray Train worker or in the trial itself: the one warm_start line given
    the checkpoint the round starts from (``config["checkpoint"]``), ten steps, and a checkpoint (in the fresh
    directory ``config["out"]``) recording the loss it was saved at and the trial that saved it."""
    import json

    x, y, model = _mlp_task(config)
    given = config["checkpoint"]
    warm = warm_start(model, x[:2], config=config["service"], checkpoint=given)
    with torch.no_grad():
        start = float(torch.nn.functional.cross_entropy(model(x), y))
    source = ""
    if given is not None and config["from_tune"]:
        with given.as_directory() as cd, open(os.path.join(cd, "meta.json")) as f:
            source = f.read()
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        now = float(torch.nn.functional.cross_entropy(model(x), y))
    metrics = {"neg_loss": -now, "parent": warm.parent or "", "preserved": bool(warm.preserved), "start_loss": start,
               "source": source, "in_workers": config["in_workers"]}
    os.makedirs(config["out"])
    torch.save(model.state_dict(), os.path.join(config["out"], "model.pt"))
    with open(os.path.join(config["out"], "meta.json"), "w") as f:
        json.dump({"loss": now, "width": config["width"], "depth": config["depth"], "trial": config["trial"]}, f)
    checkpoint = tune.Checkpoint.from_directory(config["out"])
    report(metrics, checkpoint=checkpoint)
    return checkpoint


def _train_member(config: dict) -> None:
    """A population member's Ray Train worker: one round, given the checkpoint Tune started the trial from (Ray Train
    hands its workers only their own run's checkpoints)."""
    import ray.train

    _member_round(config, ray.train.report)


@pytest.mark.slow  # > 20 s on two idle cores
def test_keeper_pbt_with_ray_train_trials(service, tmp_path):
    """Members that train in Ray Train workers (a TorchTrainer run inside the Tune trial, as Ray Train V2 runs under
    Tune): the trial hands Tune's checkpoint to its workers, whose warm_start carries an exploited checkpoint of
    another architecture onto their own; no trial errs. Only a round handed another member's checkpoint trains in
    workers (each Train run starts processes: a Train run per round would cost this suite a minute); the others
    train in the trial."""
    import json

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from keeper.tune_integration import KeeperPBT

    storage = str(tmp_path / "train")

    def member(config):
        checkpoint, from_tune = tune.get_checkpoint(), True
        trial_id = tune.get_context().get_trial_id()
        while True:
            handed = False
            if checkpoint is not None and from_tune:
                with checkpoint.as_directory() as cd, open(os.path.join(cd, "meta.json")) as f:
                    handed = json.load(f)["trial"] != trial_id
            run = {**config, "service": service, "checkpoint": checkpoint, "from_tune": from_tune,
                   "trial": trial_id, "out": str(tmp_path / "rounds" / uuid.uuid4().hex), "in_workers": handed}
            if handed:
                # one worker of 0.5 CPU: two trials at once, with keeper beside them, on a 2-CPU Ray; a run name of
                # its own (a Train run that finds its name's directory resumes from its checkpoint)
                trainer = TorchTrainer(_train_member, train_loop_config=run,
                                       scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
                                       run_config=RunConfig(name=f"{trial_id}-{uuid.uuid4().hex[:8]}",
                                                            storage_path=storage))
                result = trainer.fit()
                checkpoint = result.checkpoint
                tune.report(dict(result.metrics), checkpoint=checkpoint)
            else:
                checkpoint = _member_round(run, tune.report)
            from_tune = False

    # grows= says every architecture grows from every other, so the narrower member keeps its own architecture
    # too and its workers carry the clone across (KeeperPBT's default would give it the clone's architecture)
    pbt = KeeperPBT(time_attr="training_iteration", perturbation_interval=1, quantile_fraction=0.5, synch=True,
                    hyperparam_mutations={"lr": [0.01, 0.05, 0.2]}, architecture_keys=("width", "depth"),
                    grows=lambda theirs, mine: True)
    # two members of two architectures: the weaker clones the stronger, across architectures
    space = {"width": tune.grid_search([8, 16]), "depth": 1, "lr": 0.05}
    cb = KeeperCallback(metric="neg_loss", mode="max", config=service)
    grid = tune.Tuner(tune.with_resources(member, {"CPU": 0.01}), param_space=space,
                      tune_config=tune.TuneConfig(scheduler=pbt, metric="neg_loss", mode="max",
                                                  max_concurrent_trials=2, reuse_actors=True),
                      run_config=tune.RunConfig(name="pbt-train", storage_path=str(tmp_path / "results"),
                                                stop={"training_iteration": 2}, callbacks=[cb], verbose=0)).fit()
    assert not grid.errors
    crossing = _crossing(_restores(grid))
    assert crossing, "no exploit crossed architectures"
    for source, row in crossing:
        assert row["in_workers"], "the exploited round trained in Ray Train workers"
        assert row["parent"].startswith("checkpoint"), row["parent"]
        assert row["preserved"] == (source["width"] < row["config/width"]), "a wider member keeps the function"
        if row["preserved"]:
            assert abs(row["start_loss"] - source["loss"]) <= 0.05 * source["loss"] + 1e-3, (source, row)


def test_an_exploit_into_an_architecture_that_does_not_grow_from_the_clone_takes_the_clone_s():
    """A narrower or shallower member cannot receive the clone's function: it takes the clone's architecture for
    that exploit (its weights then copied exactly); a wider one keeps its own and grows the clone."""
    from types import SimpleNamespace

    from keeper.tune_integration import KeeperPBT

    assert grows_from({"w": 8, "d": 1}, {"w": 16, "d": 1}) and grows_from({"w": 8}, {"w": 8})
    assert not grows_from({"w": 24, "d": 1}, {"w": 8, "d": 2}) and not grows_from({"act": "relu"}, {"act": "gelu"})
    assert not grows_from({"w": 8}, {"w": True}), "a bool is not a size"
    pbt = KeeperPBT(metric="m", mode="max", hyperparam_mutations={"lr": [0.1, 0.2]},
                    architecture_keys=("width", "depth"))
    clone = SimpleNamespace(config={"lr": 0.1, "width": 24, "depth": 1})
    narrow = SimpleNamespace(config={"lr": 0.2, "width": 8, "depth": 2})
    config, _ = pbt._get_new_config(narrow, clone)
    assert (config["width"], config["depth"]) == (24, 1) and pbt.took_clone_architecture == 1
    wide = SimpleNamespace(config={"lr": 0.2, "width": 32, "depth": 2})
    config, _ = pbt._get_new_config(wide, clone)
    assert (config["width"], config["depth"]) == (32, 2) and pbt.took_clone_architecture == 1
    custom = KeeperPBT(metric="m", mode="max", hyperparam_mutations={"lr": [0.1, 0.2]},
                       architecture_keys=("width", "depth"), grows=lambda theirs, mine: True)
    config, _ = custom._get_new_config(narrow, clone)
    assert (config["width"], config["depth"]) == (8, 2), "grows= decides"


def test_architecture_keys_nested_in_a_trainer_config_are_kept():
    """A key missing from the top level is found in train_loop_config (a Ray Train trainer handed to the Tuner),
    a path joined by '/' in any nested config; the exploiting trial keeps its own values there."""
    from types import SimpleNamespace

    from keeper.tune_integration import KeeperPBT

    def validate(config):
        if config["train_loop_config"]["width"] < 4:
            raise ValueError("too narrow")

    mutations = {"train_loop_config": {"lr": [0.1, 0.2], "width": [8, 16]}}
    with pytest.raises(ConfigError, match=r"hyperparam_mutations\['width'\] lists 2"):
        KeeperPBT(metric="m", mode="max", hyperparam_mutations={"train_loop_config": {"width": [2, 8]}},
                  architecture_keys=("width",), validate=validate, base_config={"train_loop_config": {}})
    # grows= says any architecture grows from any other: this test is about where the keys are, not which
    # architecture an exploit keeps (a narrower member takes the clone's by default)
    pbt = KeeperPBT(metric="m", mode="max", hyperparam_mutations=mutations, architecture_keys=("width", "model/depth"),
                    resample_probability=0.0, grows=lambda theirs, mine: True)
    mine = SimpleNamespace(config={"train_loop_config": {"lr": 0.1, "width": 8}, "model": {"depth": 1}})
    theirs = SimpleNamespace(config={"train_loop_config": {"lr": 0.2, "width": 16}, "model": {"depth": 3}})
    for _ in range(20):
        config, ops = pbt._get_new_config(mine, theirs)
        assert config["model"]["depth"] == 1, "a key no mutation names is kept"
        if "width" in ops["train_loop_config"]:  # mutated: a listed value
            assert config["train_loop_config"]["width"] in (8, 16)
    pbt = KeeperPBT(metric="m", mode="max", hyperparam_mutations={"train_loop_config": {"lr": [0.1, 0.2]}},
                    architecture_keys=("width",))
    config, _ = pbt._get_new_config(mine, theirs)
    assert config["train_loop_config"]["width"] == 16, "width 8 does not grow from 16: the clone's is taken"
    config, _ = pbt._get_new_config(theirs, mine)
    assert config["train_loop_config"]["width"] == 16 and config["train_loop_config"]["lr"] in (0.1, 0.2)


def _own_checkpoint(config: dict, service: dict) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """In a trial: a member warm-started, given weights no fresh init, zoo warm or transform could give, and
    reported with its checkpoint (the trial's own latest); its data and a copy of those weights."""
    x, y, model = _mlp_task(config)
    warm_start(model, x[:2], config=service)
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    saved = [t.clone() for t in model.state_dict().values()]
    with tempfile.TemporaryDirectory() as d:
        torch.save(model.state_dict(), os.path.join(d, "model.pt"))
        tune.report({"step": 0}, checkpoint=tune.Checkpoint.from_directory(d))
    return x, y, saved


def test_a_checkpoint_keeper_cannot_carry_never_replaces_the_member_s_own_weights(service, tmp_path):
    """Two checkpoints handed to one member, in one trial. One keeper cannot restore (an unrelated architecture, no
    template anywhere) never ends the trial: it continues, exactly, from its own latest checkpoint, and the result
    says why. One of a wider architecture, handed to the narrower member, is transformed without its function
    (preserved False): without a probe the member keeps its own latest checkpoint, exactly; with one, the lower loss
    of the two stays, and the result says which and why."""
    from keeper.torch_support.export import export_graph
    from keeper.torch_support.templates import architecture_template
    from keeper.torch_support.trial import ARCHITECTURE_FILE

    bad = tmp_path / "checkpoint_000009"
    bad.mkdir()
    torch.save(torch.nn.Conv2d(3, 5, 3).state_dict(), bad / "model.pt")
    x, y, wide = _mlp_task({"width": 16, "depth": 1})
    clone = tmp_path / "other-trial" / "checkpoint_000005"
    clone.mkdir(parents=True)
    torch.save(wide.state_dict(), clone / "model.pt")
    (clone.parent / ARCHITECTURE_FILE).write_bytes(architecture_template(export_graph(wide, x[:2])))

    def trainable(config: dict) -> None:
        x, y, saved = _own_checkpoint(config, service)

        def handed(checkpoint, **probe):
            _, _, again = _mlp_task(config)
            result = warm_start(again, x[:2], config=service, checkpoint=str(checkpoint), **probe)
            return result, all(torch.equal(a, b) for a, b in zip(saved, again.state_dict().values()))

        unreadable, same_unreadable = handed(bad)
        carried, same_carried = handed(clone)
        judged, _ = handed(clone, probe=((x, y), torch.nn.CrossEntropyLoss()))
        tune.report({"step": 1, "same_unreadable": same_unreadable, "parent": unreadable.parent or "",
                     "unreadable_reason": unreadable.reason, "same": same_carried,
                     "preserved": bool(carried.preserved), "reason": carried.reason, "probed_reason": judged.reason})

    grid = tune.Tuner(trainable, param_space={"width": 8, "depth": 1},
                      run_config=tune.RunConfig(name="own", storage_path=str(tmp_path / "results"),
                                                callbacks=[KeeperCallback(metric="step", mode="max", config=service)],
                                                verbose=0)).fit()
    assert not grid.errors
    row = grid[0].metrics
    assert row["same_unreadable"] and row["parent"].startswith("checkpoint checkpoint_000000"), row
    assert "checkpoint_000009" in row["unreadable_reason"] and "continues from its own" in row["unreadable_reason"]
    assert row["same"] and row["preserved"], row
    assert "checkpoint_000005" in row["reason"] and "keeps its own checkpoint checkpoint_000000" in row["reason"]
    assert "probe" in row["probed_reason"] and "checkpoint_000005" in row["probed_reason"], row["probed_reason"]
