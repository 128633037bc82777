"""torchvision and timm architectures at test size, for the coverage table and the tests that run where those
libraries import (:mod:`vision_libs`): randomly initialised (``weights=None`` /
``pretrained=False``, nothing downloaded), small inputs, and the growth pairs of the CNN families.

:func:`catalogue` gives ``{name: builder}`` in the form of :data:`hf_catalogue.CATALOGUE` (a builder
returns ``(module in eval mode, example args)`` and draws its weights from torch's global generator) and, per
library that does not import, the reason it is left out. Names start with ``tv-`` or ``timm-``. Where a
constructor takes sizes, the model is a small config of the named architecture (the transformers, ConvNeXt,
VGG, DenseNet); otherwise it is the library's own model with a 10-class head (ResNet-18/34, MobileNetV2/V3,
EfficientNet B0/B1, ...). :data:`SIZES` says which is which.

:func:`growth_pairs` gives the CNN growth pairs (parent builder, child builder, the growth they exercise):
ResNet-18 -> 34, VGG-11 -> 13 with and without BatchNorm, MobileNetV2 0.5 -> 1.0, MobileNetV3 0.75 -> 1.0,
EfficientNet B0 -> B1, ConvNeXt deepening; :func:`hf_growth.warm_deviation` measures them.

Invariant: every builder's module runs a forward pass on its example in well under a second on one CPU core.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from vision_libs import import_timm, import_torchvision

__all__ = ["GAPS", "SIZES", "catalogue", "growth_pairs", "torchvision_builders", "timm_builders"]

Builder = Callable[[], "tuple[nn.Module, tuple]"]

_CLASSES = 10


def _pixels(side: int) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(0)  # a fixed input: the caller's generator draws only weights
    return (torch.randn(1, 3, side, side, generator=g),)


def _ready(model: nn.Module, side: int) -> tuple[nn.Module, tuple]:
    return model.eval(), _pixels(side)


# --------------------------------------------------------------------------------------------- torchvision --

def _tv_vgg(tv: Any, cfg: str, batch_norm: bool) -> nn.Module:
    """VGG's layer configuration ``cfg`` (torchvision's ``cfgs``: A = VGG-11, B = VGG-13) at a quarter of its
    channels, with a global-pool linear head: the full VGG's 4096-wide classifier alone has 120 M parameters."""
    vgg = tv.models.vgg
    layers = [v if v == "M" else v // 4 for v in vgg.cfgs[cfg]]
    model = vgg.VGG(vgg.make_layers(layers, batch_norm=batch_norm), num_classes=_CLASSES)
    model.avgpool = nn.AdaptiveAvgPool2d(1)
    model.classifier = nn.Linear(layers[-2], _CLASSES)
    return model


def _tv_convnext(tv: Any, depth: int) -> nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(16, 32, depth), CNBlockConfig(32, None, depth)], layer_scale=0.5,
                    num_classes=_CLASSES)


def _tv_swin(tv: Any, v2: bool) -> nn.Module:
    from torchvision.models import swin_transformer as sw

    extra = dict(block=sw.SwinTransformerBlockV2, downsample_layer=sw.PatchMergingV2) if v2 else {}
    return sw.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=[4, 4],
                              mlp_ratio=2.0, stochastic_depth_prob=0.0, num_classes=_CLASSES, **extra)


