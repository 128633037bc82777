"""Parent choice: which zoo models may be a child's parent, what each alignment keeps, and which one is chosen.

:mod:`~keeper.choice.candidates` assembles the candidates (signature bounds, exact scores, each pair assessed once),
:mod:`~keeper.choice.preservation` reads from an alignment alone whether warming along it keeps the parent's
function and how well it maps blocks onto blocks, :mod:`~keeper.choice.selection` ranks the candidates under a
:class:`SelectionPolicy` into a :class:`ParentChoice` and says why, and :mod:`~keeper.choice.probe` scores the best
of them and the cold init on the caller's data when it gives a probe.

Invariant: a choice depends only on the zoo's models and the child's graph (and the probe's data), never on which
process made it: the embedded zoo and the service's front door assemble, assess and rank alike.
"""

from keeper.lazy import exports

__all__ = ["Candidate", "ParentChoice", "SelectionPolicy", "choose_parent", "rank_parents", "make_choice", "coverage",
           "reason_of", "SHOWN", "Assessment", "Roles", "assess", "assess_candidate", "layer_roles", "ParentFacts",
           "Assessable", "AssessedPairs", "architecture_digest", "may_qualify_all", "assess_found", "ProbeReport",
           "ResultScore", "probe_choice"]

# Imported on first use: reading a choice (selection) must not load the assessment's aligner and transforms, which
# a trial process needs only when it transforms a parent.
_WHERE = {"candidates": ("AssessedPairs", "Assessable", "ParentFacts", "architecture_digest", "assess_candidate",
                         "assess_found", "may_qualify_all"),
          "preservation": ("Assessment", "Roles", "assess", "layer_roles"),
          "probe": ("ProbeReport", "ResultScore", "probe_choice"),
          "selection": ("SHOWN", "Candidate", "ParentChoice", "SelectionPolicy", "choose_parent", "coverage",
                        "make_choice", "rank_parents", "reason_of")}
__getattr__, __dir__ = exports(__name__, {name: f"{__name__}.{module}" for module, names in _WHERE.items()
                                          for name in names})
