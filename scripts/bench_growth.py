"""Growth pairs of real architectures: how far a warmed, grown child strays from its parent's function, beside the
same child at its own initialisation, with both torch exporters.

Models are Hugging Face transformers classes built from small configs (random initialisation, nothing from the
hub; ``hf_growth``): GPT-2, BERT, DistilBERT, Llama (GQA, RoPE, SwiGLU, RMSNorm), the T5 encoder,
ViT, DeiT (with its distillation token), Swin, and the CNNs ResNet, MobileNetV2, EfficientNet and ConvNeXt. For
each family the pairs of ``hf_growth.PAIRS``: ``depth`` (more blocks), ``ffn`` (a wider
feed-forward or expansion), ``d_model x2`` / ``channels x2`` (the residual stream doubled; transformers double
their heads too, head size kept) and ``x1.5`` (a factor that does not divide). Then keeper_bench's own families
(``family_growth``: ResNet, VGG, MobileNetV2, the transformer encoder, MLPs with and without norms),
by integer factors and by factors that do not divide.

Per pair and exporter: the parent is made trained-like (``hf_growth.trained_like``), both are exported with
``keeper.torch_support.export``, the child is warmed with ``warm_from_parent(noise=0.0)`` and loaded with
``load_warm``; deviation = max |parent(x) - child(x)| / max |parent(x)| in eval mode on the family's example
input, for the warmed child ("warm") and for the child at its own initialisation ("init"). "not read" counts the
module tensors keeper did not inherit (``WarmResult.missing``); a warm deviation is only about growth where that
count is 0. ``exact`` means warm <= 1e-4. ``preserved`` is keeper's claim (``WarmResult.preserved``): a claim on a
pair that is not exact is counted as an overclaim.

Text models take ``input_ids`` alone, as users call them; GPT-2 and BERT are also run with ``position_ids`` (and
BERT's ``token_type_ids``) given as inputs, so that their position tables are read by a data index and the rows
measure the growth operators alone.

Prints a markdown table and writes ``reports/growth.md``.

Usage:
    python scripts/bench_growth.py [--quick] [--families "gpt2,llama,keeper_bench resnet"]
        [--exporters dynamo,torchscript]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the growth pairs the tests walk

import torch  # noqa: E402

import family_growth  # noqa: E402
import hf_growth  # noqa: E402

EXACT = 1e-4
# runs beside the families' defaults: position (and token-type) ids as inputs, the tables read as embeddings
VARIANTS = {"gpt2": [{}, {"positions": True}], "bert": [{}, {"positions": True}]}
ALL_FAMILIES = list(hf_growth.FAMILIES) + [f"keeper_bench {f}" for f in family_growth.PAIRS]


def _pairs(families: list[str], quick: bool) -> list[tuple[str, str, dict, Callable[[bool], object]]]:
    """(model label, growth, child sizes, run(dynamo) -> GrowthResult) per pair of the named families: the
    Hugging Face ones (``hf_growth``), then keeper_bench's own (``family_growth``, labelled ``keeper_bench``)."""
    out = []
    for family in families:
        if family in hf_growth.PAIRS:
            for variant in VARIANTS.get(family, [{}]):
                pairs = hf_growth.PAIRS[family]
                if quick:
                    pairs = pairs[:1] + [p for p in pairs if p[0] in ("d_model x2", "channels x2")]
                for growth, parent, child in pairs:
                    out.append((family + (" (positions as input)" if variant else ""), growth, child,
                                functools.partial(_hf, family, {**variant, **parent}, child)))
        else:
            name = family.removeprefix("keeper_bench ")
            pairs = family_growth.PAIRS[name][:1] if quick else family_growth.PAIRS[name]
            for growth, parent, child in pairs:
                changed = {k: v for k, v in child.items() if parent.get(k) != v}
                out.append((f"keeper_bench {name}", growth, changed,
                            functools.partial(family_growth.growth_deviation, parent, child)))
    return out


def _scale_pairs() -> list[tuple[str, str, dict, Callable[[bool], object]]]:
    """Growth by factors that do not divide at language-model sizes (d_model 256-512, ffn 4x): GPT-2 with packed
    attention, Llama with grouped key-value heads and RMSNorm; and keeper_bench's CNNs at x1.5."""
    out = []
    for fam, growth in (("resnet", "widths x1.5"), ("vgg", "widths x1.5"),
                        ("mobilenetv2", "expansion 4 -> 6, widths x1.5")):
        parent, child = next((p, c) for n, p, c in family_growth.PAIRS[fam] if n == growth)
        changed = {k: v for k, v in child.items() if parent.get(k) != v}
        out.append((f"keeper_bench {fam}", growth, changed,
                    functools.partial(family_growth.growth_deviation, parent, child)))
    for fam, growth, parent, child in (
            ("gpt2", "d_model 256 -> 384, heads 4 -> 6", dict(d=256, heads=4, ffn=1024),
             dict(d=384, heads=6, ffn=1536)),
            ("gpt2", "d_model 384 -> 512, heads 6 -> 8", dict(d=384, heads=6, ffn=1536),
             dict(d=512, heads=8, ffn=2048)),
            ("llama", "d_model 256 -> 384, heads 4 -> 6, kv 2 -> 3", dict(d=256, heads=4, kv_heads=2, ffn=1024),
             dict(d=384, heads=6, kv_heads=3, ffn=1536))):
        out.append((fam, growth, child, functools.partial(_hf, fam, parent, child)))
    return out