def torchvision_builders(tv: Any) -> dict[str, Builder]:
    """The torchvision models (``tv`` is the imported torchvision)."""
    m = tv.models
    return {
        "tv-resnet18": lambda: _ready(m.resnet18(num_classes=_CLASSES), 64),
        "tv-resnet34": lambda: _ready(m.resnet34(num_classes=_CLASSES), 64),
        "tv-vgg11": lambda: _ready(_tv_vgg(tv, "A", False), 64),
        "tv-vgg11_bn": lambda: _ready(_tv_vgg(tv, "A", True), 64),
        "tv-vgg13": lambda: _ready(_tv_vgg(tv, "B", False), 64),
        "tv-vgg13_bn": lambda: _ready(_tv_vgg(tv, "B", True), 64),
        "tv-mobilenet_v2_0.5": lambda: _ready(m.mobilenet_v2(width_mult=0.5, num_classes=_CLASSES), 64),
        "tv-mobilenet_v2": lambda: _ready(m.mobilenet_v2(num_classes=_CLASSES), 64),
        "tv-mobilenet_v3_small": lambda: _ready(m.mobilenet_v3_small(num_classes=_CLASSES), 64),
        "tv-mobilenet_v3_large_0.75": lambda: _ready(m.mobilenet_v3_large(width_mult=0.75, num_classes=_CLASSES), 64),
        "tv-mobilenet_v3_large": lambda: _ready(m.mobilenet_v3_large(num_classes=_CLASSES), 64),
        "tv-efficientnet_b0": lambda: _ready(m.efficientnet_b0(num_classes=_CLASSES), 64),
        "tv-efficientnet_b1": lambda: _ready(m.efficientnet_b1(num_classes=_CLASSES), 64),
        "tv-convnext": lambda: _ready(_tv_convnext(tv, 1), 32),
        "tv-convnext_deep": lambda: _ready(_tv_convnext(tv, 2), 32),
        "tv-vit": lambda: _ready(m.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                     hidden_dim=64, mlp_dim=128, num_classes=_CLASSES), 32),
        "tv-swin": lambda: _ready(_tv_swin(tv, False), 32),
        "tv-swin_v2": lambda: _ready(_tv_swin(tv, True), 32),
        "tv-squeezenet1_1": lambda: _ready(m.squeezenet1_1(num_classes=_CLASSES), 64),
        "tv-shufflenet_v2_x0_5": lambda: _ready(m.shufflenet_v2_x0_5(num_classes=_CLASSES), 64),
        "tv-mnasnet0_5": lambda: _ready(m.mnasnet0_5(num_classes=_CLASSES), 64),
        "tv-regnet_y_400mf": lambda: _ready(m.regnet_y_400mf(num_classes=_CLASSES), 64),
        "tv-densenet": lambda: _ready(m.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16,
                                                 bn_size=2, num_classes=_CLASSES), 32),
        "tv-googlenet": lambda: _ready(m.googlenet(num_classes=_CLASSES, aux_logits=False, init_weights=True), 64),
    }


# ---------------------------------------------------------------------------------------------------- timm --

def _eager(model: nn.Module) -> nn.Module:
    """``model`` with timm's fused attention (``scaled_dot_product_attention``) turned off in every block, as the
    Hugging Face models use eager attention: with it, torch 2.13's dynamo exporter fails to decompose the reshape
    after attention (BEiT), and the TorchScript exporter fails on EVA-02's ``is_causal`` argument."""
    for m in model.modules():
        if isinstance(getattr(m, "fused_attn", None), bool):
            m.fused_attn = False
    return model


def timm_builders(timm: Any) -> dict[str, Builder]:
    """The timm models (``timm`` is the imported timm); transformers at small configs (``create_model``
    passes the sizes to the architecture's constructor)."""

    def make(arch: str, side: int, **kw: Any) -> Builder:
        return lambda: _ready(_eager(timm.create_model(arch, pretrained=False, num_classes=_CLASSES, **kw)), side)

    small_vit = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    return {
        "timm-vit_tiny": make("vit_tiny_patch16_224", 32, **small_vit),
        "timm-deit_tiny_distilled": make("deit_tiny_distilled_patch16_224", 32, **small_vit),
        "timm-beit": make("beit_base_patch16_224", 32, **small_vit),
        "timm-cait": make("cait_xxs24_224", 32, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                          depth_token_only=1),
        "timm-eva02": make("eva02_tiny_patch14_224", 32, img_size=32, patch_size=8, embed_dim=32, depth=2,
                           num_heads=2),
        "timm-levit": make("levit_128s", 64, img_size=64, embed_dim=(32, 48), key_dim=8, num_heads=(2, 3),
                           depth=(1, 1)),
        "timm-swin": make("swin_tiny_patch4_window7_224", 32, img_size=32, patch_size=4, window_size=4,
                          embed_dim=16, depths=(1, 1), num_heads=(2, 4)),
        "timm-mixer": lambda: _ready(timm.models.mlp_mixer.MlpMixer(  # its factory fixes the patch size
            num_classes=_CLASSES, img_size=32, patch_size=8, num_blocks=2, embed_dim=32), 32),
        "timm-convnext_atto": make("convnext_atto", 64),
        "timm-resnet18": make("resnet18", 64),
        "timm-efficientnet_b0": make("efficientnet_b0", 64),
        "timm-mobilenetv3_small_050": make("mobilenetv3_small_050", 64),
        "timm-regnetx_002": make("regnetx_002", 64),
        "timm-pvt_v2_b0": make("pvt_v2_b0", 64),
        "timm-mobilevit_xxs": make("mobilevit_xxs", 64),
    }


