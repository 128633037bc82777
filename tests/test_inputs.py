"""The example input a module makes for itself (keeper.torch_support.inputs): Hugging Face models from their
dummy inputs or their config, a LightningModule's example_input_array; an explicit input wins; any other module
gets an error naming the fix. And the Hugging Face Trainer building its model outside a search: warm_start leaves
it as built without starting Ray."""

from __future__ import annotations

import pytest
import torch

from keeper.errors import KeeperError
from keeper.torch_support import register, warm_start
from keeper.torch_support.export import export_graph
from keeper.torch_support.inputs import example_for
from keeper.zoo import Zoo

transformers = pytest.importorskip("transformers")


def bert(hidden: int = 32, layers: int = 1):
    config = transformers.BertConfig(vocab_size=100, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=32)
    return transformers.BertForSequenceClassification(config)


def test_a_hugging_face_model_makes_its_input_and_warms_without_one(tmp_path):
    zoo = Zoo(str(tmp_path / "zoo"))
    parent = bert(32, 1)
    (ids,) = example_for(parent)
    assert ids.dtype == torch.long and ids.dim() == 2  # its dummy_inputs' input_ids
    assert warm_start(parent, zoo=zoo).parent is None
    register(parent, None, zoo, 0.7, "bert-32x1")
    child = bert(32, 2)
    result = warm_start(child, zoo=zoo, noise=0.0)
    assert result.parent == "bert-32x1" and result.score > 0.5, result.reason
    assert torch.equal(child.bert.embeddings.word_embeddings.weight, parent.bert.embeddings.word_embeddings.weight)


def test_an_explicit_input_wins():
    model, given = bert(), torch.zeros(2, 12, dtype=torch.long)
    assert example_for(model, given) is given


def test_a_vision_model_builds_its_input_from_its_config():
    config = transformers.ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    model = transformers.ViTForImageClassification(config).to(torch.float64)
    (pixels,) = example_for(model)  # its dummy_inputs hold input_ids, not its main input
    assert pixels.shape == (1, 3, 16, 16) and pixels.dtype == torch.float64
    assert export_graph(model, (pixels,)).graph.total_params > 0


def test_a_lightning_module_gives_its_example_input_array():
    pl = pytest.importorskip("lightning.pytorch")

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)
            self.example_input_array = torch.ones(3, 4)

        def forward(self, x):
            return self.net(x)

    module = Net()
    assert torch.equal(example_for(module), torch.ones(3, 4))
    assert export_graph(module, example_for(module)).keys  # the LightningModule itself traces


def test_any_other_module_without_an_input_is_told_to_pass_one():
    with pytest.raises(KeeperError, match=r"Linear cannot make an example input.*warm_start\(model, example_input\)"):
        warm_start(torch.nn.Linear(4, 2))


def test_the_trainer_building_its_model_outside_a_search_keeps_it_as_built_without_starting_ray(tmp_path):
    import ray

    assert not ray.is_initialized()
    results = []

    def model_init(trial):
        model = bert()
        results.append(warm_start(model))  # no zoo given, no service: this is the Trainer's own construction call
        return model

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    transformers.Trainer(model_init=model_init, args=args)
    assert len(results) == 1 and results[0].parent is None and "outside a search" in results[0].reason
    assert not ray.is_initialized()
