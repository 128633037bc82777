"""Growth pairs of real architectures (Hugging Face transformers, built from configs, never from the hub) and the
deviation a warm start leaves: parent -> grown child, warmed by keeper with ``noise=0``, against the parent's
function, beside the same child at its own initialisation.

Each family is a builder from a few size keys (``layers``, ``d`` for the model width, ``heads``, ``ffn``; the
CNNs have their own) to a module that returns one tensor whose shape does not depend on those sizes (logits), and
an example input. :data:`PAIRS` lists, per family, which growth each pair exercises: ``depth`` (more blocks),
``ffn`` (wider feed-forward or expansion), ``d_model x2`` (the residual stream and the heads doubled, head size
kept) and ``d_model x1.5`` (a factor that does not divide: not promised, reported).

Parents are made "trained-like" (:func:`trained_like`): weights of unit-scale fan-in variance, norms' weights
and shifts away from one and zero, so that attention is peaked and a mapping error shows in the logits.

Example:
    >>> r = growth_deviation("llama", dict(layers=2), dict(layers=4), dynamo=True)  # doctest: +SKIP
    >>> r.warm, r.init                                                                # doctest: +SKIP
    (0.0, 1.0)
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

__all__ = ["quiet", "import_transformers", "FAMILIES", "PAIRS", "build", "trained_like", "GrowthResult",
           "growth_deviation", "warm_deviation"]


def import_transformers() -> Any:
    """The ``transformers`` module.

    Raises:
        ModuleNotFoundError: transformers is not installed (callers skip with that reason).
    """
    return importlib.import_module("transformers")


class _Logits(nn.Module):
    """A transformers model called with keyword inputs, returning one tensor: ``logits``, or a linear head over
    ``last_hidden_state`` (a learned layer of the model, so that models whose hidden size grows still give
    outputs of one shape)."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], hidden: int | None = None, classes: int = 5):
        super().__init__()
        self.model, self.names = model, names
        self.head = nn.Linear(hidden, classes) if hidden is not None else None

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, args)))
        if self.head is not None:
            return self.head(out.last_hidden_state)
        return out.logits


_VOCAB, _TOKENS, _IMAGE = 64, 7, 16


def _text(names: tuple[str, ...] = ("input_ids",)) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, _VOCAB, (2, _TOKENS), generator=gen)
    extra = {"position_ids": torch.arange(_TOKENS).expand(2, _TOKENS).contiguous(),
             "token_type_ids": torch.zeros(2, _TOKENS, dtype=torch.long)}
    return (ids,) + tuple(extra[n] for n in names[1:])


def _image() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, _IMAGE, _IMAGE, generator=torch.Generator().manual_seed(0)),)


def _eager(config: Any) -> Any:
    config._attn_implementation = "eager"  # one attention path for both exporters (no fused SDPA kernels)
    return config


def _gpt2(T: Any, layers: int = 2, d: int = 32, heads: int = 4, ffn: int = 64, tied: bool = True,
          positions: bool = False) -> tuple[nn.Module, tuple]:
    c = _eager(T.GPT2Config(vocab_size=_VOCAB, n_positions=16, n_embd=d, n_layer=layers, n_head=heads, n_inner=ffn,
                            tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0))
    names = ("input_ids", "position_ids") if positions else ("input_ids",)
    return _Logits(T.GPT2LMHeadModel(c), names), _text(names)


def _bert(T: Any, layers: int = 2, d: int = 32, heads: int = 4, ffn: int = 64,
          positions: bool = False) -> tuple[nn.Module, tuple]:
    c = _eager(T.BertConfig(vocab_size=_VOCAB, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                            intermediate_size=ffn, max_position_embeddings=16, num_labels=5))
    names = ("input_ids", "position_ids", "token_type_ids") if positions else ("input_ids",)
    return _Logits(T.BertForSequenceClassification(c), names), _text(names)


