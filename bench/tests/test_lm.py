"""The language-modelling workload's pieces: corpus, tokenizer, catalogue, plateau detector, steps to target."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keeper_bench.lm import (CORPUS_FILES, ByteTokenizer, arrivals, build, evaluate, example_input, neighbours,
                             num_params, stdlib_corpus, train)
from keeper_bench.plateau import at_plateau, tail_gain
from keeper_bench.lm_nas import LmRecord, LmRun, steps_to_target, summarize


@pytest.fixture(scope="module")
def corpus():
    return stdlib_corpus()


def test_corpus_is_deterministic_and_split_by_file(corpus):
    again = stdlib_corpus()
    assert again.sha256 == corpus.sha256 and again.train == corpus.train
    assert not set(corpus.train_files) & set(corpus.validation_files)
    assert len(corpus.validation_files) >= 10 and len(corpus.train) > 3 * len(corpus.validation) > 100_000
    # every fifth listed file is validation, the order of the list is kept
    assert list(corpus.validation_files) == [f for i, f in enumerate(CORPUS_FILES) if (i + 1) % 5 == 0
                                             and f in corpus.validation_files]
    assert b"def " in corpus.train and b'"""' in corpus.validation  # source and docstrings


def test_corpus_missing_files_raise_naming_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="argparse.py"):
        stdlib_corpus(str(tmp_path))


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and (ids.size == 0 or (ids.min() >= 0 and ids.max() < tok.vocab_size))
    assert tok.decode(ids) == text


def test_byte_tokenizer_rejects_out_of_range_ids():
    with pytest.raises(ValueError, match="byte tokens"):
        ByteTokenizer().decode([300])


def test_catalogue_size_and_variety():
    specs = arrivals(24)
    assert len({json.dumps(s, sort_keys=True) for s in specs}) == 24
    assert {s["family"] for s in specs} == {"gpt2", "llama"}
    for key in ("d_model", "layers", "heads", "ffn"):
        assert len({s[key] for s in specs}) >= 2, key
    llama = [s for s in specs if s["family"] == "llama"]
    assert any(s["kv_heads"] < s["heads"] for s in llama)  # grouped-query attention is in the catalogue
    assert arrivals(24) == specs  # deterministic
    for s in specs[2:]:  # every later arrival is one step from an earlier one of its family
        earlier = [e for e in specs[:specs.index(s)] if e["family"] == s["family"]]
        assert any(s in neighbours(e) for e in earlier)


def test_models_build_with_their_shapes():
    import torch

    for spec in arrivals(24)[:2]:
        model = build(spec)
        cfg = model.hf.config
        assert model(example_input()).shape == (1, 64, 256)
        assert num_params(model) > 0
        if spec["family"] == "llama":
            assert (cfg.num_key_value_heads, cfg.intermediate_size) == (spec["kv_heads"], spec["ffn"])
            assert isinstance(model.hf, __import__("transformers").LlamaForCausalLM)
        else:
            assert (cfg.n_inner, cfg.n_layer) == (spec["ffn"], spec["layers"])
    with pytest.raises(ValueError, match="kv_heads"):
        build({"family": "llama", "d_model": 32, "layers": 2, "heads": 4, "kv_heads": 3, "ffn": 64})
    torch.manual_seed(0)


def test_training_lowers_validation_loss(corpus):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend
    try:
        torch.manual_seed(0)
        model = build(arrivals(2)[1])
        before, _ = evaluate(model, corpus, windows=16)
        assert abs(before - np.log(256)) < 0.5  # random init: about uniform over bytes
        h = train(model, corpus, steps=40, eval_every=20, batch_size=4, eval_windows=16)
    finally:
        torch.set_num_threads(threads)
    assert h.steps == [20, 40] and h.losses[-1] < before - 1.0 and 0.0 < h.accuracies[-1] < 1.0


def test_plateau_detector():
    steps = list(range(10, 110, 10))
    flat = [3.0, 2.5, 2.2, 2.1, 2.05, 2.03, 2.02, 2.015, 2.012, 2.01]
    assert tail_gain(steps, flat) == pytest.approx((2.015 - 2.01) / 2.015)
    assert at_plateau(steps, flat)
    still = [3.0, 2.8, 2.6, 2.4, 2.2, 2.0, 1.9, 1.8, 1.7, 1.6]
    assert tail_gain(steps, still) == pytest.approx((1.8 - 1.6) / 1.8) and not at_plateau(steps, still)
    acc = [0.1, 0.5, 0.6, 0.65, 0.7, 0.72, 0.73, 0.74, 0.745, 0.75]  # higher is better
    assert tail_gain(steps, acc, lower_is_better=False) == pytest.approx((0.75 - 0.74) / 0.74)
    assert not at_plateau(steps, acc, lower_is_better=False, threshold=0.005)
    with pytest.raises(ValueError, match="evaluate at least"):
        tail_gain([100], [2.0])


def test_steps_to_target_and_slow_trials():
    run = LmRun(budgets=(("gpt2", 100),), evaluations=4, tolerance=0.01)
    cold = LmRecord(0, "gpt2", "a", 1, "", 0.0, 100, [25, 50, 75, 100], [3.0, 2.5, 2.02, 2.0], [0.1] * 4)
    fast = LmRecord(0, "gpt2", "a", 1, "p", 1.0, 100, [25, 50, 75, 100], [2.1, 2.0, 1.99, 1.98], [0.2] * 4)
    slow = LmRecord(0, "gpt2", "a", 1, "p", 1.0, 100, [25, 50, 75, 100], [3.0, 2.9, 2.5, 2.3], [0.1] * 4)
    assert steps_to_target(cold, 2.02) == (75, True)
    assert steps_to_target(fast, 2.02) == (50, True)
    assert steps_to_target(slow, 2.02) == (100, False)
    s = summarize([cold, cold], [fast, slow], run)
    assert s["cold_steps"] == [75, 75] and s["arm_steps"] == [50, 100]
    assert s["speedup"] == pytest.approx(150 / 150) and s["slow"] == [[0, 75, 100]]
    assert s["reached"] == 1 and s["warmed"] == 2
