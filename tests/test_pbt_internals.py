"""The parts of Tune's PopulationBasedTraining that KeeperPBT overrides or reads are private to Tune: this module
fails, naming what changed, where an upgrade of Ray moved them (pyproject.toml bounds Ray for that reason).
Nothing here starts Ray."""

from __future__ import annotations

import inspect

import pytest

tune = pytest.importorskip("ray.tune")

from ray.tune.experiment import Trial  # noqa: E402
from ray.tune.schedulers import PopulationBasedTraining  # noqa: E402
from ray.tune.schedulers import pbt as tune_pbt  # noqa: E402

from keeper.tune_integration.pbt import KeeperPBT  # noqa: E402

FIX = ("KeeperPBT (keeper/tune_integration/pbt.py) relies on it: adapt KeeperPBT to this Ray, then move the upper "
       "bound on ray in pyproject.toml")


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("name, params", [("_get_new_config", ["self", "trial", "trial_to_clone"]),
                                          ("choose_trial_to_run", ["self", "tune_controller"])])
def test_the_overridden_methods_keep_their_signatures(name, params):
    method = getattr(PopulationBasedTraining, name, None)
    assert method is not None, f"PopulationBasedTraining.{name} is gone; {FIX}"
    assert _params(method) == params, f"PopulationBasedTraining.{name}{inspect.signature(method)} changed; {FIX}"
    assert getattr(KeeperPBT, name) is not method, f"KeeperPBT no longer overrides {name}"


def test_the_private_state_keeperpbt_reads_is_there():
    pbt = KeeperPBT(time_attr="training_iteration", metric="loss", mode="min", perturbation_interval=2,
                    hyperparam_mutations={"lr": [0.1, 0.01]}, synch=True)
    for attr in ("_synch", "_trial_state", "_next_perturbation_sync", "_perturbation_interval"):
        assert hasattr(pbt, attr), f"PopulationBasedTraining no longer sets {attr}; {FIX}"
    assert pbt._synch is True and isinstance(pbt._trial_state, dict), FIX
    state = getattr(tune_pbt, "_PBTTrialState", None)
    assert state is not None, f"ray.tune.schedulers.pbt._PBTTrialState is gone; {FIX}"
    assert "last_train_time" in inspect.getsource(state.__init__), \
        f"_PBTTrialState no longer keeps last_train_time (synchronous mode's clock); {FIX}"
    for status in ("PAUSED", "PENDING", "RUNNING"):
        assert hasattr(Trial, status), f"Trial.{status} is gone; {FIX}"


def test_get_new_config_still_returns_a_config_and_its_operations():
    """KeeperPBT calls the parent's ``_get_new_config`` and unpacks ``(config, operations)``: the explored copy of
    the clone's config and, per mutated key, what was done to it."""
    pbt = PopulationBasedTraining(time_attr="training_iteration", metric="loss", mode="min", perturbation_interval=2,
                                  hyperparam_mutations={"lr": [0.1, 0.01]})

    class Member:  # what _get_new_config reads of a trial
        config = {"lr": 0.1, "width": 8}

    got = pbt._get_new_config(Member(), Member())
    assert isinstance(got, tuple) and len(got) == 2, f"_get_new_config returned {got!r}; {FIX}"
    config, operations = got
    assert isinstance(config, dict) and config["width"] == 8 and config["lr"] in (0.1, 0.01), FIX
    assert isinstance(operations, dict) and set(operations) <= {"lr"}, FIX
