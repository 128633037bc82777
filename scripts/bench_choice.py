"""Does the parent choice predict the benefit? Warmed trials slower than cold, with families arriving interleaved.

ResNet-, VGG- and MobileNetV2-style (depthwise) 1-D CNNs arrive one by one, interleaved, through the embedded zoo
(keeper.Zoo, keeper.torch_support.warm_start), on MNIST-1D. Some children find only other families' models in the
zoo (the first VGG and MobileNetV2), some only narrower models of their own family (the 2x-wider ones), the rest
deeper, bigger-kernel or narrower relatives. Each arm keeps its own zoo, so a bad warm start can pollute it:

* ``cold``: every trial from its own init (the reference);
* ``similarity``: the choice of earlier versions (similarity buckets then accuracy; floor 0.3), kept as
  ``SelectionPolicy(preserve=False, structure=False, cross_structure=True)``;
* ``keeper``: the default choice (preserved function first, similarity x structure, lineage-aware);
* ``keeper+probe``: the default choice plus a data probe (two training batches, the loss over two SGD steps).

Recipe: SGD with momentum 0.9 (lr 0.05, cosine decay, batch 128), a fixed step budget; accuracy read every 10
steps in eval mode with the running BatchNorm statistics (the headline reading) and, beside it, with statistics
re-estimated for the current weights. A trial's target is the final accuracy of its cold twin (same reading) minus
one point; steps to target count the whole budget when it is never reached. A warmed trial is *slower than cold*
when it needs more than 1.25x its cold twin's steps. Trained models enter their arm's zoo with their final accuracy
and the lineage of their warm start.

Usage:
    python scripts/bench_choice.py            # 15 trials, 2 seeds, 300 steps (~30 min on 2 idle cores)
    python scripts/bench_choice.py --seeds 1  # 15 trials, 1 seed (~15 min on 2 idle cores)
    python scripts/bench_choice.py --quick    # 9 trials, 1 seed, 200 steps (~6 min)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import tempfile
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402

SLOW = 1.25
ARMS = ("cold", "similarity", "keeper", "keeper+probe")


def _wider(s: dict, f: float = 2.0) -> dict:
    out = copy.deepcopy(s)
    out["widths"] = [int(round(w * f)) for w in s["widths"]]
    if "stem_width" in out:
        out["stem_width"] = int(round(s["stem_width"] * f))
        out["head_width"] = int(round(s["head_width"] * f))
    return out


def _deeper(s: dict) -> dict:
    out = copy.deepcopy(s)
    key = "depths" if s["family"] == "vgg" else "blocks"
    out[key] = [d + 1 if i == len(s[key]) - 1 else d for i, d in enumerate(s[key])]
    return out


def _kernel(s: dict) -> dict:
    return {**s, "kernel": s["kernel"] + 2}


def arrivals(quick: bool) -> list[tuple[str, dict, str]]:
    """(label, spec, what the zoo offers it) in arrival order: families interleaved."""
    from keeper_bench.families import default_spec

    base = {f: default_spec(f) for f in ("resnet", "vgg", "mobilenetv2")}
    out = [("resnet", base["resnet"], "empty zoo"),
           ("vgg", base["vgg"], "other families only"),
           ("mobilenetv2", base["mobilenetv2"], "other families only"),
           ("resnet x2 wide", _wider(base["resnet"]), "narrower same family"),
           ("vgg x2 wide", _wider(base["vgg"]), "narrower same family"),
           ("mobilenetv2 x2 wide", _wider(base["mobilenetv2"]), "narrower same family"),
           ("resnet deeper", _deeper(base["resnet"]), "same family"),
           ("vgg kernel+2", _kernel(base["vgg"]), "same family"),
           ("mobilenetv2 deeper", _deeper(base["mobilenetv2"]), "same family")]
    if not quick:
        out += [("resnet x0.5", _wider(base["resnet"], 0.5), "wider same family"),
                ("vgg x2 wide deeper", _deeper(_wider(base["vgg"])), "same family"),
                ("mobilenetv2 x1.5 kernel+2", _kernel(_wider(base["mobilenetv2"], 1.5)), "same family"),
                ("resnet x2 kernel+2", _kernel(_wider(base["resnet"])), "same family"),
                ("vgg x0.5", _wider(base["vgg"], 0.5), "wider same family"),
                ("mobilenetv2 x2 deeper", _deeper(_wider(base["mobilenetv2"])), "same family")]
    return out


def train(model, data, steps: int, lr: float, seed: int, eval_every: int) -> dict:
    """SGD with momentum and cosine decay; accuracy every ``eval_every`` steps, read with running BN statistics
    (eval mode) and with statistics re-estimated for the current weights."""
    import math

    import torch

    from keeper_bench.workload import evaluate, with_precise_bn

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    loss_fn = torch.nn.CrossEntropyLoss()
    n = len(data.y_train)
    order, cursor = torch.randperm(n, generator=gen), 0
    running, precise, at = [evaluate(model, data)], [evaluate(with_precise_bn(model, data), data)], [0]
    model.train()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        if cursor + 128 > n:
            order, cursor = torch.randperm(n, generator=gen), 0
        idx = order[cursor:cursor + 128]
        cursor += 128
        loss = loss_fn(model(data.x_train[idx]), data.y_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % eval_every == 0 or step == steps:
            running.append(evaluate(model, data))
            precise.append(evaluate(with_precise_bn(model, data), data))
            at.append(step)
            model.train()
    return {"at": at, "running": running, "precise": precise, "seconds": time.perf_counter() - t0}


def steps_to(curve: list[float], at: list[int], target: float, budget: int) -> int:
    for s, a in zip(at, curve):
        if a >= target:
            return s
    return budget


def run(args) -> dict:
    import torch

    import keeper
    from keeper.choice.selection import SelectionPolicy
    from keeper.torch_support import DataProbe, export_graph, module_weights, warm_start
    from keeper_bench.families import build, example_input, num_params
    from keeper_bench.workload import mnist1d_dataset

    torch.set_num_threads(1)  # tiny models: one thread each is fastest on a shared CPU
    data = mnist1d_dataset(seed=0, num_samples=5000)
    specs = arrivals(args.quick)
    probe_batches = [(data.x_train[i * 128:(i + 1) * 128], data.y_train[i * 128:(i + 1) * 128]) for i in range(2)]
    rows: list[dict] = []
    for seed in range(args.seeds):
        zoos = {}
        tmp = tempfile.mkdtemp(prefix="keeper-bench-choice-")
        for arm in ARMS[1:]:
            policy = (SelectionPolicy(preserve=False, structure=False, cross_structure=True) if arm == "similarity"
                      else SelectionPolicy())
            zoos[arm] = keeper.Zoo(os.path.join(tmp, arm.replace("+", "-")),
                                   keeper.ZooConfig(selection=policy, outlier_z=None))
        for i, (label, spec, offer) in enumerate(specs):
            for arm in ARMS:
                torch.manual_seed(1000 * seed + i)
                model = build(spec)
                info: dict = {"seed": seed, "trial": i, "arch": label, "offer": offer, "arm": arm,
                              "params": num_params(spec), "parent": None, "score": 0.0, "preserved": False,
                              "structure": 0.0, "probe_s": 0.0, "reason": ""}
                if arm != "cold":
                    probe = (DataProbe(probe_batches, torch.nn.CrossEntropyLoss(), steps=2, lr=args.lr)
                             if arm == "keeper+probe" else None)
                    t0 = time.perf_counter()
                    r = warm_start(model, example_input(spec), zoos[arm], probe=probe, config={"dynamo": False})
                    info.update(parent=r.parent, score=float(r.score), preserved=bool(r.preserved),
                                structure=float(r.structure), warm_s=time.perf_counter() - t0, reason=r.reason,
                                candidates=r.candidates)
                    if r.probe is not None:
                        info.update(probe_s=r.probe["transform_s"] + r.probe["forward_s"], probe=r.probe)
                    lineage = r.lineage()
                hist = train(model, data, args.steps, args.lr, seed, args.eval_every)
                info.update(hist)
                if arm != "cold":
                    exported = export_graph(model, example_input(spec), dynamo=False)
                    zoos[arm].register(exported.onnx, hist["running"][-1], name=f"t{i}",
                                       weights=module_weights(model, exported), lineage=lineage)
                rows.append(info)
                print(f"seed {seed} #{i:2d} {label:26s} {arm:13s} parent {str(info['parent']):5s} "
                      f"sim {info['score']:.2f} struct {info['structure']:.2f} pres {int(info['preserved'])} "
                      f"final {hist['running'][-1]:.3f}/{hist['precise'][-1]:.3f} {hist['seconds']:.1f}s",
                      flush=True)
    return {"rows": rows, "steps": args.steps, "seeds": args.seeds, "eval_every": args.eval_every}


def summarize(res: dict, reading: str) -> dict:
    """Per arm: total speedup, slower-than-cold count, warmed count, per trial steps (``reading``: running or
    precise)."""
    rows, budget = res["rows"], res["steps"]
    cold = {(r["seed"], r["trial"]): r for r in res["rows"] if r["arm"] == "cold"}
    out = {}
    for arm in ARMS[1:]:
        tot_c = tot_a = 0
        slow, warmed, per = 0, 0, []
        for r in rows:
            if r["arm"] != arm:
                continue
            c = cold[(r["seed"], r["trial"])]
            target = c[reading][-1] - 0.01
            sc = steps_to(c[reading], c["at"], target, budget)
            sa = steps_to(r[reading], r["at"], target, budget)
            tot_c, tot_a = tot_c + sc, tot_a + sa
            is_slow = r["parent"] is not None and sa > SLOW * max(sc, 1)
            warmed += r["parent"] is not None
            slow += is_slow
            per.append({**{k: r[k] for k in ("seed", "trial", "arch", "offer", "parent", "score", "structure",
                                            "preserved")}, "cold": sc, "steps": sa, "slow": is_slow,
                        "final": r[reading][-1], "cold_final": c[reading][-1], "probe_s": r.get("probe_s", 0.0)})
        out[arm] = {"speedup": tot_c / max(tot_a, 1), "slow": slow, "warmed": warmed, "trials": len(per), "per": per}
    return out


def report(res: dict, args, wall: float) -> str:
    heads = {"running": summarize(res, "running"), "precise": summarize(res, "precise")}
    cmd = "python scripts/bench_choice.py" + (" --quick" if args.quick else "") + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in (("seeds", args.seeds), ("steps", args.steps))
        if not args.quick and v != {"seeds": 2, "steps": 300}[k])
    lines = ["# Parent choice that predicts the benefit (scripts/bench_choice.py)", "",
             f"Command: `{cmd}` (seeds {args.seeds}, steps {args.steps}, eval every {args.eval_every}, lr {args.lr}); "
             f"wall time {wall / 60:.1f} min on {os.cpu_count()} CPUs ({platform.machine()}).", "",
             "Workload: ResNet-, VGG- and MobileNetV2-style (depthwise) 1-D CNNs on MNIST-1D, arriving interleaved "
             "through the embedded zoo, one zoo per arm (models trained in an arm enter that arm's zoo with their "
             "lineage). SGD with momentum 0.9, cosine decay, batch 128. Target: the cold twin's final accuracy "
             "minus one point, same reading; a warmed trial is slower than cold above 1.25x its twin's steps. "
             "Arms: `similarity` is the choice of earlier versions (similarity buckets then accuracy, floor 0.3), "
             "`keeper` the default (preserved function first, similarity x structure, lineage-aware), "
             "`keeper+probe` adds a data probe (2 training batches, mean loss over 2 SGD steps).", ""]
    for reading, title in (("running", "Headline: eval mode, running BatchNorm statistics"),
                           ("precise", "Beside it: BatchNorm statistics re-estimated for the current weights")):
        s = heads[reading]
        lines += [f"## {title}", "", "| arm | speedup (total cold steps / total steps) | warmed | slower than cold "
                  "(> 1.25x) |", "|---|---|---|---|"]
        for arm, v in s.items():
            lines.append(f"| {arm} | {v['speedup']:.2f}x | {v['warmed']} of {v['trials']} | {v['slow']} |")
        lines.append("")
    lines += ["## Per trial (headline reading)", "",
              "| seed | # | architecture | zoo offers | arm | parent | similarity | structure | preserved | "
              "steps cold / arm | final cold / arm | slower | probe s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, v in heads["running"].items():
        for p in v["per"]:
            lines.append(f"| {p['seed']} | {p['trial']} | {p['arch']} | {p['offer']} | {arm} | {p['parent'] or '-'} | "
                         f"{p['score']:.2f} | {p['structure']:.2f} | {'yes' if p['preserved'] else 'no'} | "
                         f"{p['cold']} / {p['steps']} | {p['cold_final']:.3f} / {p['final']:.3f} | "
                         f"{'**yes**' if p['slow'] else 'no'} | {p['probe_s']:.2f} |")
    probe_s = [p["probe_s"] for p in heads["running"]["keeper+probe"]["per"]]
    epoch_s = [r["seconds"] / res["steps"] * 4000 / 128 for r in res["rows"] if r["arm"] == "cold"]
    lines += ["", f"Probe cost (transforms + scoring): mean {np.mean(probe_s):.2f} s per trial, max "
              f"{np.max(probe_s):.2f} s; one epoch (4000 samples, batch 128) takes {np.mean(epoch_s):.2f} s of "
              "training on average here.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="9 trials, 1 seed, 200 steps")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--out", default="reports")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.steps = 1, 200
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    t0 = time.perf_counter()
    res = run(args)
    wall = time.perf_counter() - t0
    text = report(res, args, wall)
    os.makedirs(args.out, exist_ok=True)
    name = "bench_choice_quick" if args.quick else "bench_choice"
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(res, f, default=float)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