def _distilbert(T: Any, layers: int = 2, d: int = 32, heads: int = 4, ffn: int = 64) -> tuple[nn.Module, tuple]:
    c = _eager(T.DistilBertConfig(vocab_size=_VOCAB, dim=d, n_layers=layers, n_heads=heads, hidden_dim=ffn,
                                  max_position_embeddings=16, num_labels=5))
    return _Logits(T.DistilBertForSequenceClassification(c), ("input_ids",)), _text()


def _llama(T: Any, layers: int = 2, d: int = 32, heads: int = 4, kv_heads: int = 2, ffn: int = 64,
           tied: bool = False) -> tuple[nn.Module, tuple]:
    c = _eager(T.LlamaConfig(vocab_size=_VOCAB, hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=16,
                             tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0, pad_token_id=0))
    return _Logits(T.LlamaForCausalLM(c), ("input_ids",)), _text()


def _t5(T: Any, layers: int = 2, d: int = 32, heads: int = 4, ffn: int = 64) -> tuple[nn.Module, tuple]:
    c = _eager(T.T5Config(vocab_size=_VOCAB, d_model=d, d_kv=d // heads, d_ff=ffn, num_layers=layers,
                          num_heads=heads, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                          dropout_rate=0.0, is_encoder_decoder=False, use_cache=False))
    return _Logits(T.T5EncoderModel(c), ("input_ids",), hidden=d), _text()


def _vit(T: Any, layers: int = 2, d: int = 32, heads: int = 4, ffn: int = 64) -> tuple[nn.Module, tuple]:
    c = _eager(T.ViTConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
                           image_size=_IMAGE, patch_size=4, num_labels=5))
    return _Logits(T.ViTForImageClassification(c), ("pixel_values",)), _image()


def _deit(T: Any, layers: int = 2, d: int = 32, heads: int = 4, ffn: int = 64) -> tuple[nn.Module, tuple]:
    c = _eager(T.DeiTConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                            intermediate_size=ffn, image_size=_IMAGE, patch_size=4, num_labels=5))
    return _Logits(T.DeiTForImageClassificationWithTeacher(c), ("pixel_values",)), _image()


def _swin(T: Any, layers: int = 2, d: int = 16, heads: int = 2, ffn: int = 2) -> tuple[nn.Module, tuple]:
    # two stages of ``layers`` blocks; ``ffn`` is the MLP ratio; heads double in the second stage as Swin's do
    c = _eager(T.SwinConfig(image_size=_IMAGE, patch_size=2, embed_dim=d, depths=[layers, layers],
                            num_heads=[heads, 2 * heads], window_size=4, mlp_ratio=float(ffn), drop_path_rate=0.0,
                            num_labels=5))
    return _Logits(T.SwinForImageClassification(c), ("pixel_values",)), _image()


def _resnet(T: Any, layers: int = 1, d: int = 8) -> tuple[nn.Module, tuple]:
    c = T.ResNetConfig(embedding_size=d, hidden_sizes=[d, 2 * d], depths=[layers, layers], layer_type="basic",
                       num_labels=5)
    return _Logits(T.ResNetForImageClassification(c), ("pixel_values",)), _image()


def _mobilenetv2(T: Any, d: float = 0.5, ffn: float = 4.0) -> tuple[nn.Module, tuple]:
    # ``d`` is the width multiplier, ``ffn`` the inverted blocks' expansion ratio (the family has no depth knob)
    c = T.MobileNetV2Config(image_size=_IMAGE, depth_multiplier=d, expand_ratio=ffn, min_depth=4,
                            depth_divisible_by=4, num_labels=5, classifier_dropout_prob=0.0)
    return _Logits(T.MobileNetV2ForImageClassification(c), ("pixel_values",)), _image()


def _efficientnet(T: Any, layers: float = 1.0, d: float = 1.0, ffn: int = 4) -> tuple[nn.Module, tuple]:
    # B0's first three stages (stem 32 channels wide at width 1, head conv 1280 as in B0): ``layers`` is the
    # depth coefficient, ``d`` the width coefficient, ``ffn`` the expansion ratio of the blocks after the first
    c = T.EfficientNetConfig(image_size=_IMAGE, width_coefficient=d, depth_coefficient=layers, kernel_sizes=[3, 3, 5],
                             in_channels=[32, 16, 24], out_channels=[16, 24, 40], strides=[1, 2, 2],
                             num_block_repeats=[1, 2, 2], expand_ratios=[1, ffn, ffn], hidden_dim=int(1280 * d),
                             depthwise_padding=[], dropout_rate=0.0, drop_connect_rate=0.0, num_labels=5)
    return _Logits(T.EfficientNetForImageClassification(c), ("pixel_values",)), _image()


