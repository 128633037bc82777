"""ServiceConfig: every tunable of the keeper Ray service, read from YAML (``configs/default.yaml`` mirrors the
defaults below) and overridden by keyword.

Invariant: a config is complete and checked once, here; actors receive a ServiceConfig and never read files or
the environment for settings. Unknown keys are refused (a typo must not silently fall back to a default).

Example:
    >>> cfg = load_config(None, zoo="/tmp/zoo", matchers=4)
    >>> cfg.matchers, cfg.actor_options("matcher")["num_cpus"]
    (4, 0.0)
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Union

from keeper.choice.selection import SelectionPolicy
from keeper.errors import ConfigError, KeeperError
from keeper.store.records import NAME_RE

if TYPE_CHECKING:  # the embedded zoo's modules: a trial reads this config and never builds one
    from keeper.zoo import ZooConfig

__all__ = ["ServiceConfig", "ClusteringConfig", "Timeouts", "ConfigError", "load_config", "ACTOR_KINDS",
           "DEFAULT_CONFIG_PATH"]

#: The actors (and the transfer task) whose Ray options the config holds.
ACTOR_KINDS = ("keeper", "zoo_manager", "matcher", "transfer")

#: Where the repository keeps the YAML twin of the defaults below.
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"

_ACTOR_KEYS = {"num_cpus", "num_gpus", "memory", "resources", "max_restarts", "max_task_retries",
               "max_concurrency", "scheduling_strategy", "runtime_env"}
_TASK_KEYS = {"num_cpus", "num_gpus", "memory", "resources", "max_retries", "scheduling_strategy", "runtime_env"}

_DEFAULT_ACTORS: dict[str, dict[str, Any]] = {
    # The front door waits on others most of the time: no CPU reserved, many threads.
    "keeper": {"num_cpus": 0.0, "max_restarts": -1, "max_task_retries": -1, "max_concurrency": 32},
    # The single writer: restarts reload the zoo from the store; retried calls are idempotent by content.
    "zoo_manager": {"num_cpus": 0.0, "max_restarts": -1, "max_task_retries": -1, "max_concurrency": 8},
    # Matchers are replaced by the pool, not restarted by Ray, so a dead one's batch is redone elsewhere at once.
    # No CPU reserved: a matcher computes in bursts of milliseconds between long waits, and a reservation would
    # take from Tune trials a CPU they need (on a 2-CPU Ray, two 1-CPU matchers starve every trial).
    "matcher": {"num_cpus": 0.0, "max_restarts": 0, "max_task_retries": 0, "max_concurrency": 1,
                "scheduling_strategy": "SPREAD"},
    # No CPU reserved either: a warm must never wait for a CPU that trials hold.
    "transfer": {"num_cpus": 0.0, "max_retries": 2},
}


@dataclass
class ClusteringConfig:
    """Two-stage search: k-medoids over ``1 - similarity`` and the probe plan of a query."""

    k: int | None = None              # None: round(sqrt(N))
    clusters_to_probe: int = 5        # clusters whose members a query scores after the medoids
    early_stop: float = 1.0           # a medoid scoring this probes its cluster alone (1.0: lossless, see yaml)
    brute_force_below: int = 512      # smaller zoos are scored whole, and no index is fitted for them
    recluster_stale: float = 0.2      # re-cluster in the background once adds/removes since the fit exceed this x N
    recluster_drift: float = 1.5      # ... or once arrivals sit this much farther from their medoid than the fit's
    fit_sample: int = 1000            # k-medoids runs on at most this many models; the rest join their nearest medoid
    local_below: int = 512            # a stage of at most this many alignments is scored in the front door itself
    seed: int = 0


@dataclass
class Timeouts:
    """Bounds, in seconds, of every remote wait the service makes."""

    query_s: float = 120.0      # one warm / search request, end to end
    batch_s: float = 30.0       # one matcher batch; past it the batch is redone elsewhere and the matcher replaced
    register_s: float = 300.0   # one registration (store write included)
    transfer_s: float = 300.0   # the weight transform task
    control_s: float = 30.0     # small control calls (view, stats, ping)
    start_s: float = 120.0      # start(): the front door answering its first ping
    arrival_s: float = 10.0     # a parent choice waits at most this long for registrations announced before it
    choice_s: float = 300.0     # warm_start in a trial or worker: the service's parent choice, arrivals included


@dataclass
class ServiceConfig:
    """Settings of the keeper service. See ``configs/default.yaml`` for the commented YAML form."""

    zoo: str | None = None                 # directory or pyarrow.fs URI; None: $KEEPER_ZOO or ~/.keeper/zoo
    namespace: str = "keeper"
    name: str = "keeper"                   # the front door's actor name; the manager is ``<name>-zoo``
    address: str | None = None             # ray.init address when start() has to connect; None: local / RAY_ADDRESS
    matchers: int = 2
    # admission and eviction (keeper.zoo.ZooConfig)
    capacity_bytes: int | None = None
    outlier_z: float | None = 3.0
    outlier_min_models: int = 5
    outlier_min_gap: float = 0.05
    near_duplicate: float = 0.1
    hit_half_life_s: float = 7 * 24 * 3600.0
    noise: float = 0.01
    seed: int = 0
    retention_s: float = 7 * 24 * 3600.0   # a removed or evicted model is held this long (the team table may say)
    # who this process is to the zoo (keeper.teams.Client): None / false take $KEEPER_TEAM, $KEEPER_USER,
    # $KEEPER_SECRET or $KEEPER_SECRET_FILE, $KEEPER_READ_ONLY. The secret itself is never a config value.
    team: str | None = None
    user: str | None = None
    secret_file: str | None = None
    read_only: bool = False
    # how warm_start and register read a torch module's architecture (keeper.torch_support.export_graph): None the
    # torch front end, the dynamo exporter where it cannot read a module ($KEEPER_EXPORTER chooses when set);
    # True torch's dynamo exporter; False its TorchScript exporter
    dynamo: bool | None = None
    # parent choice (keeper.choice.selection.SelectionPolicy)
    selection: dict[str, Any] = field(default_factory=lambda: {"floor": 0.3, "buckets": 10, "accuracy_aware": True,
                                                               "min_coverage": 0.3, "preserve": True,
                                                               "structure": True, "probe_top": 3,
                                                               "cross_structure": False})
    clustering: ClusteringConfig = field(default_factory=ClusteringConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    actors: dict[str, dict[str, Any]] = field(default_factory=lambda: copy.deepcopy(_DEFAULT_ACTORS))
    latency_window: int = 10000            # recent queries kept for the p50 / p99 in stats()

    @property
    def manager_name(self) -> str:
        return f"{self.name}-zoo"

    @property
    def zoo_uri(self) -> str:
        return self.zoo or os.environ.get("KEEPER_ZOO") or str(Path("~/.keeper/zoo").expanduser())

    def actor_options(self, kind: str) -> dict[str, Any]:
        """Ray options of one actor kind (or ``transfer`` task), None values left out."""
        if kind not in ACTOR_KINDS:
            raise ConfigError(f"actor kind {kind!r} is unknown; expected one of {ACTOR_KINDS}")
        return {k: v for k, v in self.actors.get(kind, {}).items() if v is not None}

    def zoo_config(self) -> ZooConfig:
        """The embedded zoo's settings (admission, eviction, selection, noise)."""
        from keeper.zoo import ZooConfig

        return ZooConfig(capacity_bytes=self.capacity_bytes, outlier_z=self.outlier_z,
                         outlier_min_models=self.outlier_min_models, outlier_min_gap=self.outlier_min_gap,
                         hit_half_life_s=self.hit_half_life_s,
                         near_duplicate=self.near_duplicate, selection=SelectionPolicy(**self.selection),
                         noise=self.noise, seed=self.seed, retention_s=self.retention_s)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


