"""Same answers from the torch front end and the dynamo exporter, over keeper's catalogue.

For every model: the LayerGraph from one forward pass (keeper.torch_support.trace) against the dynamo exporter's
(trace_check.graph_differences); for every pair: a parent registered and a child warmed through
each path (same parent, same similarity to 4 places, same warmed weights). Models the front end cannot read are
listed with the reason (they fall back to the exporter at run time).

Catalogue: tests/nets.py's family specs (MLP, ResNet, VGG, MobileNetV2, transformer), the Hugging Face catalogue
(hf_catalogue), the torchvision / timm models where those import (vision_catalogue; run
with the environment of reports/coverage.md: ``PYTHONPATH=. /tmp/tvenv/bin/python scripts/check_trace.py``), and
both directions of every growth pair of hf_growth (reports/growth.md)
and of each family (base spec -> wider).

Usage: python scripts/check_trace.py [--only NAME ...] [--no-warm] [--fallbacks]
Each dynamo export takes seconds: the whole catalogue takes many minutes on 2 cores. ``--fallbacks`` runs no
exporter: it counts the models the front end cannot read (they would fall back to the exporter), on the CPU and
with torch's default device set to ``meta`` around the trace of the CPU module (what a user's
``torch.set_default_device("cuda")`` does on a GPU machine), in seconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import nets  # noqa: E402
from vision_libs import import_torchvision  # noqa: E402

import_torchvision()  # first: a torchvision that fails at import breaks transformers' vision models
import hf_catalogue  # noqa: E402
import hf_growth  # noqa: E402
from trace_check import compare_graphs, front_end_graph, graph_differences, warm_differences  # noqa: E402

WIDER = {"mlp": {"widths": [48, 24]}, "resnet": {"widths": [12, 24]}, "vgg": {"widths": [12, 24]},
         "mobilenetv2": {"widths": [12, 24]}, "transformer": {"ffn": 48}}


def models():
    """(name, builder of (module, args)) for every model; built only when checked."""
    for fam, spec in {**nets.BASE_SPECS, **nets.VARIANT_SPECS}.items():
        yield f"family/{fam}", lambda spec=spec: (lambda m, x: (m, (x,)))(*nets.build(spec))
    for name in hf_catalogue.CATALOGUE:
        yield f"hf/{name}", lambda name=name: hf_catalogue.build(name, seed=1)
    vision, skipped = hf_catalogue.optional_catalogue()
    for lib, why in skipped.items():
        print(f"left out {lib}: {why}", flush=True)
    for name in vision:
        yield f"vision/{name}", lambda name=name: hf_catalogue.build(name, 1, vision)


def pairs():
    for fam, spec in nets.BASE_SPECS.items():
        small, x = nets.build(spec, seed=1)
        big, _ = nets.build({**spec, **WIDER[fam]}, seed=2)
        yield f"family/{fam} base->wider", small, big, (x,)
        yield f"family/{fam} wider->base", big, small, (x,)
    for fam, growths in hf_growth.PAIRS.items():
        for growth, p_sizes, c_sizes in growths:
            a, args = hf_growth.build(fam, **p_sizes)
            b, _ = hf_growth.build(fam, **c_sizes)
            hf_growth.trained_like(a, 1), hf_growth.trained_like(b, 2)
            yield f"growth/{fam} {growth}", a, b, args
            yield f"growth/{fam} {growth} (reverse)", b, a, args


def fallbacks(keep) -> int:
    """Which models the front end cannot read (export_graph would fall back to the exporter), on the CPU and with
    torch's default device set to meta around the trace of the CPU module; no exporter runs."""
    counts, total = {"cpu": 0, "meta": 0, "differ": 0}, 0
    for name, make in models():
        if not keep(name):
            continue
        module, args = make()
        total += 1
        plain = front_end_graph(module, args)
        with torch.device("meta"):
            meta = front_end_graph(module, args)
        differ = isinstance(meta, tuple) and isinstance(plain, tuple) and compare_graphs(*plain, *meta)
        counts["cpu"] += isinstance(plain, str)
        counts["meta"] += isinstance(meta, str)
        counts["differ"] += bool(differ)
        meta_says = ("FALLS BACK: " + meta if isinstance(meta, str) else
                     "DIFFERENT GRAPH: " + "; ".join(differ)[:200] if differ else "read, same graph")
        print(f"{name:34s} cpu: {'read' if isinstance(plain, tuple) else 'FALLS BACK: ' + plain}", flush=True)
        print(f"{'':34s} meta default device: {meta_says}", flush=True)
    print(f"\nfall back to the exporter, of {total} models: cpu {counts['cpu']}, meta default device "
          f"{counts['meta']}; under a meta default device, read with another graph: {counts['differ']}")
    return 1 if any(counts.values()) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="substrings of the names to check")
    ap.add_argument("--no-warm", action="store_true", help="compare graphs only")
    ap.add_argument("--fallbacks", action="store_true",
                    help="trace only: count the models that fall back, on the CPU and under a meta default device")
    opts = ap.parse_args()
    keep = (lambda name: any(s in name for s in opts.only)) if opts.only else (lambda name: True)
    if opts.fallbacks:
        return fallbacks(keep)
    bad, fell_back = 0, []
    torch.manual_seed(0)
    for name, make in models():
        if not keep(name):
            continue
        module, args = make()
        check = graph_differences(module, args)
        if check.fallback:
            fell_back.append((name, check.fallback))
            print(f"{name:32s} FALLS BACK: {check.fallback}", flush=True)
            continue
        status = "same graph" if not check.differences else "DIFFERENT: " + "; ".join(check.differences)[:400]
        bad += bool(check.differences)
        print(f"{name:32s} trace {check.trace_s * 1e3:7.1f} ms  dynamo {check.dynamo_s:5.2f} s  {status}",
              flush=True)
    if not opts.no_warm:
        for name, parent, child, args in pairs():
            if not keep(name):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                diff = warm_differences(parent, child, args, Path(tmp))
            bad += bool(diff)
            print(f"{name:40s} {'same warm' if not diff else 'DIFFERENT: ' + '; '.join(diff)[:400]}", flush=True)
    print(f"\n{bad} difference(s); {len(fell_back)} model(s) fall back to the exporter")
    for name, reason in fell_back:
        print(f"  {name}: {reason}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
