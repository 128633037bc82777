"""Weight transforms: pure functions over numpy arrays that turn parent tensors into child tensors.

One module per operator family: :mod:`width` (unit maps, Net2Net growth, importance shrink), :mod:`kernel`
(centred pad / crop), :mod:`depth` (identity and zero fills for new layers). :mod:`unit_maps` chooses, once per
channel group, which parent unit each child unit copies; :mod:`compose` applies the operators to a whole child
graph given an alignment.
"""

from keeper.transforms.compose import Transfer, transfer

__all__ = ["Transfer", "transfer"]