ConfigInput = Union[None, str, os.PathLike, Mapping[str, Any], ServiceConfig]


def load_config(config: ConfigInput = None, **overrides: Any) -> ServiceConfig:
    """A checked ServiceConfig from a YAML path, a mapping, or a ServiceConfig, with ``overrides`` on top.

    Nested sections merge key by key: ``load_config(actors={"matcher": {"num_cpus": 0.5}})`` keeps the
    matcher's other options. ``None`` means the built-in defaults (the same values as ``configs/default.yaml``).

    Raises:
        ConfigError: an unknown key, a wrong type or an out-of-range value, named with its path.
    """
    if isinstance(config, ServiceConfig):
        base = config.to_dict()
    elif config is None:
        base = {}
    elif isinstance(config, Mapping):
        base = copy.deepcopy(dict(config))
    else:
        base = _read_yaml(Path(config))
    merged = _merge(ServiceConfig().to_dict(), base, "")
    merged = _merge(merged, overrides, "")
    return _build(merged)


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass a YAML file such as "
                          "configs/default.yaml, or no config for the defaults")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r}: expected a mapping at the top level, got "
                          f"{type(data).__name__}")
    return data


def _merge(base: dict[str, Any], top: Mapping[str, Any], where: str) -> dict[str, Any]:
    # Sections whose keys are checked later (actor options against Ray's, selection against SelectionPolicy).
    open_section = where.startswith(("actors.", "selection."))
    out = dict(base)
    for key, value in top.items():
        path = f"{where}{key}"
        if key not in base and not open_section:
            raise ConfigError(f"config key {path!r} is unknown; known keys here: {sorted(base)}")
        if isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            out[key] = _merge(dict(base[key]), value, f"{path}.")
        else:
            out[key] = copy.deepcopy(value)
    return out