#: which models are the library's own size (with a 10-class head) and which a small config of the architecture
SIZES = ("library size with a 10-class head: tv-resnet18/34, tv-mobilenet_v2(_0.5), tv-mobilenet_v3_*, "
         "tv-efficientnet_b0/b1, tv-squeezenet1_1, tv-shufflenet_v2_x0_5, tv-mnasnet0_5, tv-regnet_y_400mf, "
         "tv-googlenet, timm-convnext_atto, timm-resnet18, timm-efficientnet_b0, timm-mobilenetv3_small_050, "
         "timm-regnetx_002, timm-pvt_v2_b0, timm-mobilevit_xxs; small configs: VGG at 1/4 width with a "
         "global-pool head, ConvNeXt 16/32 channels, ViT / DeiT / BEiT / CaiT / EVA-02 / Mixer 2 blocks of width "
         "32-64 on 32x32 images, Swin 16/32 channels, LeViT 32/48, DenseNet growth 8")


_QKV = ("the attention's qkv bias is built in the forward pass from several learned pieces, concat(q_bias, "
        "zeros, v_bias): no rule reads a bias made of more than one tensor, so the linear layer keeps no bias and "
        "the pieces are left at the child's init (reported unread)")
#: model -> why keeper does not warm it exactly (what the ONNX graph shows); the coverage report prints the reason
#: under the table for the rows that are not exact
GAPS: dict[str, str] = {
    "timm-beit": _QKV + "; with the dynamo exporter the zero key bias is a floating-point constant that counts as "
                 "learned",
    "timm-eva02": _QKV + "; with the dynamo exporter the zero key bias and the rotary table (`rope.pos_embed`, computed "
                  "at construction) are floating-point constants the ONNX graph cannot tell from parameters: they "
                  "count as learned",
}


def catalogue() -> tuple[dict[str, Builder], dict[str, str]]:
    """``(builders, skipped)``: the models of every library that imports, and ``{library: reason}`` for those
    that do not (:func:`vision_libs.import_torchvision` / ``import_timm``)."""
    builders: dict[str, Builder] = {}
    skipped: dict[str, str] = {}
    tv, why = import_torchvision()
    if tv is None:
        skipped["torchvision"] = why
    else:
        builders.update(torchvision_builders(tv))
    timm, why = import_timm()
    if timm is None:
        skipped["timm"] = why
    else:
        builders.update(timm_builders(timm))
    return builders, skipped


def growth_pairs(builders: dict[str, Builder]) -> list[tuple[str, str, str]]:
    """``(growth, parent name, child name)`` for the CNN growth pairs whose models are in ``builders``."""
    pairs = [
        ("depth", "tv-resnet18", "tv-resnet34"),
        ("depth", "tv-vgg11", "tv-vgg13"),
        ("depth", "tv-vgg11_bn", "tv-vgg13_bn"),
        ("channels x2", "tv-mobilenet_v2_0.5", "tv-mobilenet_v2"),
        ("channels x1.33", "tv-mobilenet_v3_large_0.75", "tv-mobilenet_v3_large"),
        ("depth", "tv-efficientnet_b0", "tv-efficientnet_b1"),
        ("depth", "tv-convnext", "tv-convnext_deep"),
    ]
    return [p for p in pairs if p[1] in builders and p[2] in builders]
