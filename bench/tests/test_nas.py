"""The NAS workload's pieces: arrivals, steps-to-target, the summary, and the baselines the training benchmark
compares keeper against, without Ray; and the copy bound's arms, through Tune on a local 2-CPU Ray."""

from __future__ import annotations

import json

import pytest
import torch

from keeper_bench.baselines import name_shape_load, published_warm
from keeper_bench.families import build, default_spec, example_input
from keeper_bench.nas import NasRun, TrialRecord, arrivals, steps_to_target, summarize
from keeper.torch_support import export
from keeper.torch_support.load import load_result
from keeper.warm import inherit


def test_arrivals_are_distinct_deterministic_and_interleave_families():
    a = arrivals(12, seed=3)
    assert [json.dumps(s, sort_keys=True) for s in a] == [json.dumps(s, sort_keys=True) for s in arrivals(12, seed=3)]
    assert len({json.dumps(s, sort_keys=True) for s in a}) == 12
    assert [s["family"] for s in a[:4]] == ["vgg", "resnet", "mlp", "transformer"]
    for s in a:
        build(s)  # every arrival is a valid architecture


def _rec(accs, steps=None):
    steps = steps or [20 * (i + 1) for i in range(len(accs))]
    return TrialRecord(0, "vgg", "x", 1, "", 0.0, steps, accs, accs[-1])


def test_steps_to_target_and_summary():
    run = NasRun(steps=100, margin=0.01)
    cold = [_rec([0.5, 0.7, 0.8, 0.85, 0.9]), _rec([0.3, 0.4, 0.5, 0.6, 0.6])]
    warm = [_rec([0.9, 0.9, 0.9, 0.9, 0.91]), _rec([0.3, 0.3, 0.3, 0.3, 0.3])]
    assert steps_to_target(cold[0], 0.89, 100) == (100, True)
    assert steps_to_target(warm[0], 0.89, 100) == (20, True)
    assert steps_to_target(warm[1], 0.59, 100) == (100, False)
    s = summarize(cold, warm, run)
    # cold reaches 0.89 at 100 and 0.59 at 80; warm at 20 and never (its whole budget, 100)
    assert s["cold_steps"] == [100, 80] and s["arm_steps"] == [20, 100]
    assert s["speedup"] == pytest.approx(180 / 120)
    assert s["saved"] == pytest.approx(1 - 120 / 180)
    assert s["reached"] == 1
    assert s["accuracy_delta"] == pytest.approx(((0.91 - 0.9) + (0.3 - 0.6)) / 2)
    assert s["warmed"] == 0 and s["warmed_speedup"] == 1.0  # no trial had a parent
    warm[0].parent = "p"  # only the first trial was warmed: 100 cold steps against 20
    s = summarize(cold, warm, run)
    assert s["warmed"] == 1 and s["warmed_speedup"] == pytest.approx(100 / 20)


def test_a_finer_run_read_on_a_coarser_grid():
    run = NasRun(steps=60, margin=0.0)
    fine = _rec([0.2, 0.5, 0.6, 0.8, 0.85, 0.9], steps=[10, 20, 30, 40, 50, 60])
    assert steps_to_target(fine, 0.8, 60) == (40, True)
    assert steps_to_target(fine, 0.6, 60) == (30, True)
    assert steps_to_target(fine, 0.6, 60, every=20) == (40, True)  # step 30 is not on the 20-step grid
    assert steps_to_target(fine, 0.9, 60, every=40) == (60, True)  # the last evaluation always counts
    cold = [_rec([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], steps=[10, 20, 30, 40, 50, 60])]
    assert summarize(cold, [fine], run)["arm_steps"] == [30]
    assert summarize(cold, [fine], run, every=20)["arm_steps"] == [40]


