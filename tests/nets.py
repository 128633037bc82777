"""Models for the graph, matching and safety tests.

Two sources, both cheap to reuse:

* torch models (the :mod:`keeper_bench.families` builders plus a few nets for ops the families lack), exported with
  either torch exporter in either of two modes and cached for the whole test session (a dynamo export costs
  seconds); ``"eval"`` is what users get from ``torch.onnx.export`` by default (BatchNorm folded into the conv),
  ``"keep"`` is keeper's own setting that keeps BatchNorm;
* hand-built ``onnx.helper`` CNNs drawn from a tiny block language (:func:`cnn_onnx`), fast enough for property
  tests. Width-preserving blocks can be dropped to make a sub-network (:func:`drop_blocks`).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from keeper_bench import families
from hf_growth import quiet  # noqa: F401 (the tests' nets.quiet)
from onnx_mlp import mlp_onnx  # noqa: F401 (the tests' nets.mlp_onnx)

EXPORTERS = ("torchscript", "dynamo")
MODES = ("eval", "keep")


# ----------------------------------------------------------------------------------------------- torch export


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every float parameter and buffer distinct random values, as training would.

    Fresh modules hold many equal tensors (LayerNorm ones, zero biases) that the exporters deduplicate or drop;
    trained models do not, and those are the models the zoo holds.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, v in model.state_dict().items():
            if torch.is_floating_point(v):
                r = torch.rand(v.shape, generator=gen)
                v.copy_(r + 0.5 if name.endswith("running_var") else (r - 0.5) * 0.2)
    return model


def export_onnx(model: nn.Module, x: torch.Tensor, exporter: str, mode: str) -> bytes:
    """ONNX bytes of ``model``: ``mode`` "eval" is the default user export (BatchNorm folded), "keep" keeper's."""
    assert exporter in EXPORTERS and mode in MODES
    f = io.BytesIO()
    was_training = model.training
    with quiet():
        if exporter == "dynamo" and mode == "eval":
            model.eval()
            torch.onnx.export(model, (x,), f, dynamo=True)
        elif exporter == "dynamo":
            model.train()
            torch.onnx.export(model, (x,), f, dynamo=True, optimize=False)
        elif mode == "eval":
            model.eval()
            torch.onnx.export(model, (x,), f, dynamo=False)
        else:
            model.train()
            torch.onnx.export(model, (x,), f, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False)
    model.train(was_training)
    return f.getvalue()


# Small specs of every family (one stage of each kind of block; both exporters take seconds on these).
BASE_SPECS: dict[str, dict[str, Any]] = {
    "resnet": {"family": "resnet", "dim": 2, "in_channels": 3, "num_classes": 5, "input_length": 8,
               "widths": [8, 16], "blocks": [2, 1], "kernel": 3},
    "vgg": {"family": "vgg", "dim": 2, "in_channels": 3, "num_classes": 5, "input_length": 8,
            "widths": [8, 16], "depths": [2, 2], "kernel": 3},
    "mobilenetv2": {"family": "mobilenetv2", "dim": 2, "in_channels": 3, "num_classes": 5, "input_length": 8,
                    "stem_width": 8, "widths": [8, 16], "blocks": [2, 1], "expansion": 2, "kernel": 3,
                    "head_width": 32},
    "transformer": {"family": "transformer", "dim": 1, "in_channels": 1, "num_classes": 5, "input_length": 16,
                    "d_model": 16, "heads": 2, "ffn": 32, "layers": 2, "patch": 4},
    "mlp": {"family": "mlp", "dim": 1, "in_channels": 1, "num_classes": 5, "input_length": 16,
            "widths": [32, 16]},
}


def spec(family: str, **overrides: Any) -> dict[str, Any]:
    return {**BASE_SPECS[family], **overrides}


# The family variants whose forward takes other code paths than the base specs' (post-LN and token-embedding
# transformers, normed MLPs, 1-d convolutions): the torch front end's catalogue reads them too.
VARIANT_SPECS: dict[str, dict[str, Any]] = {
    "transformer-post-ln": spec("transformer", pre_ln=False),
    "transformer-tokens-gelu": spec("transformer", embedding="tokens", vocab_size=32, activation="gelu"),
    "mlp-layernorm": spec("mlp", norm="layernorm"),
    "mlp-batchnorm": spec("mlp", norm="batchnorm"),
    "resnet-1d": spec("resnet", dim=1, in_channels=1, input_length=16),
}


def _key(s: dict[str, Any]) -> str:
    return json.dumps(s, sort_keys=True)


