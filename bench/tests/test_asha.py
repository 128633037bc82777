"""KeeperASHA: trials started from a parent meet the cutoffs of their own kind, trials trained from scratch those
they would meet without keeper (Tune's own rungs and brackets decide; the trials' lineage files are read as a
Tune trial's directory holds them)."""

import json
from types import SimpleNamespace

import pyarrow.fs
import pytest
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from keeper.errors import ConfigError
from keeper.torch_support.trial import LINEAGE_FILE
from keeper_bench.asha import KeeperASHA


def _trial(tmp_path, tid: str, parent: str | None) -> SimpleNamespace:
    """A trial as Tune's schedulers see it: an id and its storage, whose directory holds the lineage that
    warm_start leaves (none for a trial without the line)."""
    path = tmp_path / tid
    path.mkdir()
    if parent is not None:
        (path / LINEAGE_FILE).write_text(json.dumps({"parent": parent, "preserved": True}))
    return SimpleNamespace(trial_id=tid, storage=SimpleNamespace(storage_filesystem=pyarrow.fs.LocalFileSystem(),
                                                                 trial_fs_path=str(path)))


def _run(scheduler, trials, results) -> dict[str, str]:
    for t in trials:
        scheduler.on_trial_add(None, t)
    return {t.trial_id: scheduler.on_trial_result(None, t, {"training_iteration": 1, "acc": acc})
            for t, acc in zip(trials, results)}


def test_warmed_trials_do_not_raise_the_cutoff_the_cold_ones_meet(tmp_path):
    # three warmed trials report their parents' level at the first rung, then three cold ones climb from scratch
    kinds = [("w0", "p"), ("w1", "p"), ("w2", "p"), ("c0", None), ("c1", None), ("c2", ""), ("c3", None)]
    results = [0.99, 0.98, 0.97, 0.90, 0.95, 0.80, 0.96]
    settings = {"time_attr": "training_iteration", "max_t": 9, "grace_period": 1, "reduction_factor": 3,
                "metric": "acc", "mode": "max"}
    (tmp_path / "plain").mkdir(), (tmp_path / "keeper").mkdir()
    plain = _run(ASHAScheduler(**settings), [_trial(tmp_path / "plain", *k) for k in kinds], results)
    keeper = KeeperASHA(**settings)
    fair = _run(keeper, [_trial(tmp_path / "keeper", *k) for k in kinds], results)
    # plain ASHA: every cold trial is below the warmed trials' top third and stops at its first rung
    assert [plain[t] for t in ("c0", "c1", "c2", "c3")] == [TrialScheduler.STOP] * 4, plain
    # KeeperASHA: the cold ones are halved among themselves (the first continues, then each in the top third of
    # the cold ones so far), the warmed ones among themselves
    assert [fair[t] for t in ("c0", "c1", "c2", "c3")] == [TrialScheduler.CONTINUE, TrialScheduler.CONTINUE,
                                                           TrialScheduler.STOP, TrialScheduler.CONTINUE], fair
    assert [fair[t] for t in ("w0", "w1", "w2")] == [TrialScheduler.CONTINUE, TrialScheduler.STOP,
                                                     TrialScheduler.STOP], fair
    assert sorted(keeper.warmed_trials) == ["w0", "w1", "w2"], "an empty parent is no parent"
    assert "warmed trials (3)" in keeper.debug_string()


def test_a_trial_whose_lineage_cannot_be_read_counts_as_cold(tmp_path):
    keeper = KeeperASHA(time_attr="training_iteration", max_t=9, grace_period=1, reduction_factor=3,
                        metric="acc", mode="max")
    bad = _trial(tmp_path, "bad", None)
    (tmp_path / "bad" / LINEAGE_FILE).write_text("not json")
    gone = SimpleNamespace(trial_id="gone", storage=None)
    _run(keeper, [bad, gone], [0.5, 0.6])
    assert keeper.warmed_trials == [] and set(keeper._warmed) == {"bad", "gone"}


def test_keeper_asha_says_what_it_needs_from_ray_when_its_rungs_are_elsewhere(monkeypatch):
    monkeypatch.setattr(ASHAScheduler, "__init__", lambda self, *a, **k: None)
    with pytest.raises(ConfigError, match=r"_brackets and \._trial_info\); use Tune's ASHAScheduler"):
        KeeperASHA(max_t=9)