def test_the_same_runs_read_with_running_statistics():
    run = NasRun(steps=60, margin=0.0)
    cold = _rec([0.2, 0.5, 0.8], steps=[20, 40, 60])
    cold.running_accuracies = [0.1, 0.3, 0.7]
    warm = _rec([0.8, 0.8, 0.9], steps=[20, 40, 60])
    warm.running_accuracies = [0.4, 0.7, 0.9]
    plain = _rec([0.3, 0.6, 0.7], steps=[20, 40, 60])  # no BatchNorm: one reading serves both
    assert warm.read_with_running_statistics().accuracies == [0.4, 0.7, 0.9]
    assert plain.read_with_running_statistics() is plain and warm.accuracies == [0.8, 0.8, 0.9]
    precise = summarize([cold, cold], [warm, plain], run)
    running = summarize([cold, cold], [warm, plain], run, running_statistics=True)
    # targets are cold's final accuracy in each reading: 0.8 read precisely, 0.7 with running statistics
    assert precise["cold_steps"] == [60, 60] and precise["arm_steps"] == [20, 60]
    assert running["cold_steps"] == [60, 60] and running["arm_steps"] == [40, 60]
    assert running["accuracy_delta"] == pytest.approx(((0.9 - 0.7) + (0.7 - 0.7)) / 2)


def _outputs(module, x):
    module.eval()
    with torch.no_grad():
        return module(x)


def test_published_kernel_operator_shifts_the_function_and_keepers_does_not():
    torch.manual_seed(0)
    parent_spec = {**default_spec("vgg"), "kernel": 3}
    child_spec = {**parent_spec, "kernel": 5}
    parent, child = build(parent_spec), build(child_spec)
    x = example_input(parent_spec, batch=4)
    pb, cb = export(parent, x, dynamo=False).onnx, export(child, x, dynamo=False)
    y = _outputs(parent, x)
    deviations = {}
    for name, warm in (("keeper", inherit), ("published", published_warm)):
        r = warm(pb, cb.onnx, noise=0.0)
        m = build(child_spec)
        load_result(m, r, cb.keys)
        deviations[name] = float((_outputs(m, x) - y).abs().max() / y.abs().max())
    assert deviations["keeper"] < 1e-5
    assert deviations["published"] > 1e-2


def test_name_shape_load_copies_only_matching_names_and_shapes():
    a = build({**default_spec("mlp"), "widths": [32, 16]})
    b = build({**default_spec("mlp"), "widths": [32, 24]})
    before = {k: v.clone() for k, v in b.state_dict().items()}
    copied, elements = name_shape_load(b, a.state_dict())
    after = b.state_dict()
    same = [k for k in after if k in a.state_dict() and a.state_dict()[k].shape == after[k].shape]
    assert copied == len(same) > 0
    assert elements == sum(after[k].numel() for k in same)
    for k in after:
        expected = a.state_dict()[k] if k in same else before[k]
        assert torch.equal(after[k], expected), k


def test_published_warm_from_store_reads_the_stored_parent(tmp_path):
    from keeper.zoo import Zoo
    from keeper_bench.baselines import published_warm_from_store

    torch.manual_seed(0)
    parent_spec = {**default_spec("vgg"), "kernel": 3}
    child_spec = {**parent_spec, "kernel": 5}
    x = example_input(parent_spec, batch=2)
    pb, cb = export(build(parent_spec), x, dynamo=False).onnx, export(build(child_spec), x, dynamo=False).onnx
    Zoo(str(tmp_path)).register(pb, 0.8, "p")
    stored, direct = published_warm_from_store(str(tmp_path), "p", cb, seed=3), published_warm(pb, cb, seed=3)
    assert stored.parent == "p" and stored.score == direct.score and stored.mapping == direct.mapping
    assert all(torch.equal(torch.as_tensor(stored.weights[k]), torch.as_tensor(v)) for k, v in direct.weights.items())


