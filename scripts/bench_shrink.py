"""Which blocks a shallower child should keep: the parent's first or its last, measured on three models.

Dropping blocks cannot preserve a function; what remains of it depends on which blocks the child keeps. For each
case a parent is trained to its plateau budget, then a child with fewer blocks (same widths) starts from the
parent's first blocks or from its last ones (every other tensor copied), and from its own initialisation, and
trains under the same recipe. The report gives the quality right after the warm start and at the end, and which
blocks keeper's alignment keeps (read from a real warm start through a local zoo, noise 0).

Cases: the MNIST-1D ViT-style transformer of keeper_bench.families (4 -> 2 blocks, test accuracy), and the
byte-level GPT-2 and Llama models of keeper_bench.lm (2 -> 1 block, validation loss in nats per byte), each with
its own benchmark's recipe and budget.

Usage:
    python scripts/bench_shrink.py             # 3 cases, 1 seed (about 6 min on one idle core)
    python scripts/bench_shrink.py --seeds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import tempfile
import time
import warnings

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


_BLOCK = re.compile(r"(^|\.)(layers|h)\.(\d+)\.")


def _block_of(key: str) -> int | None:
    m = _BLOCK.search(key)
    return int(m.group(3)) if m else None


def _from_blocks(child, parent_state: dict, blocks: list[int]) -> None:
    """Load ``parent_state`` into ``child``: child block ``i`` from parent block ``blocks[i]``, the rest by name."""
    state = {}
    for key in child.state_dict():
        b = _block_of(key)
        src = key if b is None else _BLOCK.sub(lambda m: f"{m.group(1)}{m.group(2)}.{blocks[b]}.", key, count=1)
        state[key] = parent_state[src]
    child.load_state_dict(state)


class _Case:
    """One shrink: how to build, train and read a model of the case (quality: higher is better)."""

    def __init__(self, name: str, family: str, parent: dict, child: dict):
        self.name, self.family, self.parent, self.child = name, family, parent, child
        self.lm = family in ("gpt2", "llama")

    def build(self, spec: dict, seed: int):
        import torch

        torch.manual_seed(seed)
        if self.lm:
            from keeper_bench.lm import build
            return build(spec)
        from keeper_bench.families import build
        return build(spec)

    def example(self):
        if self.lm:
            from keeper_bench.lm import example_input
            return example_input()
        from keeper_bench.families import example_input
        return example_input(self.parent)

    def train(self, model, data, seed: int) -> float:
        """Train with the case's benchmark recipe and budget; the final reading."""
        if self.lm:
            from keeper_bench.lm import train
            return float(train(model, data, steps=2000, eval_every=2000, seed=seed).losses[-1])
        from keeper_bench.workload import train
        return float(train(model, data, steps=1000, eval_every=1000, seed=seed).final_accuracy)

    def read(self, model, data) -> float:
        if self.lm:
            from keeper_bench.lm import evaluate
            return float(evaluate(model, data)[0])
        from keeper_bench.workload import evaluate
        return float(evaluate(model, data))

    @property
    def metric(self) -> str:
        return "validation loss (nats/byte, lower is better)" if self.lm else "test accuracy (higher is better)"


def _cases() -> list[_Case]:
    vit = {"family": "transformer", "dim": 1, "in_channels": 1, "num_classes": 10, "input_length": 40,
           "d_model": 54, "heads": 2, "ffn": 108, "layers": 4, "patch": 5, "pre_ln": True, "activation": "relu",
           "embedding": "patches"}
    gpt2 = {"family": "gpt2", "d_model": 32, "layers": 2, "heads": 4, "kv_heads": 4, "ffn": 96}
    llama = {"family": "llama", "d_model": 32, "layers": 2, "heads": 4, "kv_heads": 1, "ffn": 64}
    return [_Case("MNIST-1D transformer, 4 -> 2 blocks", "transformer", vit, {**vit, "layers": 2}),
            _Case("GPT-2, 2 -> 1 block", "gpt2", gpt2, {**gpt2, "layers": 1}),
            _Case("Llama, 2 -> 1 block", "llama", llama, {**llama, "layers": 1})]