def _build(d: dict[str, Any]) -> ServiceConfig:
    try:
        clustering = ClusteringConfig(**d.pop("clustering"))
        timeouts = Timeouts(**{k: float(v) for k, v in d.pop("timeouts").items()})
        cfg = ServiceConfig(**d, clustering=clustering, timeouts=timeouts)
    except TypeError as exc:
        raise ConfigError(f"config: {exc}; see configs/default.yaml for every key") from None
    _check(cfg)
    return cfg


def _check(cfg: ServiceConfig) -> None:
    def bad(key: str, expected: str, got: Any) -> ConfigError:
        return ConfigError(f"config key {key!r} must be {expected}, got {got!r}")

    if isinstance(cfg.matchers, bool) or not isinstance(cfg.matchers, int) or cfg.matchers < 0:
        raise bad("matchers", "an integer >= 0", cfg.matchers)
    if cfg.zoo is not None and not isinstance(cfg.zoo, str):
        raise bad("zoo", "a directory or URI string", cfg.zoo)
    for kind, opts in cfg.actors.items():
        if kind not in ACTOR_KINDS:
            raise bad(f"actors.{kind}", f"one of {ACTOR_KINDS}", kind)
        allowed = _TASK_KEYS if kind == "transfer" else _ACTOR_KEYS
        unknown = sorted(set(opts) - allowed)
        if unknown:
            raise ConfigError(f"config key actors.{kind} has unknown options {unknown}; allowed: {sorted(allowed)}")
        for key in ("max_concurrency",):
            if key in opts and (not isinstance(opts[key], int) or opts[key] < 1):
                raise bad(f"actors.{kind}.{key}", "an integer >= 1", opts[key])
        if "num_cpus" in opts and opts["num_cpus"] is not None and float(opts["num_cpus"]) < 0:
            raise bad(f"actors.{kind}.num_cpus", "a number >= 0", opts["num_cpus"])
    c = cfg.clustering
    if c.k is not None and (not isinstance(c.k, int) or c.k < 1):
        raise bad("clustering.k", "null or an integer >= 1", c.k)
    if not isinstance(c.clusters_to_probe, int) or c.clusters_to_probe < 1:
        raise bad("clustering.clusters_to_probe", "an integer >= 1", c.clusters_to_probe)
    if not 0.0 < float(c.early_stop) <= 1.0:
        raise bad("clustering.early_stop", "a score in (0, 1]", c.early_stop)
    if not 0.0 < float(c.recluster_stale):
        raise bad("clustering.recluster_stale", "a fraction > 0", c.recluster_stale)
    if not isinstance(c.local_below, int) or c.local_below < 0:
        raise bad("clustering.local_below", "an integer >= 0", c.local_below)
    if not 1.0 <= float(c.recluster_drift):
        raise bad("clustering.recluster_drift", "a ratio >= 1", c.recluster_drift)
    if not isinstance(c.fit_sample, int) or c.fit_sample < 2:
        raise bad("clustering.fit_sample", "an integer >= 2", c.fit_sample)
    for name, value in dataclasses.asdict(cfg.timeouts).items():
        if not (math.isfinite(value) and value > 0):
            raise bad(f"timeouts.{name}", "a positive number of seconds", value)
    if not (math.isfinite(float(cfg.noise)) and cfg.noise >= 0):
        raise bad("noise", "a finite relative std >= 0", cfg.noise)
    if cfg.latency_window < 1:
        raise bad("latency_window", "an integer >= 1", cfg.latency_window)
    if not (isinstance(cfg.retention_s, (int, float)) and math.isfinite(cfg.retention_s) and cfg.retention_s >= 0):
        raise bad("retention_s", "a number of seconds >= 0", cfg.retention_s)
    for key in ("team", "user", "secret_file"):
        if getattr(cfg, key) is not None and not (isinstance(getattr(cfg, key), str) and getattr(cfg, key).strip()):
            raise bad(key, "null or a non-empty string", getattr(cfg, key))
    if cfg.team is not None and not NAME_RE.fullmatch(cfg.team):
        raise bad("team", "a team name (1 to 128 characters of A-Z a-z 0-9 . _ -, e.g. 'vision')", cfg.team)
    if not isinstance(cfg.read_only, bool):
        raise bad("read_only", "true or false", cfg.read_only)
    if cfg.dynamo is not None and not isinstance(cfg.dynamo, bool):
        raise bad("dynamo", "null, true or false", cfg.dynamo)
    try:
        SelectionPolicy(**cfg.selection)
    except TypeError as exc:
        raise ConfigError(f"config key 'selection': {exc}; allowed keys: floor, buckets, accuracy_aware, "
                          "min_coverage, preserve, structure, probe_top, cross_structure") from None
    except KeeperError as exc:
        raise ConfigError(f"config key 'selection': {exc}") from None