def _hf(family: str, parent: dict, child: dict, dynamo: bool) -> hf_growth.GrowthResult:
    return hf_growth.growth_deviation(family, parent, child, dynamo=dynamo)


def _rows(pairs: list[tuple[str, str, dict, Callable[[bool], object]]], exporters: list[str]) -> list[dict]:
    rows = []
    for label, growth, child, run in pairs:
        for exporter in exporters:
            t0 = time.perf_counter()
            try:
                r = run(dynamo=exporter == "dynamo")
                row = dict(warm=r.warm, init=r.init, score=r.score, missing=r.missing, preserved=r.preserved,
                           why=r.why, error="")
            except Exception as exc:  # a pair that fails is a row of the report, not the end of it
                row = dict(warm=float("nan"), init=float("nan"), score=float("nan"), missing=[], preserved=False,
                           why="", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            row.update(family=label, growth=growth, child=child, exporter=exporter,
                       seconds=time.perf_counter() - t0)
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _sizes(d: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) or "defaults"


def _line(row: dict) -> str:
    if row["error"]:
        verdict = f"error: {row['error']}"
    else:  # a pair keeper does not claim says why (the first growth the rules refuse)
        verdict = "exact" if row["warm"] <= EXACT else ""
        if row["why"] and row["warm"] > EXACT:
            verdict = f"not claimed: {row['why']}"
    missing = row["missing"]
    shown = ", ".join(missing[:3]) + (f" +{len(missing) - 3}" if len(missing) > 3 else "")
    return (f"| {row['family']} | {row['growth']} ({_sizes(row['child'])}) | {row['exporter']} | "
            f"{row['warm']:.2e} | {row['init']:.2f} | {row['score']:.3f} | {'yes' if row['preserved'] else 'no'} | "
            f"{len(missing)}"
            f"{' (' + shown + ')' if missing else ''} | {verdict} | {row['seconds']:.1f} |")


HEADER = ("| model | growth (child sizes) | exporter | warm | init | similarity | preserved | not read | | s |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="depth and x2 growth only")
    ap.add_argument("--families", default=",".join(ALL_FAMILIES))
    ap.add_argument("--exporters", default="dynamo,torchscript")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "reports" / "growth.md"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    families = [f for f in args.families.split(",") if f]
    exporters = [e for e in args.exporters.split(",") if e]
    print(HEADER, flush=True)
    t0 = time.perf_counter()
    rows = _rows(_pairs(families, args.quick), exporters)
    ok = [r for r in rows if not r["error"]]
    exact = [r for r in ok if r["warm"] <= EXACT]
    clean = [r for r in ok if not r["missing"]]
    clean_exact = [r for r in clean if r["warm"] <= EXACT]
    clean_other = sorted({r["growth"] for r in clean if r["warm"] > EXACT})
    claimed = [r for r in ok if r["preserved"]]
    overclaims = [r for r in claimed if not r["warm"] <= EXACT]
    summary = (f"{len(exact)}/{len(rows)} pairs exact (warm deviation <= {EXACT:g}); {len(clean)}/{len(rows)} with "
               f"every module tensor read, of which {len(clean_exact)} exact"
               + (f" (the others: {', '.join(clean_other)})" if clean_other else "")
               + f"; flagged preserved {len(claimed)}, of which {len(claimed) - len(overclaims)} exact "
               f"({len(overclaims)} overclaims); {len(rows) - len(ok)} failed to run; "
               f"warm below init in {sum(r['warm'] < r['init'] for r in ok)}/{len(ok)}.")
    print(summary)
    scale = [] if args.quick else _rows(_scale_pairs(), exporters)
    import transformers

    text = [
        "# Growth pairs of real architectures",
        "",
        f"Command: `python scripts/bench_growth.py{' --quick' if args.quick else ''}"
        f"{' --families ' + repr(args.families) if args.families != ','.join(ALL_FAMILIES) else ''}`; "
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"transformers {transformers.__version__}; {time.perf_counter() - t0:.0f} s.",
        "",
        "Max relative deviation of the child's logits from the trained-like parent's: `warm` is keeper's warm start "
        "(noise 0), `init` the child at its own initialisation; `not read` counts module tensors keeper did not "
        "inherit (their names follow), so a warm figure measures the growth operators alone only where it is 0. "
        "`preserved` is what keeper claims (`WarmResult.preserved`): it must imply `warm` <= 1e-4. "
        "Transformers' `d_model x2` doubles the heads and keeps the head size; `x1.5` is a factor that does not "
        "divide (exact where `preserved` says so). A pair that is not exact says why keeper does not claim it (the "
        "first growth its rules refuse, `keeper.preservation.assess`).",
        "",
        summary,
        "",
        HEADER,
        *[_line(r) for r in rows],
        "",
    ]
    if scale:
        claimed = [r for r in scale if r["preserved"]]
        text += ["## At language-model sizes", "",
                 "Factors that do not divide with d_model 256-512 (GPT-2's packed attention; Llama's grouped key-value "
                 "heads, RoPE, SwiGLU and RMSNorm) and keeper_bench's CNNs at x1.5: "
                 f"{sum(r['warm'] <= EXACT for r in scale if not r['error'])}/{len(scale)} exact, {len(claimed)} "
                 f"flagged preserved, {sum(not r['warm'] <= EXACT for r in claimed)} overclaims.", "",
                 HEADER, *[_line(r) for r in scale], ""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