def test_published_warm_takes_a_child_graph_whose_weights_travel_apart(tmp_path):
    # keeper's torch front end exports graphs without weights (export_graph): the published arm passes the child's
    # own weights beside its graph and gets what the inline-weight export gives
    from keeper.torch_support import export_graph, module_weights
    from keeper.zoo import Zoo
    from keeper_bench.baselines import published_warm_from_store

    torch.manual_seed(0)
    parent_spec = default_spec("transformer")
    child_spec = {**parent_spec, "d_model": parent_spec["d_model"] * 3 // 2}
    x = example_input(parent_spec, batch=2)
    parent, child = build(parent_spec), build(child_spec)
    Zoo(str(tmp_path)).register(export(parent, x, dynamo=False).onnx, 0.8, "p")
    apart = export_graph(child, x, dynamo=False)
    assert apart.apart, "the front end should leave the child's weights out of its graph"
    with pytest.raises(Exception, match="has no data"):
        published_warm_from_store(str(tmp_path), "p", apart.onnx, seed=3)
    r = published_warm_from_store(str(tmp_path), "p", apart.onnx, child_weights=module_weights(child, apart), seed=3)
    inline = published_warm_from_store(str(tmp_path), "p", export(child, x, dynamo=False).onnx, seed=3)
    assert r.parent == "p" and r.score == inline.score and 0 < r.score < 1
    before = {k: v.clone() for k, v in child.state_dict().items()}
    load_result(child, r, apart.keys)
    changed = [k for k, v in child.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "nothing of the parent reached the child"


def test_eval_at_start_records_where_a_run_begins():
    from keeper_bench.workload import evaluate, mnist1d_dataset, train

    torch.manual_seed(0)
    model, data = build(default_spec("mlp")), mnist1d_dataset(seed=0, num_samples=500)
    before = evaluate(model, data)
    h = train(model, data, steps=10, eval_every=5, eval_at_start=True)
    assert h.steps == [0, 5, 10] and h.accuracies[0] == before
    assert train(build(default_spec("mlp")), data, steps=10, eval_every=5).steps == [5, 10]


@pytest.mark.ray  # starts Ray on loopback once (conftest's local_ray)
@pytest.mark.usefixtures("local_ray")
def test_the_copy_bound_restarts_each_cold_trained_model_from_its_final_weights(tmp_path):
    # the copy bound: the cold arm leaves each trial's final weights, the copy arm starts from them.
    # With a learning rate of 0 the copy cannot move, so every one of its evaluations reads the cold final accuracy
    # exactly; one that started from the shared initial weights would read the untrained accuracy instead.
    from dataclasses import replace

    from keeper_bench.nas import copy_bound_start, run_arm
    from keeper_bench.workload import evaluate, mnist1d_dataset

    specs = [{**default_spec("mlp"), "widths": [32]}, {**default_spec("mlp"), "widths": [24, 12]}]
    run = NasRun(steps=60, eval_every=20, num_samples=1200, concurrency=2, precise_bn=False)
    cold = run_arm("cold", specs, run, str(tmp_path), seed=0)
    copy = run_arm("copy", specs, replace(run, lr=0.0), str(tmp_path), seed=0)
    data = mnist1d_dataset(seed=run.data_seed, num_samples=run.num_samples)
    # the same copies under keeper's recipe start from the same weights, and carry a restart's recipe (copy-recipe
    # trials run the copy arm's trainable; its start is what differs)
    for c in cold:
        model = build(specs[c.index])
        info = copy_bound_start("copy-recipe", model, str(tmp_path / "states-copy-recipe-s0"), 0, c.index, 60)
        assert info["parent"] == f"cold-s0-{c.index}" and info["recipe"]["start"] < 1.0, info
        assert evaluate(model, data) == c.final_accuracy
    for c, k in zip(cold, copy):
        torch.manual_seed(c.index)  # every arm's initial weights for seed 0 (keeper_bench.nas)
        untrained = evaluate(build(specs[c.index]), data)
        assert untrained != c.final_accuracy  # the check below tells the two starts apart
        assert k.parent == f"cold-s0-{c.index}" and k.score == 1.0
        assert k.accuracies == [c.final_accuracy] * len(k.accuracies), (c.accuracies, k.accuracies)