def _convnext(T: Any, layers: int = 1, d: int = 8) -> tuple[nn.Module, tuple]:
    c = T.ConvNextConfig(patch_size=2, num_stages=2, hidden_sizes=[d, 2 * d], depths=[layers, layers],
                         image_size=_IMAGE, num_labels=5, drop_path_rate=0.0)
    return _Logits(T.ConvNextForImageClassification(c), ("pixel_values",)), _image()


#: family -> builder(transformers module, **sizes) -> (module, example inputs)
FAMILIES: dict[str, Callable[..., tuple[nn.Module, tuple]]] = {
    "gpt2": _gpt2, "bert": _bert, "distilbert": _distilbert, "llama": _llama, "t5-encoder": _t5, "vit": _vit,
    "deit": _deit, "swin": _swin, "resnet": _resnet, "mobilenetv2": _mobilenetv2, "efficientnet": _efficientnet,
    "convnext": _convnext,
}

_T = dict(layers=2, d=32, heads=4, ffn=64)
_TRANSFORMER_PAIRS = [
    ("depth", {}, dict(layers=4)),
    ("ffn", {}, dict(ffn=96)),
    ("d_model x2", {}, dict(d=64, heads=8, ffn=128)),
    ("d_model x1.5", {}, dict(d=48, heads=6, ffn=96)),
]

#: family -> [(growth, parent sizes, child sizes)]; sizes left out take the builder's defaults
PAIRS: dict[str, list[tuple[str, dict, dict]]] = {
    "gpt2": _TRANSFORMER_PAIRS,
    "bert": _TRANSFORMER_PAIRS,
    "distilbert": _TRANSFORMER_PAIRS,
    "llama": [("depth", {}, dict(layers=4)), ("ffn", {}, dict(ffn=96)),
              ("d_model x2", {}, dict(d=64, heads=8, kv_heads=4, ffn=128)),
              ("d_model x1.5", {}, dict(d=48, heads=6, kv_heads=3, ffn=96))],
    "t5-encoder": _TRANSFORMER_PAIRS,
    "vit": _TRANSFORMER_PAIRS,
    "deit": _TRANSFORMER_PAIRS,
    "swin": [("depth", {}, dict(layers=4)), ("ffn", {}, dict(ffn=4)), ("d_model x2", {}, dict(d=32, heads=4)),
             ("d_model x1.5", {}, dict(d=24, heads=3))],
    "resnet": [("depth", {}, dict(layers=2)), ("channels x2", {}, dict(d=16)), ("channels x1.5", {}, dict(d=12))],
    "mobilenetv2": [("ffn", {}, dict(ffn=6.0)), ("channels x2", {}, dict(d=1.0))],
    "efficientnet": [("depth", {}, dict(layers=2.0)), ("ffn", {}, dict(ffn=6)), ("channels x2", {}, dict(d=2.0))],
    "convnext": [("depth", {}, dict(layers=2)), ("channels x2", {}, dict(d=16)), ("channels x1.5", {}, dict(d=12))],
}


def build(family: str, **sizes: Any) -> tuple[nn.Module, tuple]:
    """A family's module (eval mode, its own initialisation) and example inputs."""
    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    model, x = FAMILIES[family](import_transformers(), **sizes)
    return model.eval(), x


