"""Architecture families as JSON-able specs: build a torch model from a plain dict, sample varied ones, and
list their architectural neighbours.

A spec is a plain dict (so it can be a Ray Tune config). Keys every family shares:

* ``family``: one of :data:`FAMILIES`;
* ``dim``: 1 (signals, ``(B, C, L)``) or 2 (images, ``(B, C, H, W)`` with ``H == W``);
* ``in_channels``, ``num_classes``;
* ``input_length``: the extent of each spatial axis (signal length for ``dim`` 1, image side for ``dim`` 2).

Keys per family (``[key=default]`` is optional):

* ``resnet``: ``widths`` (per stage), ``blocks`` (BasicBlocks per stage), ``kernel`` (3, 5 or 7). Stem
  conv-BN-ReLU to ``widths[0]``; stage 0 keeps the resolution, later stages halve it; global average pool; Linear.
* ``vgg``: ``widths``, ``depths`` (conv-BN-ReLU per stage), ``kernel``. Max-pool between stages; global
  average pool; Linear.
* ``mobilenetv2``: ``stem_width``, ``widths``, ``blocks``, ``expansion``, ``kernel`` (depthwise), ``head_width``.
  Every inverted residual block has its 1x1 expansion conv (also at ``expansion`` 1, so blocks are uniform).
* ``transformer``: ``d_model``, ``heads``, ``ffn``, ``layers``, ``patch``, ``[pre_ln=True]``,
  ``[activation="relu"]``, ``[embedding="patches"]``, ``[vocab_size]`` (required for ``"tokens"``). Patches of
  ``patch`` (per axis) are projected by one Linear; ``"tokens"`` embeds an integer LongTensor ``(B, L)`` with
  ``nn.Embedding`` instead (``dim`` 1 only).
* ``mlp``: ``widths`` (hidden layers), ``[norm="none"]`` (``"none"``, ``"layernorm"`` or ``"batchnorm"``).

Input conventions: every float family takes ``(B, C, L)`` / ``(B, C, H, W)``, so one dataset serves all of them;
the transformer and the MLP also take the channel-less ``(B, L)`` / ``(B, H, W)`` when ``in_channels`` is 1.
Every conv uses "same" padding ``k // 2`` with an odd kernel, so kernel growth keeps every shape. Every model
exports with both ONNX exporters of torch (TorchScript and dynamo).

Example:
    >>> import numpy as np, torch
    >>> spec = sample_spec(np.random.default_rng(0), "resnet")
    >>> model = build(spec)
    >>> model(example_input(spec)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from keeper.errors import InvalidModelError

__all__ = [
    "FAMILIES",
    "SCALES",
    "build",
    "example_input",
    "default_spec",
    "sample_spec",
    "sized_spec",
    "neighbours",
    "num_params",
    "num_macs",
]

FAMILIES = ("resnet", "vgg", "mobilenetv2", "transformer", "mlp")

#: Parameter-count range (inclusive) of the specs :func:`sample_spec` draws at each scale.
SCALES = {"small": (5_000, 200_000), "medium": (200_000, 2_000_000), "large": (2_000_000, 20_000_000)}

# forward multiply-accumulates per sample per input position that a "small" sampled spec may cost: 600k at
# MNIST-1D's 40 positions, where 1,500 training steps at batch 128 then take under about a minute on one core
_SMALL_MACS_PER_POSITION = 15_000

_COMMON = ("family", "dim", "in_channels", "num_classes", "input_length")
_KEYS = {
    "resnet": ("widths", "blocks", "kernel"),
    "vgg": ("widths", "depths", "kernel"),
    "mobilenetv2": ("stem_width", "widths", "blocks", "expansion", "kernel", "head_width"),
    "transformer": ("d_model", "heads", "ffn", "layers", "patch"),
    "mlp": ("widths",),
}
_OPTIONAL = {
    "transformer": {"pre_ln": True, "activation": "relu", "embedding": "patches", "vocab_size": None},
    "mlp": {"norm": "none"},
}
_KERNELS = (3, 5, 7)


# ----------------------------------------------------------------------------------------------- validation

def _bad(key: str, expected: str, got: Any, fix: str) -> InvalidModelError:
    return InvalidModelError(f"model spec: {key!r} must be {expected}, got {got!r}; {fix}")


def _int(spec: dict, key: str, lo: int = 1) -> int:
    v = spec[key]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise _bad(key, f"an integer >= {lo}", v, f"set {key!r} to a whole number of at least {lo}")
    return int(v)


def _int_list(spec: dict, key: str, lo: int = 1) -> list[int]:
    v = spec[key]
    if not isinstance(v, (list, tuple)) or not v or any(
            isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < lo for x in v):
        raise _bad(key, f"a non-empty list of integers >= {lo}", v, "give one entry per stage, e.g. [16, 32]")
    return [int(x) for x in v]


def _validate(spec: dict) -> dict:
    """A complete copy of ``spec`` (optional keys filled), or InvalidModelError naming the bad key."""
    if not isinstance(spec, dict):
        raise InvalidModelError(f"model spec must be a dict, got {type(spec).__name__}; build one with "
                                "keeper_bench.families.default_spec(family)")
    family = spec.get("family")
    if family not in FAMILIES:
        raise _bad("family", f"one of {FAMILIES}", family, "pick a family keeper_bench.families builds")
    allowed = _COMMON + _KEYS[family] + tuple(_OPTIONAL.get(family, {}))
    missing = [k for k in _COMMON + _KEYS[family] if k not in spec]
    if missing:
        raise InvalidModelError(f"model spec for {family!r}: missing keys {missing}; a {family} spec needs "
                                f"{list(_COMMON + _KEYS[family])} (see keeper_bench.families.default_spec)")
    unknown = sorted(k for k in spec if k not in allowed)
    if unknown:
        raise InvalidModelError(f"model spec for {family!r}: unknown keys {unknown}; allowed keys are "
                                f"{list(allowed)}")
    s = {k: v for k, v in {**_OPTIONAL.get(family, {}), **copy.deepcopy(spec)}.items() if v is not None}
    if s["dim"] not in (1, 2) or isinstance(s["dim"], bool):
        raise _bad("dim", "1 or 2", s["dim"], "use 1 for (B, C, L) signals, 2 for (B, C, H, W) images")
    for k in ("in_channels", "num_classes", "input_length"):
        s[k] = _int(s, k)
    if family in ("resnet", "vgg", "mobilenetv2"):
        if s["kernel"] not in _KERNELS:
            raise _bad("kernel", f"one of {_KERNELS}", s["kernel"], "odd kernels keep 'same' padding exact")
        s["widths"] = _int_list(s, "widths")
        depth_key = "depths" if family == "vgg" else "blocks"
        s[depth_key] = _int_list(s, depth_key)
        if len(s[depth_key]) != len(s["widths"]):
            raise _bad(depth_key, f"a list as long as 'widths' ({len(s['widths'])})", s[depth_key],
                       "give one entry per stage")
    if family == "vgg" and s["input_length"] >> (len(s["widths"]) - 1) < 1:
        raise _bad("widths", f"at most {s['input_length'].bit_length()} stages for input_length "
                   f"{s['input_length']}", s["widths"], "drop stages or enlarge the input")
    if family == "mobilenetv2":
        for k in ("stem_width", "expansion", "head_width"):
            s[k] = _int(s, k)
    if family == "mlp":
        s["widths"] = _int_list(s, "widths")
        if s["norm"] not in ("none", "layernorm", "batchnorm"):
            raise _bad("norm", "'none', 'layernorm' or 'batchnorm'", s["norm"], "pick one of those")
    if family == "transformer":
        for k in ("d_model", "heads", "ffn", "layers", "patch"):
            s[k] = _int(s, k)
        if s["d_model"] % s["heads"]:
            raise _bad("d_model", f"a multiple of heads ({s['heads']})", s["d_model"], "adjust d_model or heads")
        if not isinstance(s["pre_ln"], bool):
            raise _bad("pre_ln", "True or False", s["pre_ln"], "True puts LayerNorm before attention")
        if s["activation"] not in ("relu", "gelu"):
            raise _bad("activation", "'relu' or 'gelu'", s["activation"], "pick one of those")
        if s["embedding"] == "tokens":
            if s["dim"] != 1:
                raise _bad("dim", "1 for embedding='tokens'", s["dim"], "token inputs are sequences (B, L)")
            if "vocab_size" not in s:
                raise _bad("vocab_size", "an integer >= 2 for embedding='tokens'", None, "set the vocabulary size")
            s["vocab_size"] = _int(s, "vocab_size", 2)
        elif s["embedding"] == "patches":
            if s["input_length"] % s["patch"]:
                raise _bad("patch", f"a divisor of input_length ({s['input_length']})", s["patch"],
                           "pick a patch size that tiles the input")
        else:
            raise _bad("embedding", "'patches' or 'tokens'", s["embedding"], "pick one of those")
    return s


# ----------------------------------------------------------------------------------------------- modules

def _conv(dim: int, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Module:
    cls = nn.Conv1d if dim == 1 else nn.Conv2d
    return cls(cin, cout, k, stride=stride, padding=k // 2, groups=groups, bias=False)


def _bn(dim: int, c: int) -> nn.Module:
    return nn.BatchNorm1d(c) if dim == 1 else nn.BatchNorm2d(c)


def _pool_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=tuple(range(2, x.dim())))


class _BasicBlock(nn.Module):
    def __init__(self, dim: int, cin: int, cout: int, k: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv(dim, cin, cout, k, stride), _bn(dim, cout)
        self.conv2, self.bn2 = _conv(dim, cout, cout, k), _bn(dim, cout)
        self.relu = nn.ReLU()
        self.shortcut = (nn.Sequential(_conv(dim, cin, cout, 1, stride), _bn(dim, cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(y + self.shortcut(x))


class _ResNet(nn.Module):
    def __init__(self, s: dict):
        super().__init__()
        d, k, w = s["dim"], s["kernel"], s["widths"]
        self.stem = nn.Sequential(_conv(d, s["in_channels"], w[0], k), _bn(d, w[0]), nn.ReLU())
        blocks, cin = [], w[0]
        for i, (cout, n) in enumerate(zip(w, s["blocks"])):
            for j in range(n):
                blocks.append(_BasicBlock(d, cin, cout, k, 2 if i > 0 and j == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, s["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_pool_mean(self.blocks(self.stem(x))))


class _VGG(nn.Module):
    def __init__(self, s: dict):
        super().__init__()
        d, k = s["dim"], s["kernel"]
        layers: list[nn.Module] = []
        cin = s["in_channels"]
        for i, (cout, n) in enumerate(zip(s["widths"], s["depths"])):
            if i > 0:
                layers.append(nn.MaxPool1d(2) if d == 1 else nn.MaxPool2d(2))
            for _ in range(n):
                layers += [_conv(d, cin, cout, k), _bn(d, cout), nn.ReLU()]
                cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, s["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_pool_mean(self.features(x)))


class _InvertedResidual(nn.Module):
    def __init__(self, dim: int, cin: int, cout: int, k: int, stride: int, expansion: int):
        super().__init__()
        hidden = cin * expansion
        self.expand = nn.Sequential(_conv(dim, cin, hidden, 1), _bn(dim, hidden), nn.ReLU6())
        self.depthwise = nn.Sequential(_conv(dim, hidden, hidden, k, stride, groups=hidden), _bn(dim, hidden),
                                       nn.ReLU6())
        self.project = nn.Sequential(_conv(dim, hidden, cout, 1), _bn(dim, cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.residual else y


class _MobileNetV2(nn.Module):
    def __init__(self, s: dict):
        super().__init__()
        d, k = s["dim"], s["kernel"]
        self.stem = nn.Sequential(_conv(d, s["in_channels"], s["stem_width"], 3), _bn(d, s["stem_width"]),
                                  nn.ReLU6())
        blocks, cin = [], s["stem_width"]
        for i, (cout, n) in enumerate(zip(s["widths"], s["blocks"])):
            for j in range(n):
                blocks.append(_InvertedResidual(d, cin, cout, k, 2 if i > 0 and j == 0 else 1, s["expansion"]))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head_conv = nn.Sequential(_conv(d, cin, s["head_width"], 1), _bn(d, s["head_width"]), nn.ReLU6())
        self.head = nn.Linear(s["head_width"], s["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_pool_mean(self.head_conv(self.blocks(self.stem(x)))))


class _Transformer(nn.Module):
    def __init__(self, s: dict):
        super().__init__()
        self.dim, self.patch, self.tokens = s["dim"], s["patch"], s["embedding"] == "tokens"
        d_model = s["d_model"]
        if self.tokens:
            self.embed: nn.Module = nn.Embedding(s["vocab_size"], d_model)
            n_tokens = s["input_length"]
        else:
            self.embed = nn.Linear(s["in_channels"] * s["patch"] ** s["dim"], d_model)
            n_tokens = (s["input_length"] // s["patch"]) ** s["dim"]
        self.pos = nn.Parameter(torch.zeros(1, n_tokens, d_model))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, s["heads"], s["ffn"], dropout=0.0, activation=s["activation"],
                                       batch_first=True, norm_first=s["pre_ln"])
            for _ in range(s["layers"]))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, s["num_classes"])

    def _patches(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == self.dim + 1:  # channel-less input, in_channels == 1
            x = x.unsqueeze(1)
        b, c, p = x.shape[0], x.shape[1], self.patch
        if self.dim == 1:
            n = x.shape[2] // p
            return x.reshape(b, c, n, p).permute(0, 2, 1, 3).reshape(b, n, c * p)
        nh, nw = x.shape[2] // p, x.shape[3] // p
        return x.reshape(b, c, nh, p, nw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, nh * nw, c * p * p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(x.shape[0], -1) if self.tokens else self._patches(x)) + self.pos
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h).mean(dim=1))


class _MLP(nn.Module):
    def __init__(self, s: dict):
        super().__init__()
        layers: list[nn.Module] = []
        cin = s["in_channels"] * s["input_length"] ** s["dim"]
        for w in s["widths"]:
            layers.append(nn.Linear(cin, w))
            if s["norm"] == "layernorm":
                layers.append(nn.LayerNorm(w))
            elif s["norm"] == "batchnorm":
                layers.append(nn.BatchNorm1d(w))
            layers.append(nn.ReLU())
            cin = w
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(cin, s["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(torch.flatten(x, 1)))


_BUILDERS: dict[str, Callable[[dict], nn.Module]] = {
    "resnet": _ResNet, "vgg": _VGG, "mobilenetv2": _MobileNetV2, "transformer": _Transformer, "mlp": _MLP,
}


def build(spec: dict) -> nn.Module:
    """Build the torch model a spec describes; deterministic given ``torch.manual_seed``.

    Raises:
        InvalidModelError (a ValueError): a key is missing, unknown or out of range; the message names it.

    Example:
        >>> model = build(default_spec("mlp"))
        >>> model(example_input(default_spec("mlp"))).shape
        torch.Size([2, 10])
    """
    s = _validate(spec)
    return _BUILDERS[s["family"]](s)


def num_params(spec: dict) -> int:
    """Trainable parameter count of ``build(spec)``, counted on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        model = build(spec)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def num_macs(spec: dict) -> int:
    """Multiply-accumulates per input sample in the forward pass of ``build(spec)``: convs, linears and
    attention (projections and both attention products); norms and activations are not counted.

    Counted with forward hooks on the meta device, so it costs no memory and no arithmetic.
    """
    total = 0

    def weighted(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        # output is (B, C_out, *spatial) for convs and (..., out_features) for linears
        per_out = output[0].numel() // module.weight.shape[0] if isinstance(module, nn.modules.conv._ConvNd) \
            else output[0].numel() // output.shape[-1]
        total += module.weight.numel() * per_out

    def attention(module: nn.MultiheadAttention, inputs: tuple, output: tuple) -> None:
        nonlocal total
        tokens, d = inputs[0].shape[-2], inputs[0].shape[-1]
        total += tokens * 4 * d * d + 2 * tokens * tokens * d

    with torch.device("meta"):
        model = build(spec)
        for m in model.modules():
            # MultiheadAttention applies its out_proj functionally; the attention hook counts it
            if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear)) and \
                    not isinstance(m, nn.modules.linear.NonDynamicallyQuantizableLinear):
                m.register_forward_hook(weighted)
            elif isinstance(m, nn.MultiheadAttention):
                m.register_forward_hook(attention)
        # eval mode: training-mode BatchNorm decomposes slowly on meta. Grad stays enabled so the transformer
        # layers skip their fused inference path and call self_attn, whose hook counts attention
        model.eval()
        with torch.enable_grad():
            model(example_input(spec, batch=1).to("meta"))
    return total


