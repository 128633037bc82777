"""Growth of real architectures (Hugging Face transformers built from configs): depth placed by the residual
stream whichever exporter wrote the graph, and integer-factor d_model growth, computing the parent's function.

GPT-2 and BERT are given their position (and token-type) ids as inputs, so their position tables are read through
a data index: these tests measure the growth operators; reading tables gathered by a constant index is another
matter (``WarmResult.missing`` must be empty here, so nothing is left unread silently). GPT-2 runs tied and untied:
a tied ``wte`` / ``lm_head`` copies the grown stream as the embedding, so the final LayerNorm feeding the head
divides its output by the copy counts instead of the head (Llama tied: its RMSNorm weight does). The T5 encoder's relative-position bias, computed in
its first block and read by all, keeps the parent's table when new blocks come first; Swin's shifted windows (a
roll written as slices and a concatenation) and patch merging (strided slices joined along channels) keep the
stream's channel group, and a new shifted block's branch is zeroed through its roll.
"""

from __future__ import annotations

import numpy as np
import pytest

import hf_growth
# transformers comes with the test extra: a missing install fails here rather than skipping
hf_growth.import_transformers()

EXPORTERS = {"dynamo": True, "torchscript": False}
GPT2 = dict(positions=True, tied=False)
BERT = dict(positions=True)

DEPTH = [
    ("llama", {}, dict(layers=4)),        # pre-RMSNorm, GQA, RoPE, SwiGLU: dynamo writes RMSNorm out in ops
    ("gpt2", GPT2, dict(layers=4)),       # pre-LN, packed q/k/v (Conv1D)
    ("bert", BERT, dict(layers=4)),       # post-LN: new blocks go before the embeddings' LayerNorm (see below)
    ("bert", {}, dict(layers=4)),         # the same with the position table read at arange(seq) from a buffer
    ("distilbert", {}, dict(layers=4)),   # post-LN, position table from a buffer
    ("t5-encoder", {}, dict(layers=4)),   # one relative-position bias table, in block 0, read by every block
    ("swin", {}, dict(layers=4)),         # shifted windows (a roll), patch merging, a bias table per block
]
D_MODEL_X2 = [
    ("llama", {}, dict(d=64, heads=8, kv_heads=4, ffn=128)),
    ("llama", dict(tied=True), dict(d=64, heads=8, kv_heads=4, ffn=128)),  # tied head after an RMSNorm weight
    ("gpt2", GPT2, dict(d=64, heads=8, ffn=128)),
    ("gpt2", dict(positions=True), dict(d=64, heads=8, ffn=128)),  # LM head tied to the token embedding
    ("bert", BERT, dict(d=64, heads=8, ffn=128)),
    ("swin", {}, dict(d=32, heads=4)),    # the merged patches' four parts each the grown stream
]
D_MODEL_IDS = ["llama", "llama-tied", "gpt2", "gpt2-tied", "bert", "swin"]


DEPTH_IDS = ["llama", "gpt2", "bert", "bert-buffer-positions", "distilbert", "t5-encoder", "swin"]


@pytest.mark.parametrize("family,parent,child", DEPTH, ids=DEPTH_IDS)
def test_depth_growth_is_exact_and_placed_alike_with_both_exporters(family, parent, child):
    # BERT is post-LN: a block is not the identity after a LayerNorm with its own weights, but in front of the
    # embeddings' LayerNorm it changes nothing: with zero branches it is a unit LayerNorm (the child's own init),
    # and a LayerNorm gives the same on a unit LayerNorm's output as on its input; the placement is that one,
    # whether the position table is read through ids given as an input or at arange(seq) (a table added to the
    # data counts as a sum, like the Add of embeddings, in the alignment's costs)
    placed = []
    for exporter, dynamo in EXPORTERS.items():
        r = hf_growth.growth_deviation(family, parent, child, dynamo=dynamo)
        assert not r.missing, r.missing
        assert r.warm <= 1e-4, f"{family} depth, {exporter}: deviation {r.warm:.2e} (child's own init {r.init:.2f})"
        for s in set(r.segment[r.new].tolist()):  # a block of the stream is new as a whole or not at all
            assert s >= 0 and r.new[r.segment == s].all(), (family, exporter, r.segment, r.new)
        placed.append(r.new)
    assert placed[0].shape == placed[1].shape and np.array_equal(placed[0], placed[1]), placed


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("family,parent,child", D_MODEL_X2, ids=D_MODEL_IDS)
def test_d_model_doubling_is_exact_with_both_exporters(family, parent, child, exporter):
    # every stream unit copied twice (norm statistics kept), whole heads cloned (RoPE and the 1/sqrt(head size)
    # scale see the parent's head size), GQA's key/value heads cloned alike
    r = hf_growth.growth_deviation(family, parent, child, dynamo=EXPORTERS[exporter])
    assert not r.missing, r.missing
    assert r.warm <= 1e-4, f"{family} d_model x2, {exporter}: deviation {r.warm:.2e} (child's init {r.init:.2f})"
    assert r.init > 0.5  # the child's own init is far: the warm start is what makes it exact