def trained_like(model: nn.Module, seed: int = 0) -> nn.Module:
    """``model`` with values as after training, in place: matrices and kernels N(0, 1.5^2 / fan-in), embedding
    tables N(0, 1), norms' weights U(0.5, 1.5), other vectors (biases, norms' shifts, tokens, layer scales)
    N(0, 0.3^2), BatchNorm statistics away from 0 and 1. A fresh model (std 0.02, norms at one) has near-uniform
    attention and norms that hide mapping errors."""
    gen = torch.Generator().manual_seed(seed)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    norms = {id(m.weight) for m in model.modules()
             if "norm" in type(m).__name__.lower() and isinstance(getattr(m, "weight", None), torch.Tensor)}
    with torch.no_grad():
        for name, v in model.named_parameters():
            if id(v) in embeddings:
                v.copy_(torch.randn(v.shape, generator=gen))
            elif id(v) in norms:
                v.copy_(torch.rand(v.shape, generator=gen) + 0.5)
            elif v.ndim >= 2 and v[0].numel() > 1:
                v.copy_(torch.randn(v.shape, generator=gen) * (1.5 / v[0].numel() ** 0.5))
            else:
                v.copy_(torch.randn(v.shape, generator=gen) * 0.3)
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=gen) + 0.5)
            elif name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.3)
    return model.eval()


@dataclass
class GrowthResult:
    """Max relative deviation of the child's outputs from the parent's: ``warm`` (keeper, noise 0) and ``init``
    (the child's own initialisation); the alignment ``score``; the module tensors keeper did not inherit
    (``missing``); whether keeper flagged the warm function-preserving (``preserved``) and, where not, why
    (``why``, from :func:`keeper.preservation.assess`); seconds for the two exports and the warm; per child layer
    (canonical order), whether it was left new by the alignment (``new``) and its place along the residual stream
    (``segment``, see :mod:`keeper.graph.stream`)."""

    warm: float
    init: float
    score: float
    missing: list[str] = field(default_factory=list)
    preserved: bool = False
    seconds: float = 0.0
    new: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    segment: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    why: str = ""


@contextlib.contextmanager
def quiet():
    """Silence exporter chatter (prints, warnings, torch logging)."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _deviation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


def growth_deviation(family: str, parent_sizes: dict, child_sizes: dict, *, dynamo: bool,
                     seed: int = 0) -> GrowthResult:
    """Warm the ``child_sizes`` model of ``family`` from a trained-like ``parent_sizes`` one through ONNX
    (``dynamo`` picks torch's exporter) and measure both deviations (see :class:`GrowthResult`)."""
    torch.manual_seed(seed)
    parent, x = build(family, **parent_sizes)
    child, _ = build(family, **{**parent_sizes, **child_sizes})
    return warm_deviation(parent, child, x, dynamo=dynamo, seed=seed)


def warm_deviation(parent: nn.Module, child: nn.Module, x: tuple, *, dynamo: bool, seed: int = 0) -> GrowthResult:
    """Make ``parent`` trained-like (in place), warm ``child`` from it through ONNX (``dynamo`` picks torch's
    exporter; the child's weights are replaced in place) and measure both deviations on the inputs ``x`` (see
    :class:`GrowthResult`). Both modules return one tensor of one shape."""
    from keeper.graph import load_graph
    from keeper.graph.stream import residual_stream
    from keeper.matching import align
    from keeper.choice.preservation import assess
    from keeper.torch_support import export
    from keeper.torch_support.load import load_result
    from keeper.warm import inherit as warm_from_parent

    trained_like(parent, seed)
    t0 = time.perf_counter()
    with quiet():
        pe, ce = export(parent, x, dynamo=dynamo), export(child, x, dynamo=dynamo)
        with torch.no_grad():
            want, cold = parent(*x), child(*x)
        pg, cg = load_graph(pe.onnx), load_graph(ce.onnx)
        alignment = align(pg, cg)
        result = warm_from_parent(pe.onnx, ce.onnx, parent_name="parent", parent_graph=pg, child_graph=cg,
                                  alignment=alignment, noise=0.0, seed=seed)
        result = load_result(child, result, ce.keys)
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        got = child(*x)
    return GrowthResult(_deviation(want, got), _deviation(want, cold), float(result.score), list(result.load.missing),
                        bool(result.preserved), seconds, np.asarray(alignment.pairs) < 0, residual_stream(cg).segment,
                        "" if result.preserved else assess(pg, cg, alignment).why)
