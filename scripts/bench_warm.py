"""Benchmark the weight transform: its cost at about 1M, 10M and 100M parameters, and how far a warmed child
strays from its parent's function where keeper does not promise to preserve it. This script runs the cases and
writes the report; what each case measures is in keeper_bench: ``transform_cost``, ``deviation``, ``any_size``.

Cost (``keeper_bench.transform_cost``). For two families (a pre-LN transformer and a 1-D ResNet-18 layout,
``keeper_bench.families.sized_spec``) and each size, the child widens the parent by about 1/8 (transformer:
d_model and ffn; ResNet: every stage) and deepens it (one more encoder layer; one more block per stage). Both
models are exported once with torch's TorchScript exporter (eval mode, BatchNorm kept, no constant folding). A
fresh subprocess per pair, which does not import torch, loads the ONNX files and measures, with the models'
initializers already in memory:

* graph: ``graph_from_proto`` of both models; align: ``keeper.align(parent_graph, child_graph)`` (after one
  call that loads the compiled alignment loop);
* copy: ``{k: v.copy() for k, v in parent_inits.items()}``, one plain copy of the parent's weights, the baseline;
* transform: ``keeper.transforms.transfer(parent_graph, parent_inits, child_graph, child_inits, alignment,
  noise=0.0)`` alone (graphs and alignment precomputed). The first call in the process is reported as is; then
  copy and transform are timed ``--reps`` times each, interleaved, after a warm-up call, and the medians are
  compared;
* peak memory of one transform call, two ways: tracemalloc (numpy's array buffers are traced) as the peak traced
  bytes minus those traced before the call; and the resident set, as the high-water mark (VmHWM, reset through
  ``/proc/self/clear_refs`` just before the process's first transform call) minus VmRSS before it.

Targets: transform median <= 3x copy median; tracemalloc peak <= 3x the child's weight bytes.

Deviation (``keeper_bench.deviation``). Small models, parent made "trained-like" (BatchNorm statistics from three
train-mode passes, norm affine parameters drawn from U(0.5, 1.5) / U(-0.3, 0.3)), exported with keeper's
``torch_support.export`` through both exporters, warmed with ``warm_from_parent(noise=0.0, seed=seed)`` and loaded
with ``load_warm``; in eval mode, on a batch of 16 random inputs, deviation = max |parent(x) - child(x)| /
max |parent(x)|, over ``--seeds`` seeds. The cases where keeper preserves the function (ResNet widen, pre-LN
transformer deepen) are the reference: <= 1e-4.

torch, numba and BLAS are pinned to one thread. Prints markdown tables and writes ``reports/bench_warm.md``.

Any size (``--large``, only these cases; ``keeper_bench.any_size``): a GPT-style child of 695M float32 parameters
(2.78 GB, past protobuf's 2 GiB) warmed from a 440M parent whose weights are a memory-mapped safetensors file,
streamed into a file and in memory, against one safetensors load of the child's weights (targets: <= 3x the time,
<= 1.5x the child's weights in private memory), with the depth-growth pair's function preservation; and torch
``warm_start`` of an 86M model end to end against ``load_state_dict`` from disk (target <= 3x).

Usage:
    python scripts/bench_warm.py [--quick] [--reps 7] [--seed 0] [--seeds 3]
    python scripts/bench_warm.py --deviation [--seed 0] [--seeds 3]   # the deviation table alone
    python scripts/bench_warm.py --large
"""

from __future__ import annotations

import os

os.environ["NUMBA_NUM_THREADS"] = "1"  # before numba is imported; the measuring subprocesses inherit it
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from keeper_bench import any_size  # noqa: E402
from keeper_bench.deviation import PRESERVED_MAX, RESNET, TRANSFORMER, deviation_rows  # noqa: E402
from keeper_bench.transform_cost import (COST_FAMILIES, MEMORY_TARGET, SIZES, TIME_TARGET, cost_case,  # noqa: E402
                                         cost_tables, mib, ms)

REPORT = Path(__file__).resolve().parent.parent / "reports" / "bench_warm.md"


