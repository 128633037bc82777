"""Real architectures at test size: Hugging Face transformers built from small configs (random init, nothing
downloaded), plus torchvision and timm models when those libraries import.

:data:`CATALOGUE` maps a model name to a builder that returns ``(module, example_args)``: the module in eval mode
returning one tensor (:class:`FirstOutput`), and the positional arguments of one forward call. A builder draws its
initial weights from torch's global generator, so two calls give two different initialisations of one
architecture; :func:`build` seeds one call. :func:`optional_catalogue` gives the torchvision / timm models and,
for a library that does not import, the reason they are left out.

Swin and the T5 encoder use transformers' eager attention: with its SDPA attention, torch 2.13's dynamo exporter
fails to decompose the reshape after attention (a view of a transposed tensor) for these two models.

Invariant: every builder gives a module of at most a few hundred thousand parameters whose forward on its example
runs in milliseconds on a CPU, so a test or a benchmark may build each model many times.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["CATALOGUE", "TRANSFORMERS", "CNNS", "Builder", "FirstOutput", "build", "jitter", "optional_catalogue"]

Builder = Callable[[], "tuple[torch.nn.Module, tuple]"]

_SEQ = 8      # tokens per example
_VOCAB = 64   # vocabulary of the text models
_IMAGE = 32   # side of the images of the vision models


def _ids(batch: int = 1, seq: int = _SEQ) -> torch.Tensor:
    return torch.arange(batch * seq, dtype=torch.long).reshape(batch, seq) % _VOCAB


def _pixels(side: int = _IMAGE, channels: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)  # a fixed input: the caller's generator draws only weights
    return torch.randn(1, channels, side, side, generator=g)


class FirstOutput(torch.nn.Module):
    """A Hugging Face model whose forward returns its first output tensor (``last_hidden_state`` or ``logits``):
    one tensor out, whatever the library's output classes. Its state_dict keys are the model's under ``model.``.

    ``full_mask``: pass an all-ones attention mask built from the token ids. transformers then skips its check for
    packed sequences, whose ``torch.diff`` the TorchScript exporter cannot export. ``output``: which output to
    return (ConvNeXt's final LayerNorm acts on its pooled output, the second).

    LeViT keeps its gathered attention biases between eval calls; keeper drops such caches itself around an export
    and after a warm (:func:`keeper.torch_support.tensors.drop_eval_caches`), so nothing here clears them."""

    def __init__(self, model: torch.nn.Module, full_mask: bool = False, output: int = 0):
        super().__init__()
        self.model = model
        self.full_mask = full_mask
        self.output = output

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        kwargs = {"attention_mask": torch.ones_like(args[0])} if self.full_mask else {}
        out = self.model(*args, **kwargs)
        return out[self.output] if isinstance(out, (tuple, list)) else list(out.values())[self.output]


def _ready(model: torch.nn.Module, full_mask: bool = False, output: int = 0) -> torch.nn.Module:
    return FirstOutput(model, full_mask, output).eval()


def gpt2() -> tuple[torch.nn.Module, tuple]:
    """GPT-2 with its LM head: ``lm_head.weight`` is tied to ``transformer.wte.weight``; learned positions."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=_VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4, use_cache=False, bos_token_id=0, eos_token_id=0,
                     tie_word_embeddings=True)
    return _ready(GPT2LMHeadModel(cfg), full_mask=True), (_ids(),)


