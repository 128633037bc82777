"""The alignment of two LayerGraphs and the compiled dynamic programs under it, in one place.

:mod:`~keeper.matching.alignment` is the public face (``similarity``, ``align``, ``score_many``, the signature
bounds and the flat arrays they read); :mod:`~keeper.matching.core` picks where the dynamic programs run, keeper's
C extension (``_dpcore.c``) or the same kernels under numba (:mod:`~keeper.matching.kernels`, whose machine code
:mod:`~keeper.matching.kernel_cache` keeps once per machine).

Invariant: both implementations of the kernels return identical integers for identical arrays, so a score never
depends on which one ran.
"""

from keeper.matching.alignment import (DEFAULT_RULES, SIGNATURE_SIZE, Alignment, MatchArrays, MatchRules,
                                       PackedParents, align, level_classes, match_arrays, score_many, signature,
                                       similarity, upper_bounds)

__all__ = ["similarity", "align", "score_many", "Alignment", "MatchArrays", "MatchRules", "DEFAULT_RULES",
           "PackedParents", "match_arrays", "signature", "upper_bounds", "SIGNATURE_SIZE", "level_classes"]