def example_input(spec: dict, batch: int = 2) -> torch.Tensor:
    """A random input of the shape ``build(spec)`` takes (LongTensor tokens for ``embedding="tokens"``)."""
    s = _validate(spec)
    n = s["input_length"]
    if s["family"] == "transformer" and s["embedding"] == "tokens":
        return torch.randint(0, s["vocab_size"], (batch, n))
    return torch.randn(batch, s["in_channels"], *([n] * s["dim"]))


# ----------------------------------------------------------------------------------------------- sampling

def _stages_max(input_length: int) -> int:
    # stop halving before the resolution drops below 2 (VGG max-pools; the others waste compute below that)
    return max(1, min(4, int(math.log2(max(input_length, 2)))))


def _structure(family: str, rng: np.random.Generator | None, input_length: int) -> dict:
    """Everything but the width: random when ``rng`` is given, the canonical large-model shape when None."""
    if rng is None:
        return {"resnet": {"depths": [2, 2, 2, 2], "kernel": 3, "growth": 2.0},
                "vgg": {"depths": [2, 2, 3, 3], "kernel": 3, "growth": 2.0},
                "mobilenetv2": {"depths": [1, 2, 3, 4], "kernel": 3, "growth": 2.0, "expansion": 6},
                "transformer": {"heads": 8, "ffn_ratio": 4, "patch": 1, "pre_ln": True},
                "mlp": {"depths": [1, 1, 1], "norm": "layernorm"}}[family]
    stages = int(rng.integers(2, _stages_max(input_length) + 1)) if _stages_max(input_length) >= 2 else 1
    kernel = int(rng.choice(_KERNELS))
    growth = float(rng.choice([1.5, 2.0]))
    if family in ("resnet", "vgg"):
        return {"depths": [int(x) for x in rng.integers(1, 3 if family == "resnet" else 4, stages)],
                "kernel": kernel, "growth": growth}
    if family == "mobilenetv2":
        # few blocks, modest expansion: depthwise convs and their wide activations cost far more time per MAC
        # than dense convs on CPU
        return {"depths": [int(x) for x in rng.integers(1, 3, stages)], "kernel": kernel, "growth": growth,
                "expansion": int(rng.choice([2, 3, 4]))}
    if family == "transformer":
        # short patches (1 or 2 samples per token) train poorly on MNIST-1D: 4 or 5 give 10 or 8 tokens at 40
        patches = [p for p in (4, 5) if input_length % p == 0 and input_length // p >= 4] or [1]
        return {"heads": int(rng.choice([1, 2, 4])), "ffn_ratio": int(rng.choice([2, 4])),
                "patch": int(rng.choice(patches)), "pre_ln": bool(rng.random() < 0.75),
                "layers": int(rng.integers(1, 5))}
    return {"depths": [1] * int(rng.integers(1, 5)), "norm": str(rng.choice(["none", "layernorm", "batchnorm"]))}


def _with_width(family: str, st: dict, base: int, common: dict, target: float) -> dict:
    """A full spec from a structure and one base width (first stage / head dim / hidden width)."""
    if family == "transformer":
        d_model = st["heads"] * base
        # deeper for bigger budgets, as in practice: 12 d^2 per layer sets the scale
        layers = st.get("layers") or (4 if target < 3e6 else 8 if target < 3e7 else 12)
        return {**common, "d_model": d_model, "heads": st["heads"], "ffn": st["ffn_ratio"] * d_model,
                "layers": layers, "patch": st["patch"], "pre_ln": st["pre_ln"]}
    if family == "mlp":
        return {**common, "widths": [max(4, round(base / 2 ** (i // 2))) for i in range(len(st["depths"]))],
                "norm": st["norm"]}
    widths = [max(4, int(round(base * st["growth"] ** i))) for i in range(len(st["depths"]))]
    if family == "resnet":
        return {**common, "widths": widths, "blocks": list(st["depths"]), "kernel": st["kernel"]}
    if family == "vgg":
        return {**common, "widths": widths, "depths": list(st["depths"]), "kernel": st["kernel"]}
    return {**common, "stem_width": max(4, base // 2), "widths": widths, "blocks": list(st["depths"]),
            "expansion": st["expansion"], "kernel": st["kernel"], "head_width": 4 * widths[-1]}


def _fit(family: str, st: dict, common: dict, target: float, max_macs: float | None = None) -> dict:
    """The spec of this structure whose parameter count is closest to ``target`` (bisection on the width),
    among those that cost at most ``max_macs`` per sample when that is given."""
    def below(base: int) -> bool:
        s = _with_width(family, st, base, common, target)
        return num_params(s) < target and (max_macs is None or num_macs(s) <= max_macs)

    lo, hi = 1, 1
    # double on the parameter count alone (cheap); the MAC bound, monotone in the width too, joins the bisection
    while num_params(_with_width(family, st, hi, common, target)) < target and hi < 1 << 16:
        lo, hi = hi, hi * 2
    if not below(lo):
        lo, hi = 1, max(2, lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if below(mid) else (lo, mid)
    specs = [_with_width(family, st, lo, common, target)]
    upper = _with_width(family, st, hi, common, target)
    if max_macs is None or num_macs(upper) <= max_macs:
        specs.append(upper)
    return min(specs, key=lambda s: abs(math.log(num_params(s) / target)))


def _common(family: str, dim: int, in_channels: int, num_classes: int, input_length: int) -> dict:
    if family not in FAMILIES:
        raise _bad("family", f"one of {FAMILIES}", family, "pick a family keeper_bench.families builds")
    return {"family": family, "dim": dim, "in_channels": in_channels, "num_classes": num_classes,
            "input_length": input_length}


def default_spec(family: str, *, dim: int = 1, in_channels: int = 1, num_classes: int = 10,
                 input_length: int = 40) -> dict:
    """A fixed small spec of ``family`` (tens of thousands of parameters) that trains well on MNIST-1D."""
    common = _common(family, dim, in_channels, num_classes, input_length)
    n_stages = min(3, _stages_max(input_length))
    k = 5 if dim == 1 else 3
    spec = {
        "resnet": {"widths": [16, 32, 64][:n_stages], "blocks": [1, 1, 1][:n_stages], "kernel": k},
        "vgg": {"widths": [16, 32, 64][:n_stages], "depths": [1, 2, 2][:n_stages], "kernel": k},
        # depthwise convs are slow on CPU: a light MobileNetV2 keeps the MNIST-1D run within a minute
        "mobilenetv2": {"stem_width": 16, "widths": [16, 24, 32][:n_stages], "blocks": [1, 1, 2][:n_stages],
                        "expansion": 2, "kernel": 3, "head_width": 64},
        "transformer": {"d_model": 48, "heads": 4, "ffn": 96, "layers": 2,
                        "patch": 4 if input_length % 4 == 0 else 1, "pre_ln": True},
        "mlp": {"widths": [256, 128] if in_channels * input_length ** dim <= 256 else [128, 64], "norm": "none"},
    }[family]
    return _validate({**common, **spec})


def _shallower(family: str, st: dict) -> dict | None:
    if family == "transformer":
        return {**st, "layers": st["layers"] - 1} if st["layers"] > 1 else None
    if len(st["depths"]) > 1:
        return {**st, "depths": st["depths"][:-1]}
    return None


def sample_spec(rng: np.random.Generator, family: str, *, dim: int = 1, in_channels: int = 1,
                num_classes: int = 10, input_length: int = 40, scale: str = "small") -> dict:
    """A random spec of ``family`` with varied width, depth and kernel size, sized within ``SCALES[scale]``.

    The depth, kernel and stage shape are drawn first; the parameter budget is drawn log-uniformly from the
    scale's range and the width is fitted to it. At the "small" scale the width shrinks further (never below
    the range) until the forward pass costs at most 15,000 MACs per input position (600k at length 40).

    Example:
        >>> spec = sample_spec(np.random.default_rng(3), "vgg", dim=2, in_channels=3, input_length=16)
        >>> SCALES["small"][0] <= num_params(spec) <= SCALES["small"][1]
        True
    """
    if scale not in SCALES:
        raise _bad("scale", f"one of {tuple(SCALES)}", scale, "pick a scale keeper_bench.families knows")
    common = _common(family, dim, in_channels, num_classes, input_length)
    lo, hi = SCALES[scale]
    st = _structure(family, rng, input_length)
    target = float(np.exp(rng.uniform(np.log(lo * 1.25), np.log(hi / 1.25))))
    spec = _fit(family, st, common, target)
    # a deep structure can miss a small budget even at the narrowest width: drop depth until it fits
    while num_params(spec) > hi and _shallower(family, st) is not None:
        st = _shallower(family, st)
        spec = _fit(family, st, common, target)
    cap = _SMALL_MACS_PER_POSITION * input_length ** dim
    if scale == "small" and num_macs(spec) > cap:
        # keep small models cheap to train (about a minute of one CPU core for 1,500 MNIST-1D steps),
        # but never below the scale's parameter range
        spec = _fit(family, st, common, target, max_macs=cap)
        if num_params(spec) < lo:
            spec = _fit(family, st, common, lo * 1.25)
    return _validate(spec)


def sized_spec(family: str, target_params: int, *, dim: int = 1, in_channels: int = 1, num_classes: int = 10,
               input_length: int = 40) -> dict:
    """A spec of ``family`` in its canonical shape (e.g. a 4-stage ResNet-18 layout, a 12-layer transformer
    at 100M) whose parameter count is the closest this shape reaches to ``target_params``.

    Example:
        >>> spec = sized_spec("resnet", 1_000_000)
        >>> 0.8e6 < num_params(spec) < 1.25e6
        True
    """
    if target_params < 1:
        raise _bad("target_params", "a positive parameter count", target_params, "e.g. 1_000_000")
    common = _common(family, dim, in_channels, num_classes, input_length)
    return _validate(_fit(family, _structure(family, None, input_length), common, float(target_params)))


# ----------------------------------------------------------------------------------------------- neighbours

def _resize(w: int, factor: float) -> int:
    return max(4, int(round(w * factor)))


def neighbours(spec: dict, rng: np.random.Generator) -> list[dict]:
    """Architecturally close variants of ``spec``: wider, narrower, deeper, shallower and bigger-kernel ones.

    Each variant changes one thing (one stage's width or depth, the kernel, the layer count), so keeper's
    width, depth and kernel transforms relate it to ``spec``. Variants that would equal ``spec`` or be invalid
    are left out; the result may be shorter than five.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> len(neighbours(default_spec("resnet"), rng)) >= 4
        True
    """
    s = _validate(spec)
    family = s["family"]
    out: list[dict] = []
    grow = float(rng.choice([1.25, 1.5, 2.0]))
    shrink = float(rng.choice([0.5, 0.75]))
    if family == "transformer":
        h = s["heads"]
        step = h * max(1, round(s["d_model"] / h * (grow - 1)))
        out.append({**s, "d_model": s["d_model"] + step, "ffn": _resize(s["ffn"], grow)})
        narrow_d = max(h, s["d_model"] - h * max(1, round(s["d_model"] / h * (1 - shrink))))
        out.append({**s, "d_model": narrow_d, "ffn": _resize(s["ffn"], shrink)})
        out.append({**s, "ffn": _resize(s["ffn"], grow)})
        out.append({**s, "layers": s["layers"] + 1})
        out.append({**s, "layers": s["layers"] - 1})
    else:
        depth_key = {"resnet": "blocks", "vgg": "depths", "mobilenetv2": "blocks", "mlp": None}[family]
        n = len(s["widths"])
        i = int(rng.integers(n))
        for factor in (grow, shrink):
            widths = list(s["widths"])
            k = i
            if _resize(widths[i], factor) == widths[i]:  # already at the narrowest: narrow the widest stage instead
                k = int(np.argmax(widths))
            widths[k] = _resize(widths[k], factor)
            out.append({**s, "widths": widths})
        if depth_key is None:  # mlp: a new hidden layer copies its predecessor's width, so it can be the identity
            out.append({**s, "widths": s["widths"][: i + 1] + [s["widths"][i]] + s["widths"][i + 1:]})
            out.append({**s, "widths": s["widths"][:i] + s["widths"][i + 1:]})
        else:
            deeper = list(s[depth_key])
            deeper[i] += 1
            out.append({**s, depth_key: deeper})
            shallow = [j for j, d in enumerate(s[depth_key]) if d > 1]
            if shallow:
                j = int(rng.choice(shallow))
                fewer = list(s[depth_key])
                fewer[j] -= 1
                out.append({**s, depth_key: fewer})
            if s["kernel"] < max(_KERNELS):
                out.append({**s, "kernel": s["kernel"] + 2})
            else:  # the largest kernel: a smaller one (centre crop) is the kernel neighbour
                out.append({**s, "kernel": s["kernel"] - 2})
    result = []
    for v in out:
        try:
            v = _validate(v)
        except InvalidModelError:
            continue
        if v != s and v not in result:
            result.append(v)
    return result
