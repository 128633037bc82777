"""Heads growth of timm's vision transformers, whose attention packs q, k and v in one Linear laid out as
``(B, N, 3, heads, head size)``: each grows from 2 to 4 heads of the same size (embed 32 -> 64), the parent
registered alone in a zoo and the child warmed with ``warm_start(noise=0)`` through the torch front end, the dynamo
exporter and TorchScript. Prints ``preserved`` and the child's deviation from its parent (max |child - parent| /
max |parent| of eval-mode outputs); a claim deviating by more than 1e-4 is marked OVERCLAIM and the exit status
is 1.

``--child 64,2`` grows the head size instead (16 -> 32, heads kept): exact only where q . k is found and no
rotation slices the heads (EVA-02's RoPE: refused).

Usage: python scripts/check_packed_heads.py [--models vit,deit,beit,eva02,cait] [--child 64,4] [--fused]
(timm must import: vision_libs.import_timm; ``--fused`` keeps timm's scaled_dot_product_attention,
which some exporters cannot write for some of these models.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import nets  # noqa: E402
import keeper  # noqa: E402
from keeper.torch_support import register, warm_start  # noqa: E402
from vision_libs import import_timm  # noqa: E402

ARCH = {"vit": ("vit_tiny_patch16_224", {}), "deit": ("deit_tiny_distilled_patch16_224", {}),
        "beit": ("beit_base_patch16_224", {}), "eva02": ("eva02_tiny_patch14_224", {}),
        "cait": ("cait_xxs24_224", {"depth_token_only": 1})}
EXPORTERS = {"trace": None, "dynamo": True, "torchscript": False}


def build(timm, name: str, d: int, heads: int, fused: bool) -> torch.nn.Module:
    arch, kw = ARCH[name]
    m = timm.create_model(arch, pretrained=False, num_classes=10, img_size=32, patch_size=8, embed_dim=d, depth=2,
                          num_heads=heads, **kw)
    for mod in m.modules():
        if not fused and isinstance(getattr(mod, "fused_attn", None), bool):
            mod.fused_attn = False
    return m.eval()


def grow(timm, name: str, exporter: str, fused: bool, child_size: tuple[int, int]) -> str:
    """One growth, as a printed line (an exporter that fails is reported, not raised)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    parent = nets.trained_like(nets.randomize(build(timm, name, 32, 2, fused), 1), x)
    child = build(timm, name, *child_size, fused)
    dynamo = EXPORTERS[exporter]
    try:
        with tempfile.TemporaryDirectory() as d, nets.quiet(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zoo = keeper.Zoo(d, keeper.ZooConfig(outlier_z=None))
            register(parent, x, zoo, 0.9, name="parent", config={"dynamo": dynamo})
            r = warm_start(child, x, zoo, noise=0.0, config={"dynamo": dynamo})
    except Exception as exc:  # an exporter that cannot write the model: reported as such
        return f"{name:6s} {exporter:11s} export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    with torch.no_grad():
        want = parent(x)
        dev = float((child(x) - want).abs().max() / want.abs().max())
    flag = " OVERCLAIM" if r.preserved and dev > 1e-4 else ""
    why = "" if r.preserved else f"  ({r.reason[:120]})"
    return f"{name:6s} {exporter:11s} parent={r.parent} preserved={r.preserved} deviation={dev:.3g}{flag}{why}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ARCH))
    ap.add_argument("--child", default="64,4", help="the child's embed dim and heads (the parent's: 32,2)")
    ap.add_argument("--fused", action="store_true", help="keep timm's fused attention")
    args = ap.parse_args()
    timm, why = import_timm()
    if timm is None:
        print(f"timm does not import: {why}")
        return 2
    bad = 0
    for name in args.models.split(","):
        for exporter in EXPORTERS:
            line = grow(timm, name, exporter, args.fused, tuple(int(v) for v in args.child.split(",")))
            bad += "OVERCLAIM" in line
            print(line, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
