"""The one error hierarchy of keeper.

Every message names the item, what was expected, and the fix. Input checks raise these, never ``assert``.
"""

from __future__ import annotations

__all__ = [
    "KeeperError",
    "InvalidModelError",
    "InvalidWeightsError",
    "AdmissionError",
    "CheckpointError",
    "StoreError",
    "ProbeError",
    "CorruptModelError",
    "ZooNotFoundError",
    "ModelNotFoundError",
    "HeldModelNotFoundError",
    "RestoreConflictError",
    "AccessError",
    "UnknownTeamError",
    "SecretMissingError",
    "SecretRejectedError",
    "ReadOnlyClientError",
    "NotOwnerError",
    "TeamMismatchError",
    "RateLimitedError",
    "ImplausibleAccuracyError",
    "TransformError",
    "ServiceError",
    "ConfigError",
    "PartialWarmWarning",
    "TraceUnsupported",
    "TraceFallbackWarning",
    "KernelCompileWarning",
]


class KeeperError(Exception):
    """Base of every error keeper raises on purpose."""


class InvalidModelError(KeeperError, ValueError):
    """A model (ONNX bytes, path or ModelProto) cannot be read safely or is not a model keeper can use."""


class InvalidWeightsError(InvalidModelError):
    """A weights file (safetensors) is unreadable, or does not hold what its graph says (a tensor missing, of
    another shape or dtype, or over the size caps)."""


class AdmissionError(KeeperError, ValueError):
    """A model offered to the zoo was refused (bad name, bad accuracy, outlier); nothing was stored."""


class CheckpointError(KeeperError):
    """A checkpoint's weight files cannot be read whole (damaged, refused by ``weights_only=True``, two that
    disagree, a shard missing); the message names the file. Nothing is read from it in part."""


class StoreError(KeeperError):
    """The durable store could not complete an operation; what was already stored is intact."""


class CorruptModelError(StoreError):
    """A stored blob does not match its recorded checksum."""


class ZooNotFoundError(StoreError):
    """A zoo opened for reading is not there (nothing is created by reading)."""


class ModelNotFoundError(KeeperError, KeyError):
    """No model of that name is in the zoo."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep messages readable
        return str(self.args[0]) if self.args else "model not found"


class HeldModelNotFoundError(ModelNotFoundError):
    """No model of that name (or hold id) is in the zoo's holding area: it was never removed or evicted, its
    retention ended and ``gc`` deleted it, or it was restored already."""


class RestoreConflictError(KeeperError, ValueError):
    """A held model cannot be restored under its name: the name is live again (another model was registered
    under it, or the same one restored). Nothing changed; the message names the live model's owner and the fix
    (remove the live one first, or restore under another name)."""


class ImplausibleAccuracyError(AdmissionError):
    """A registration's accuracy is above every model of its architecture by more than the outlier rule allows
    (a shared zoo's guard against a model claiming to be everyone's best parent); nothing was stored."""


class AccessError(KeeperError, PermissionError):
    """A request was refused by the zoo's team rules (:mod:`keeper.teams`); nothing changed in the zoo. Every
    message names the model (where there is one), its owning team, what was missing and the fix; never a
    secret."""


class UnknownTeamError(AccessError):
    """The client names a team the zoo's team table does not hold."""


class SecretMissingError(AccessError):
    """A write (or a read of private models) came without its team's secret (``KEEPER_SECRET``,
    ``KEEPER_SECRET_FILE``, ``secret_file`` in the config)."""


class SecretRejectedError(AccessError):
    """The secret a client presented does not match its team's (a forged, stale or mistyped secret)."""


class ReadOnlyClientError(AccessError):
    """A read-only client asked for a write, or presented a secret (a read-only client holds none, so a secret
    in its environment is a leak to fix, not a credential to use)."""


class NotOwnerError(AccessError):
    """Only a model's owning team, or an operator, may update its accuracy, aliases or privacy, remove or restore
    it; the client is of another team."""


class TeamMismatchError(AccessError):
    """A registration names a team other than the client's own (only an operator registers for another team)."""


class RateLimitedError(AccessError):
    """A team sent more registrations than the zoo's rate allows (``rate`` in the team table); retry after the
    number of seconds the message names. Nothing was stored."""


class TransformError(KeeperError):
    """A parent tensor could not be transformed onto the child's tensor."""


class ProbeError(KeeperError, ValueError):
    """A data probe given to a warm start did not return a loss (a finite or infinite float)."""


class ServiceError(KeeperError):
    """The keeper Ray service failed to answer within its bounds."""


class ConfigError(KeeperError, ValueError):
    """A configuration file or value is invalid; the message names the key, what was expected and the fix."""


class PartialWarmWarning(UserWarning):
    """A warm start from a parent left some of the module's tensors at their own initialisation (not inherited);
    the message names them. Silent partial success is never the outcome."""


class TraceUnsupported(KeeperError):
    """The torch front end (:mod:`keeper.torch_support.trace`) cannot follow a module's forward: an op outside its
    rule table touching the input or a learned tensor, data-dependent control flow, a tensor of unknown origin.
    :func:`keeper.torch_support.export_graph` catches it and uses the ONNX exporter instead."""


class TraceFallbackWarning(UserWarning):
    """A module's architecture came from the ONNX exporter (seconds) instead of the torch front end
    (milliseconds); the message names the module and the op or reason."""


class KernelCompileWarning(UserWarning):
    """keeper's compiled alignment kernels (``keeper.matching._dpcore``) are not built in this install, so the numba
    ones run: compiled once per machine (seconds), loaded in every process (about half a second). Said once per
    process; the message names the cache directory and how to get the compiled kernels."""