def _keeper_keeps(case: _Case, parent, parent_state: dict, n_parent: int, n_child: int) -> str:
    """Which parent blocks keeper's warm start gives the child ("first", "last" or "other")."""
    import torch

    from keeper.torch_support import register, warm_start
    from keeper.zoo import Zoo, ZooConfig

    with tempfile.TemporaryDirectory() as d:
        zoo = Zoo(d, ZooConfig(noise=0.0))
        register(parent, case.example(), zoo, 1.0, "parent")
        child = case.build(case.child, 12345)
        warm_start(child, case.example(), zoo)
    for label, blocks in (("first", list(range(n_child))), ("last", list(range(n_parent - n_child, n_parent)))):
        ref = case.build(case.child, 12345)
        _from_blocks(ref, parent_state, blocks)
        if all(torch.equal(a, b) for a, b in zip(child.state_dict().values(), ref.state_dict().values())):
            return label
    return "other"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--out", default="reports", help="directory for bench_shrink.md")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from hf_growth import quiet  # the tests' exporter silencer
    from keeper_bench.lm import stdlib_corpus
    from keeper_bench.workload import mnist1d_dataset

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    data = {"lm": stdlib_corpus(), "mnist": mnist1d_dataset(seed=0, num_samples=4000)}
    rows = []
    for case in _cases():
        d = data["lm" if case.lm else "mnist"]
        n_parent, n_child = case.parent["layers"], case.child["layers"]
        for seed in range(args.seeds):
            parent = case.build(case.parent, seed)
            parent_final = case.train(parent, d, seed=seed * 7 + 1)
            state = parent.state_dict()
            cold = case.build(case.child, seed + 1000)
            start = {"cold": case.read(cold, d)}
            final = {"cold": case.train(cold, d, seed=seed * 7 + 2)}
            for label, blocks in (("first", list(range(n_child))),
                                  ("last", list(range(n_parent - n_child, n_parent)))):
                child = case.build(case.child, seed + 1000)
                _from_blocks(child, state, blocks)
                start[label] = case.read(child, d)
                final[label] = case.train(child, d, seed=seed * 7 + 2)
            with quiet():
                keeps = _keeper_keeps(case, parent, state, n_parent, n_child)
            rows.append((case, seed, parent_final, start, final, keeps))
            print(f"{case.name} seed {seed}: parent {parent_final:.4f}; after the warm start first "
                  f"{start['first']:.4f} last {start['last']:.4f} own init {start['cold']:.4f}; final first "
                  f"{final['first']:.4f} last {final['last']:.4f} cold {final['cold']:.4f}; keeper keeps {keeps}",
                  flush=True)
    wall = time.perf_counter() - t0
    lines = ["# Which blocks a shallower child keeps (scripts/bench_shrink.py)", "",
             f"Command: `python scripts/bench_shrink.py --seeds {args.seeds}`; {wall / 60:.1f} min on one thread "
             f"({platform.machine()}, {os.cpu_count()} CPUs, 1-minute load average at the end "
             f"{os.getloadavg()[0]:.1f}), torch {torch.__version__}.", "",
             "A parent trained with its benchmark's recipe and budget (MNIST-1D: Adam 1000 steps; language: AdamW "
             "2000 steps); a child with fewer blocks starts from the parent's first blocks or from its last ones "
             "(every other tensor copied), or from its own initialisation, and trains again under the same recipe. "
             "`keeper keeps`: which of the two keeper's own warm start gives (a local zoo, noise 0).", "",
             "| case | metric | seed | parent | right after the warm start: first / last / own init | after training: "
             "first / last / cold | keeper keeps |", "|---|---|---|---|---|---|---|"]
    for case, seed, parent_final, start, final, keeps in rows:
        lines.append(f"| {case.name} | {case.metric} | {seed} | {parent_final:.3f} | {start['first']:.3f} / "
                     f"{start['last']:.3f} / {start['cold']:.3f} | {final['first']:.3f} / {final['last']:.3f} / "
                     f"{final['cold']:.3f} | {keeps} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_shrink.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