def _with_large_section(report: str, section: str | None) -> str:
    """``report`` with its any-size section replaced by ``section`` (kept as it was when None)."""
    head = "## Any size"
    old = REPORT.read_text() if REPORT.exists() else ""
    if section is None:
        section = old[old.index(head):] if head in old else ""
        return report.rstrip("\n") + ("\n\n" + section if section else "\n")
    base = old[:old.index(head)] if head in old else old
    return base.rstrip("\n") + "\n\n" + section


def _with_deviation_rows(rows: list[str], command: str) -> str:
    """The report with the rows of its deviation table replaced, and the command that measured them named."""
    old = REPORT.read_text()
    head = "## Deviation where"
    start = old.index(head)
    end = old.find("\n## ", start + len(head))
    end = len(old) if end < 0 else end
    section = old[start:end]
    table = section.index("|---|")
    table = section.index("\n", table) + 1
    note = f"Rows measured by `{command}` (this section alone; the rest of the report is from the run above).\n\n"
    intro = section[:section.index("| case |")]
    if intro.endswith(note):  # a previous --deviation run's note: replaced, not repeated
        intro = intro[:-len(note)]
    section = intro + note + section[section.index("| case |"):table] + "\n".join(rows) + "\n"
    return old[:start] + section + old[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the 100M-parameter models")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per measurement (medians reported)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the models (cost) and the first deviation seed")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per deviation case")
    ap.add_argument("--large", action="store_true",
                    help="run only the any-size cases (a 695M-parameter child past 2 GiB, torch warm_start at 86M); "
                         "needs about 8 GB of memory and 6 GB of disk")
    ap.add_argument("--deviation", action="store_true",
                    help="run only the deviation cases and replace that table in the report")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.seeds < 1:
        ap.error("--reps and --seeds must be at least 1")
    if args.large:
        with tempfile.TemporaryDirectory(prefix="bench_warm_large_", dir=os.environ.get("KEEPER_BENCH_DIR")) as tmp:
            section = any_size.run_large(Path(tmp))
        print(section)
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(_with_large_section("", section))
        print(f"written to {REPORT}")
        return 0

    import torch

    torch.set_num_threads(1)
    logging.getLogger("torch").setLevel(logging.ERROR)
    if args.deviation:
        rows, ok_ref = deviation_rows(range(args.seed, args.seed + args.seeds))
        command = "python scripts/bench_warm.py --deviation" + (f" --seed {args.seed}" if args.seed else "") + \
            (f" --seeds {args.seeds}" if args.seeds != 3 else "")
        REPORT.write_text(_with_deviation_rows(rows, command))
        print(f"written to {REPORT}")
        return 0 if ok_ref else 1
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    sizes = SIZES[:2] if args.quick else SIZES

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_warm_") as tmp:
        for size in sizes:
            for family in COST_FAMILIES:
                r = cost_case(family, size, args.reps, args.seed, Path(tmp))
                rows.append(r)
                print(f"cost {family} {size:,}: copy {ms(statistics.median(r['copy_s']))} ms, transform "
                      f"{ms(statistics.median(r['transform_s']))} ms, align "
                      f"{ms(statistics.median(r['align_s']))} ms, peak {mib(r['traced_peak'])} "
                      f"(export {r['export_s']:.1f} s)", flush=True)
    cost_s = time.perf_counter() - t0

    seeds = range(args.seed, args.seed + args.seeds)
    dev_rows, ok_ref = deviation_rows(seeds)
    total_s = time.perf_counter() - t0

    cost_lines, ok_cost = cost_tables(rows)
    command = "python scripts/bench_warm.py" + (" --quick" if args.quick else "") + \
        (f" --reps {args.reps}" if args.reps != 7 else "") + (f" --seed {args.seed}" if args.seed else "") + \
        (f" --seeds {args.seeds}" if args.seeds != 3 else "")
    specs = "\n".join(f"- {r['family']} {r['size'] / 1e6:g}M: parent {r['parent_spec']} -> child {r['child_spec']}; "
                      f"{r['parent_layers']} -> {r['child_layers']} weighted layers, similarity {r['score']:.3f}, "
                      f"{r['tensors']} child tensors, operators {', '.join(r['operators'])}; "
                      f"build + export {r['export_s']:.1f} s" for r in rows)
    missed = [f"{r['family']} {r['size'] / 1e6:g}M" for r in rows
              if statistics.median(r["transform_s"]) > TIME_TARGET * statistics.median(r["copy_s"])]
    mem_ok = all(r["traced_peak"] <= MEMORY_TARGET * r["child_bytes"] for r in rows)
    summary = (f"Targets: time met for {len(rows) - len(missed)} of {len(rows)} models"
               + (f" (not met: {', '.join(missed)})" if missed else "")
               + f"; memory {'met for all' if mem_ok else 'NOT met for some'}; "
               + f"preserving references {'met' if ok_ref else 'NOT met'}.")
    tr = TRANSFORMER
    dev_models = (f"Transformer parent: d_model {tr['d_model']}, {tr['heads']} heads, ffn {tr['ffn']}, "
                  f"{tr['layers']} layers, patch {tr['patch']} on length-{tr['input_length']} signals; ResNet "
                  f"parent: widths {RESNET['widths']}, blocks {RESNET['blocks']}, kernel {RESNET['kernel']}, "
                  f"{RESNET['input_length']} x {RESNET['input_length']} images with {RESNET['in_channels']} "
                  "channels.")
    text = f"""# Warm-start transform benchmark

Command: `{command}`; {os.cpu_count()} cores ({platform.processor() or platform.machine()}), torch, numba and BLAS
pinned to 1 thread; Python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}. 1-minute load
average {load:.1f} at the start (other jobs on the machine add noise: times are medians of {args.reps} runs). Cost
part {cost_s:.0f} s, whole run {total_s:.0f} s.

{summary}

## Transform cost

What is timed is `keeper.transforms.transfer(parent_graph, parent_inits, child_graph, child_inits, alignment,
noise=0.0)` alone, on initializers already in memory (graphs and alignment precomputed; `warm_from_parent` adds
ONNX parsing, graph extraction and alignment, timed in the graphs and align columns). The baseline **copy** is
`{{k: v.copy() for k, v in parent_inits.items()}}`, one plain copy of every parent initializer. Copy and
transform: median of {args.reps} runs, interleaved, after one warm-up call each in the same process (a copy into
memory the allocator already holds is faster than one into fresh pages; interleaving gives both the same
conditions). **First call**: the process's first transform, which also faults in fresh pages for its output. **Peak traced**:
tracemalloc's peak minus the bytes traced before one transform call (numpy's array buffers are traced; inputs
excluded). **Peak RSS extra**: the resident high-water mark during the first transform call (VmHWM reset via
`/proc/self/clear_refs`) minus VmRSS before it; pages allocated zeroed and never written (identity-filled
layers) are not resident, so it can be below the traced peak. Each pair is measured in its own subprocess that
does not import torch; the models are exported by TorchScript with their initial weights (values do not change
the cost). Targets: transform <= {TIME_TARGET:g}x copy; peak traced <= {MEMORY_TARGET:g}x the child's weight bytes.

{chr(10).join(cost_lines)}

Models (keeper_bench.families.sized_spec, dim 1, input length 40; child = about 1/8 wider and one layer or one block
per stage deeper):

{specs}

## Deviation where preservation is impossible or not promised

Eval mode, `noise=0`, parent made trained-like (BatchNorm statistics from three train-mode passes, norm affine
parameters from U(0.5, 1.5) / U(-0.3, 0.3)); deviation = max |parent(x) - child(x)| / max |parent(x)| over the
logits of 16 random inputs, for the warmed child and, as the scale of "no inheritance", for the same child with
its own initial weights: median [min, max] over seeds {seeds.start}..{seeds.stop - 1} (models, inputs and keeper's unit
maps). Score: keeper's similarity (fraction of child parameter elements inherited). {dev_models} Rows marked
preserving are the reference: keeper promises <= {PRESERVED_MAX:g} there.

| case | change | exporter | deviation (warmed) | deviation (child's own init) | score | note |
|---|---|---|---|---|---|---|
{chr(10).join(dev_rows)}
"""
    print(text)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(_with_large_section(text, None))
    print(f"written to {REPORT}")
    return 0 if ok_cost and ok_ref else 1


if __name__ == "__main__":
    sys.exit(main())