def build(s: dict[str, Any], seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """A randomized model of spec ``s`` and an example input (both deterministic)."""
    torch.manual_seed(seed)
    model = randomize(families.build(s), seed)
    torch.manual_seed(seed)
    return model, families.example_input(s)


def param_count(s: dict[str, Any]) -> int:
    model, _ = build(s)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _disk_cached(make):
    """Keep exports in memory for the session, and on disk when KEEPER_TEST_EXPORT_CACHE names a folder (for quick
    reruns while developing; off by default, so a run always tests the installed torch)."""
    @functools.lru_cache(maxsize=None)
    def cached(*args: str) -> bytes:
        folder = os.environ.get("KEEPER_TEST_EXPORT_CACHE")
        if not folder:
            return make(*args)
        digest = hashlib.sha256(json.dumps([torch.__version__, make.__name__, *args]).encode()).hexdigest()[:24]
        path = Path(folder) / f"{digest}.onnx"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(make(*args))
        return path.read_bytes()
    return cached


@_disk_cached
def _family_onnx(key: str, exporter: str, mode: str) -> bytes:
    model, x = build(json.loads(key))
    return export_onnx(model, x, exporter, mode)


def family_onnx(s: dict[str, Any], exporter: str = "torchscript", mode: str = "keep") -> bytes:
    """Exported bytes of the family model ``s``, cached for the session."""
    return _family_onnx(_key(s), exporter, mode)


# ----------------------------------------------------------------------------------------------- extra nets

class BranchNet(nn.Module):
    """Inception-style concat of three branches, a Split (chunk) into two convs, a residual Add, grouped and
    depthwise (multiplier 2) convs, a ConvTranspose, max/avg/adaptive pooling and assorted activations."""

    def __init__(self, width: int = 16):
        super().__init__()
        w = width
        self.stem = nn.Conv2d(3, w, 3, padding=1)
        self.b1, self.b2 = nn.Conv2d(w, w // 2, 1), nn.Conv2d(w, w, 3, padding=1)
        self.b3 = nn.Conv2d(w, w // 2, 5, padding=2)
        self.mix = nn.Conv2d(2 * w, w, 1)
        self.h1, self.h2 = nn.Conv2d(w // 2, w // 2, 3, padding=1), nn.Conv2d(w // 2, w // 2, 3, padding=1)
        self.grouped = nn.Conv2d(w, w, 3, padding=1, groups=4, bias=False)
        self.dw = nn.Conv2d(w, 2 * w, 3, padding=1, groups=w)
        self.bn = nn.BatchNorm2d(2 * w)
        self.up = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
        self.fc = nn.Linear(w, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = torch.cat([self.b1(x), self.b2(x), self.b3(x)], dim=1)
        x = nn.functional.gelu(self.mix(x))
        a, b = torch.chunk(x, 2, dim=1)
        x = torch.cat([self.h1(a), self.h2(b)], dim=1) + x
        x = nn.functional.max_pool2d(nn.functional.silu(self.grouped(x)), 2)
        x = nn.functional.hardswish(self.bn(self.dw(x)))
        x = nn.functional.leaky_relu(self.up(x))
        x = nn.functional.avg_pool2d(x, 2)
        return self.fc(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


class TokenEncoder(nn.Module):
    """Embedding (Gather) -> nn.MultiheadAttention block -> nn.TransformerEncoder -> bias-free LayerNorm -> head."""

    def __init__(self, vocab: int = 40, d: int = 16, heads: int = 2, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.enc = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True, activation="gelu"),
            layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, 3, bias=False)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        h = self.emb(t)
        a, _ = self.mha(h, h, h, need_weights=False)
        return self.head(self.norm(self.enc(h + a)).mean(dim=1))


def _rope(t: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of (B, heads, N, head size): its tables are sized by the head size."""
    half = t.shape[-1] // 2
    ang = torch.arange(t.shape[-2], dtype=t.dtype)[:, None] * 100.0 ** (-torch.arange(half, dtype=t.dtype) / half)
    cos, sin = ang.cos().repeat(1, 2), ang.sin().repeat(1, 2)
    return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin


class _UnbindAttention(nn.Module):
    """timm's ViT attention: one Linear packs q, k and v; its output is reshaped to (B, N, 3, heads, head size),
    permuted to put the 3 first and unbound (``unpack="index"``: taken as t[0], t[1], t[2]); ``rope``: q and k
    rotated (EVA-02's RoPE), so q . k is not a product of the parts themselves."""

    def __init__(self, d: int, heads: int, unpack: str, rope: bool = False):
        super().__init__()
        self.heads, self.unpack, self.rope = heads, unpack, rope
        self.norm, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        t = self.qkv(self.norm(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = t.unbind(0) if self.unpack == "unbind" else (t[0], t[1], t[2])
        if self.rope:
            q, k = _rope(q), _rope(k)
        a = (q @ k.transpose(-2, -1) * (c // self.heads) ** -0.5).softmax(-1)
        return x + self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


class UnbindViT(nn.Module):
    """Tokens -> Linear embedding -> two pre-LN attention blocks packed as timm's ViT packs them -> mean -> head."""

    def __init__(self, d: int = 32, heads: int = 2, unpack: str = "unbind", rope: bool = False):
        super().__init__()
        self.emb = nn.Linear(8, d)
        self.blocks = nn.Sequential(*(_UnbindAttention(d, heads, unpack, rope) for _ in range(2)))
        self.head = nn.Linear(d, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.emb(x)).mean(dim=1))


EXTRA = {
    "branchnet": (BranchNet, lambda: torch.randn(2, 3, 8, 8)),
    "tokens": (TokenEncoder, lambda: torch.randint(0, 40, (2, 6))),
    "unbind": (UnbindViT, lambda: torch.randn(2, 5, 8)),
}


def extra_model(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    cls, make_x = EXTRA[name]
    torch.manual_seed(seed)
    model = randomize(cls(), seed)
    return model, make_x()


@_disk_cached
def _extra_onnx(name: str, exporter: str, mode: str) -> bytes:
    model, x = extra_model(name)
    return export_onnx(model, x, exporter, mode)


def extra_onnx(name: str, exporter: str = "torchscript", mode: str = "keep") -> bytes:
    """Exported bytes of the extra net ``name``, cached for the session."""
    return _extra_onnx(name, exporter, mode)


# ----------------------------------------------------------------------------------------------- hand-built graphs
#
# A block is a tuple; the channel count flows from one block to the next:
#   ("conv", cout, k, bn)   conv k x k (+ BatchNorm) + Relu
#   ("res", k)              conv-BN-Relu-conv-BN, Add the input, Relu          (keeps width)
#   ("branch", widths, k)   parallel convs (1x1, k x k, 1x1, ...) concatenated (width = sum of widths)
#   ("split",)              Split in two halves, a 3x3 conv on each, Concat    (keeps width; needs an even width)
#   ("dw", k)               depthwise conv + BN + Relu                          (keeps width)
#   ("gate",)               x * Sigmoid(conv1x1(x)) (a Mul merge)               (keeps width)
#   ("pool",)               AveragePool 3x3, stride 1, same padding            (keeps width)
# The head is GlobalAveragePool -> Flatten -> Gemm (transB=1) -> Relu -> MatMul + Add -> LayerNormalization.

WIDTH_KEEPING = ("res", "split", "dw", "gate", "pool")


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def weight(self, shape: Sequence[int], prefix: str = "w") -> str:
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(self.rng.normal(size=shape).astype(np.float32), n))
        return n

    def ints(self, values: Sequence[int]) -> str:
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), n))
        return n

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.name("n_" + op), **attrs))
        return outs

    def conv(self, x: str, cin: int, cout: int, k: int, groups: int = 1, bias: bool = True) -> str:
        ins = [x, self.weight((cout, cin // groups, k, k))] + ([self.weight((cout,), "b")] if bias else [])
        return self.node("Conv", ins, kernel_shape=[k, k], pads=[k // 2] * 4, group=groups)[0]

    def bn(self, x: str, c: int) -> str:
        ins = [x] + [self.weight((c,), r) for r in ("scale", "shift", "mean")]
        var = self.name("var")
        self.inits.append(numpy_helper.from_array(self.rng.uniform(0.5, 1.5, c).astype(np.float32), var))
        return self.node("BatchNormalization", ins + [var])[0]


def trained_like(model: nn.Module, x: torch.Tensor, seed: int = 0) -> nn.Module:
    """``model`` in eval mode with norm statistics and affine parameters away from their initial values, as after
    training (fresh ones hide mapping errors). The global torch RNG is left as it was."""
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        model.train()
        for _ in range(3):
            model(x + 0.3 * torch.randn_like(x) if x.is_floating_point() else x)
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)) and m.weight is not None:
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.3, 0.3)
    return model.eval()


def cnn_onnx(blocks: Sequence[tuple], in_channels: int = 3, size: int = 4, head: Sequence[int] = (12, 6),
             seed: int = 0) -> onnx.ModelProto:
    """A hand-built CNN from the block language above (weights drawn with ``seed``)."""
    b = _Builder(seed)
    x, c = "input", in_channels
    for blk in blocks:
        kind = blk[0]
        if kind == "conv":
            _, cout, k, with_bn = blk
            y = b.conv(x, c, cout, k, bias=not with_bn)
            x, c = b.node("Relu", [b.bn(y, cout) if with_bn else y])[0], cout
        elif kind == "res":
            k = blk[1]
            y = b.node("Relu", [b.bn(b.conv(x, c, c, k, bias=False), c)])[0]
            y = b.bn(b.conv(y, c, c, k, bias=False), c)
            x = b.node("Relu", [b.node("Add", [y, x])[0]])[0]
        elif kind == "branch":
            _, widths, k = blk
            outs = [b.conv(x, c, w, k if i % 2 else 1) for i, w in enumerate(widths)]
            x, c = b.node("Concat", outs, axis=1)[0], sum(widths)
        elif kind == "split":
            h = c // 2
            halves = b.node("Split", [x, b.ints([h, h])], n_out=2, axis=1)
            x = b.node("Concat", [b.conv(halves[0], h, h, 3), b.conv(halves[1], h, h, 3)], axis=1)[0]
        elif kind == "dw":
            x = b.node("Relu", [b.bn(b.conv(x, c, c, blk[1], groups=c, bias=False), c)])[0]
        elif kind == "gate":
            x = b.node("Mul", [x, b.node("Sigmoid", [b.conv(x, c, c, 1)])[0]])[0]
        elif kind == "pool":
            x = b.node("AveragePool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])[0]
        else:
            raise ValueError(f"unknown block {blk!r}")
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])[0]])[0]
    h1, h2 = head
    x = b.node("Relu", [b.node("Gemm", [x, b.weight((h1, c)), b.weight((h1,), "b")], transB=1)[0]])[0]
    x = b.node("Add", [b.node("MatMul", [x, b.weight((h1, h2))])[0], b.weight((h2,), "b")])[0]
    x = b.node("LayerNormalization", [x, b.weight((h2,), "g"), b.weight((h2,), "b")], axis=-1)[0]
    b.nodes.append(helper.make_node("Identity", [x], ["output"], name="out"))
    graph = helper.make_graph(
        b.nodes, "cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, in_channels, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, h2])], initializer=b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def block_widths(blocks: Sequence[tuple], in_channels: int = 3) -> list[int]:
    """Channel count after each block."""
    out, c = [], in_channels
    for blk in blocks:
        if blk[0] == "conv":
            c = blk[1]
        elif blk[0] == "branch":
            c = sum(blk[1])
        out.append(c)
    return out


def drop_blocks(blocks: Sequence[tuple], keep: Sequence[bool]) -> list[tuple]:
    """``blocks`` without the width-keeping blocks whose ``keep`` flag is False: a sub-network (same widths)."""
    return [blk for blk, k in zip(blocks, keep) if k or blk[0] not in WIDTH_KEEPING]


def permuted(proto: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy with ``graph.node`` in a random order (topological or not)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    nodes = list(out.graph.node)
    order = np.random.default_rng(seed).permutation(len(nodes))
    del out.graph.node[:]
    out.graph.node.extend(nodes[i] for i in order)
    return out


def outputs(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module``'s output on ``x`` in eval mode, without gradients."""
    module.eval()
    with torch.no_grad():
        return module(x)


def rel_dev(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest entry of ``a``: ~1e-7 for an exact copy in float32."""
    return float((a - b).abs().max() / a.abs().max())


def warm_strictly(parent: nn.Module, child: nn.Module, x: torch.Tensor, root: Path, dynamo: bool):
    """Register ``parent`` as "p" in a zoo under ``root`` and warm ``child`` from it without noise; a partial warm
    (a learned tensor left behind) fails the caller. Returns the warm result."""
    import warnings

    from keeper.errors import PartialWarmWarning
    from keeper.torch_support import register, warm_start
    from keeper.zoo import Zoo

    zoo = Zoo(str(root / "zoo"))
    with quiet(), warnings.catch_warnings():
        warnings.simplefilter("error", PartialWarmWarning)
        register(parent, x, zoo, 0.9, name="p", config={"dynamo": dynamo})
        return warm_start(child, x, zoo, noise=0.0, config={"dynamo": dynamo})