def bert() -> tuple[torch.nn.Module, tuple]:
    """BERT: word, position and token-type embeddings, post-LayerNorm blocks (no pooler: it does not reach the
    output keeper is given)."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=16, type_vocab_size=2)
    return _ready(BertModel(cfg, add_pooling_layer=False)), (_ids(),)


def distilbert() -> tuple[torch.nn.Module, tuple]:
    """DistilBERT: word and position embeddings, no token types."""
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(vocab_size=_VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                           max_position_embeddings=16)
    return _ready(DistilBertModel(cfg)), (_ids(),)


def vit() -> tuple[torch.nn.Module, tuple]:
    """ViT: a class token (Expand + Concat of a parameter) and learned positions."""
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(image_size=_IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64)
    return _ready(ViTModel(cfg, add_pooling_layer=False)), (_pixels(),)


def deit() -> tuple[torch.nn.Module, tuple]:
    """DeiT: class and distillation tokens, learned positions."""
    from transformers import DeiTConfig, DeiTModel

    cfg = DeiTConfig(image_size=_IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64)
    return _ready(DeiTModel(cfg, add_pooling_layer=False)), (_pixels(),)


def swin() -> tuple[torch.nn.Module, tuple]:
    """Swin: windowed attention with relative-position bias tables read by a constant index, patch merging."""
    from transformers import SwinConfig, SwinModel

    cfg = SwinConfig(image_size=_IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
                     mlp_ratio=2.0, attn_implementation="eager")
    return _ready(SwinModel(cfg)), (_pixels(),)


def levit() -> tuple[torch.nn.Module, tuple]:
    """LeViT: learned attention biases (``attention_biases``, gathered by a constant index) added to scores."""
    from transformers import LevitConfig, LevitModel

    cfg = LevitConfig(image_size=64, patch_size=16, hidden_sizes=[32, 48], num_attention_heads=[2, 3], depths=[1, 1],
                      key_dim=[8, 8], drop_path_rate=0, mlp_ratio=[2, 2], attention_ratio=[2, 2],
                      down_ops=[["Subsample", 8, 2, 4, 2, 2]])
    return _ready(LevitModel(cfg)), (_pixels(64),)


def t5_encoder() -> tuple[torch.nn.Module, tuple]:
    """T5 encoder: RMS-normed pre-norm blocks, a relative-attention bias table in the first block."""
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                   use_cache=False, attn_implementation="eager")
    return _ready(T5EncoderModel(cfg)), (_ids(),)


def llama() -> tuple[torch.nn.Module, tuple]:
    """Llama: grouped-query attention (4 heads, 2 KV heads), rotary positions, SwiGLU, RMSNorm."""
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, use_cache=False)
    return _ready(LlamaModel(cfg), full_mask=True), (_ids(),)


def convnext() -> tuple[torch.nn.Module, tuple]:
    """ConvNeXt: depthwise 7x7 convs, channels-last LayerNorm, layer scales."""
    from transformers import ConvNextConfig, ConvNextModel

    cfg = ConvNextConfig(num_channels=3, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                         out_features=None)
    return _ready(ConvNextModel(cfg), output=1), (_pixels(),)


def resnet() -> tuple[torch.nn.Module, tuple]:
    """ResNet with basic blocks."""
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
    return _ready(ResNetModel(cfg)), (_pixels(),)


def mobilenet_v2() -> tuple[torch.nn.Module, tuple]:
    """MobileNetV2 at width 0.35: inverted residuals, depthwise convs, ReLU6."""
    from transformers import MobileNetV2Config, MobileNetV2Model

    cfg = MobileNetV2Config(num_channels=3, image_size=_IMAGE, depth_multiplier=0.35, finegrained_output=False)
    return _ready(MobileNetV2Model(cfg)), (_pixels(),)


def efficientnet() -> tuple[torch.nn.Module, tuple]:
    """EfficientNet at width and depth 0.25: MBConv blocks with squeeze-excite, SiLU."""
    from transformers import EfficientNetConfig, EfficientNetModel

    cfg = EfficientNetConfig(num_channels=3, image_size=_IMAGE, width_coefficient=0.25, depth_coefficient=0.25,
                             hidden_dim=320)
    return _ready(EfficientNetModel(cfg)), (_pixels(),)


TRANSFORMERS: dict[str, Builder] = {
    "gpt2": gpt2, "bert": bert, "distilbert": distilbert, "vit": vit, "deit": deit, "swin": swin, "levit": levit,
    "t5-encoder": t5_encoder, "llama": llama,
}
CNNS: dict[str, Builder] = {
    "convnext": convnext, "resnet": resnet, "mobilenet-v2": mobilenet_v2, "efficientnet": efficientnet,
}
# Every Hugging Face architecture keeper is measured on: name -> builder of (module in eval mode, example args).
CATALOGUE: dict[str, Builder] = {**TRANSFORMERS, **CNNS}


def build(name: str, seed: int = 0, builders: dict[str, Builder] | None = None) -> tuple[torch.nn.Module, tuple]:
    """``CATALOGUE[name]()`` with its weights drawn from ``seed``, every parameter then moved by seeded noise
    (:func:`jitter`) so that no tensor keeps a constant initial value (zero class tokens, unit layer scales) that
    two builds would share: a tensor a warm leaves behind then shows in the output. The global generator is
    left as it was.

    Raises:
        KeyError: ``name`` is not in the catalogue (the message lists the names).
    """
    builders = CATALOGUE if builders is None else builders
    if name not in builders:
        raise KeyError(f"model {name!r}: not in the catalogue; one of {sorted(builders)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module, args = builders[name]()
        jitter(module, seed)
    return module, args


def jitter(module: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """Add seeded Gaussian noise of standard deviation ``scale`` to every floating-point parameter of ``module``
    in place (buffers, such as BatchNorm statistics, are left alone); returns ``module``."""
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * scale)
    return module


def optional_catalogue() -> tuple[dict[str, Builder], dict[str, str]]:
    """torchvision and timm models (:func:`vision_catalogue.catalogue`), when those libraries
    import: (builders, {library: reason it is left out}). Neither has a CPU-only wheel set that installs beside
    every torch build, so both stay optional."""
    from vision_catalogue import catalogue

    return catalogue()
