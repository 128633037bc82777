"""Teams in a shared zoo: who a client is, what it may do, and the operator's table that says so. The one place
these rules live: the embedded :class:`keeper.Zoo` (and so the service's ZooManager, which owns one), the front
door and the ``keeper`` command all ask an :class:`Access`.

The rules:
    * **A zoo without teams** (no team table in its store) has one default team: every client may read, warm,
      register, update and remove every model, as before teams. A client may still say its team: it is recorded
      as the model's owner, unchecked; a secret it presents is ignored.
    * **A zoo with teams** holds the operator's team table (``access/teams.json``: per team a salted PBKDF2 hash of
      its secret, never the secret; an optional byte budget and share). Anyone may read and warm from a model
      that is not private; a private model only its team (with its secret) or an operator sees. Every write
      needs the client's team secret: registering (as its own team only, unless an operator), updating a model's
      accuracy, aliases or privacy, removing or restoring it (its owning team or an operator only). The operator
      is the team :data:`OPERATOR` with the operator's secret. Models registered before teams belong to
      :data:`DEFAULT_TEAM`: readable by all, changed by an operator (or by the default team, should the table
      give it a secret).
    * **A read-only client** holds no secret and writes nothing; a read-only client that presents a secret is
      refused whatever it asks (the secret in its environment is a leak to fix).
    * **Budgets**: a team's byte budget is the smaller of its own ``capacity_bytes`` and its share of the zoo's
      global ``capacity_bytes``: global x its ``share`` / the sum of the shares of the table's teams and of every
      other team holding models (a share is 1 unless the table sets it). Admitting a team's model evicts only
      that team's models, so no team's registrations can push out another's.
    * **Rate**: a team (not an operator) may register ``rate_burst`` models at once, then ``rate_per_s`` a second;
      past that a registration is refused (:class:`~keeper.errors.RateLimitedError`) before anything is read.

Invariants: a secret is compared with ``hmac.compare_digest`` against a salted hash and never stored, logged,
put in a message or shown by a ``repr``; every refusal is a subclass of :class:`~keeper.errors.AccessError` whose
message names the model, its owner, what was missing and the fix, and changes nothing in the zoo.

What this cannot enforce: the store itself. Any process holding the bucket's (or directory's) write credentials
can write the catalog, the table and the blobs directly, and any reader with read credentials can read private
models' blobs; the rules hold for writes made through keeper (the service, the embedded zoo, the CLI).

Example:
    >>> access = Access(store)                                            # doctest: +SKIP
    >>> me = access.authenticate(Client.from_env(), "removing", "r18")     # doctest: +SKIP
    >>> access.check_change(me, store.record("r18"), "remove")             # doctest: +SKIP
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import math
import os
import secrets as _secrets
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from keeper.errors import (AccessError, ConfigError, NotOwnerError, RateLimitedError, ReadOnlyClientError,
                           SecretMissingError, SecretRejectedError, StoreError, TeamMismatchError, UnknownTeamError)
from keeper.store.records import DEFAULT_TEAM, NAME_RE, ModelRecord

__all__ = ["DEFAULT_TEAM", "OPERATOR", "SecretHash", "TeamEntry", "TeamTable", "Client", "Principal", "Access",
           "new_secret"]

#: The operator's team name: a client of this team with the operator's secret may do anything.
OPERATOR = "operator"
#: PBKDF2-HMAC-SHA256 iterations of a new hash (each hash keeps its own count, so old ones still verify).
ITERATIONS = 200_000
#: Registrations a team may send at once, and per second after that, unless the table says otherwise.
RATE_BURST = 100
RATE_PER_S = 2.0
#: An accuracy this far above the best model of its architecture is implausible (see keeper.zoo), unless the
#: table says otherwise (None: off).
OUTLIER_ABOVE_GAP = 0.25
_TRUE = ("1", "true", "yes", "on")
_ACTIONS = {"register": "register", "alias": "alias", "update": "update the accuracy of", "private":
            "change the privacy of", "remove": "remove", "restore": "restore", "record-again": "record a training of",
            "read": "read"}


def _team_name(value: object, where: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ConfigError(f"{where}: team name {value!r} is not allowed; use 1 to 128 characters of A-Z a-z 0-9 . _ -, "
                          "not starting with '.' (e.g. 'vision')")
    return value


def new_secret() -> str:
    """A fresh random team secret (what ``keeper team add`` gives a team when no secret file is named)."""
    return _secrets.token_urlsafe(32)


@dataclass(frozen=True)
class SecretHash:
    """A salted PBKDF2-HMAC-SHA256 hash of a secret; the secret itself is never kept."""

    salt: str
    digest: str
    iterations: int = ITERATIONS

    @classmethod
    def of(cls, secret: str, iterations: int = ITERATIONS) -> "SecretHash":
        if not isinstance(secret, str) or len(secret) < 8:
            raise ConfigError("a team secret must be a string of at least 8 characters; `keeper team add NAME` "
                              "makes one")
        salt = os.urandom(16)
        return cls(salt.hex(), _derive(secret, salt, iterations).hex(), iterations)

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is the one hashed (constant-time comparison; cached per process)."""
        return _verified(self, secret)

    def to_json(self) -> dict[str, Any]:
        return {"kdf": "pbkdf2-sha256", "iterations": self.iterations, "salt": self.salt, "hash": self.digest}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SecretHash":
        if d.get("kdf") != "pbkdf2-sha256":
            raise ValueError(f"unknown key derivation {d.get('kdf')!r}")
        out = cls(str(d["salt"]), str(d["hash"]), int(d["iterations"]))
        bytes.fromhex(out.salt), bytes.fromhex(out.digest)
        return out

    def __repr__(self) -> str:
        return "SecretHash(<hidden>)"


def _derive(secret: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, iterations)


# Verified (hash, presented secret) pairs, keyed by an HMAC under a key of this process (never the secret), so a
# burst of requests pays the key derivation once.
_PROCESS_KEY = os.urandom(32)
_VERDICTS: dict[bytes, bool] = {}
_VERDICTS_LOCK = threading.Lock()


def _verified(h: SecretHash, secret: str) -> bool:
    tag = hmac.new(_PROCESS_KEY, f"{h.salt}:{h.digest}:{h.iterations}:".encode() + secret.encode(),
                   hashlib.sha256).digest()
    with _VERDICTS_LOCK:
        known = _VERDICTS.get(tag)
    if known is not None:
        return known
    ok = hmac.compare_digest(_derive(secret, bytes.fromhex(h.salt), h.iterations), bytes.fromhex(h.digest))
    with _VERDICTS_LOCK:
        if len(_VERDICTS) > 4096:
            _VERDICTS.clear()
        _VERDICTS[tag] = ok
    return ok


@dataclass(frozen=True)
class TeamEntry:
    """One team of the table: its secret's hash, and its byte budget and share of the global one."""

    name: str
    secret: SecretHash | None
    capacity_bytes: int | None = None
    share: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return {"secret": None if self.secret is None else self.secret.to_json(),
                "capacity_bytes": self.capacity_bytes, "share": self.share}


@dataclass(frozen=True)
class TeamTable:
    """The operator's table of a zoo with teams (stored as ``access/teams.json``).

    ``retention_s``: how long a removed or evicted model is held before ``gc`` deletes it (None: the client's
    ``retention_s`` setting); ``rate_burst`` / ``rate_per_s``: each team's registration rate;
    ``outlier_above_gap``: how far above the best model of its architecture an accuracy may be (None: no limit).
    """

    operator: SecretHash | None
    teams: Mapping[str, TeamEntry] = field(default_factory=dict)
    retention_s: float | None = None
    rate_burst: int = RATE_BURST
    rate_per_s: float = RATE_PER_S
    outlier_above_gap: float | None = OUTLIER_ABOVE_GAP

    def to_json(self) -> dict[str, Any]:
        return {"format": 1, "operator": None if self.operator is None else self.operator.to_json(),
                "teams": {n: e.to_json() for n, e in sorted(self.teams.items())}, "retention_s": self.retention_s,
                "rate": {"burst": self.rate_burst, "per_s": self.rate_per_s},
                "outlier_above_gap": self.outlier_above_gap}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TeamTable":
        """Parse the table; ValueError when it is malformed."""
        try:
            teams = {}
            for n, e in dict(d.get("teams") or {}).items():
                cap = e.get("capacity_bytes")
                teams[_team_name(n, "team table")] = TeamEntry(
                    n, None if e.get("secret") is None else SecretHash.from_json(e["secret"]),
                    None if cap is None else int(cap), float(e.get("share", 1.0)))
            rate = dict(d.get("rate") or {})
            gap = d.get("outlier_above_gap", OUTLIER_ABOVE_GAP)
            ret = d.get("retention_s")
            return cls(operator=None if d.get("operator") is None else SecretHash.from_json(d["operator"]),
                       teams=teams, retention_s=None if ret is None else float(ret),
                       rate_burst=int(rate.get("burst", RATE_BURST)), rate_per_s=float(rate.get("per_s", RATE_PER_S)),
                       outlier_above_gap=None if gap is None else float(gap))
        except (KeyError, TypeError, ValueError, AttributeError, ConfigError) as exc:
            raise ValueError(f"the team table is malformed ({exc})") from None

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, indent=1).encode()

    def with_team(self, name: str, secret: str | None, *, capacity_bytes: int | None = None,
                  share: float = 1.0) -> "TeamTable":
        """The table with team ``name`` added or replaced (``secret`` hashed here; None keeps the old hash)."""
        _team_name(name, "keeper team add")
        if name == OPERATOR:
            raise ConfigError(f"team name {OPERATOR!r} is the operator's; pick another name for a team")
        old = self.teams.get(name)
        if secret is None and old is None:
            raise ConfigError(f"team {name!r} is new, so it needs a secret")
        if capacity_bytes is not None and (not isinstance(capacity_bytes, int) or capacity_bytes < 0):
            raise ConfigError(f"team {name!r}: capacity_bytes {capacity_bytes!r} must be an integer >= 0, or None")
        if not share > 0:
            raise ConfigError(f"team {name!r}: share {share!r} must be a number > 0")
        entry = TeamEntry(name, SecretHash.of(secret) if secret is not None else old.secret, capacity_bytes,
                          float(share))
        return replace(self, teams={**self.teams, name: entry})

    def without_team(self, name: str) -> "TeamTable":
        if name not in self.teams:
            raise ConfigError(f"team {name!r} is not in the table; `keeper team ls` lists them")
        return replace(self, teams={n: e for n, e in self.teams.items() if n != name})


@dataclass(frozen=True)
class Client:
    """Who a request comes from, as the client presents itself: its team, its user, its team's secret (or none),
    whether it is read-only, and where it runs. Travels to the service as :meth:`to_wire` (the secret as the
    client presents it, checked there against the table's hash, never stored).

    Example:
        >>> Client.from_env(team="vision", secret="s3cr3t-of-vision")
        Client(team='vision', user=..., secret=<given>, read_only=False, host=..., pid=...)
    """

    team: str = DEFAULT_TEAM
    user: str | None = None
    secret: str | None = None
    read_only: bool = False
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)

    def __repr__(self) -> str:
        return (f"Client(team={self.team!r}, user={self.user!r}, secret={'<given>' if self.secret else None}, "
                f"read_only={self.read_only}, host={self.host!r}, pid={self.pid})")

    @classmethod
    def from_env(cls, team: str | None = None, *, user: str | None = None, secret: str | None = None,
                 secret_file: str | os.PathLike | None = None, read_only: bool | None = None,
                 environ: Mapping[str, str] | None = None) -> "Client":
        """This process as a client: each argument given wins, else the environment (``KEEPER_TEAM``,
        ``KEEPER_USER``, ``KEEPER_SECRET``, ``KEEPER_SECRET_FILE``, ``KEEPER_READ_ONLY``), else the default team,
        the login name, no secret, not read-only.

        Raises:
            ConfigError: a bad team name, or a secret file that cannot be read.
            ReadOnlyClientError: read-only with a secret at hand.
        """
        env = os.environ if environ is None else environ
        team = _team_name(team if team is not None else env.get("KEEPER_TEAM") or DEFAULT_TEAM, "client")
        if read_only is None:
            read_only = env.get("KEEPER_READ_ONLY", "").strip().lower() in _TRUE
        where = "the secret argument"
        if secret is None and secret_file is not None:
            secret, where = _read_secret(secret_file, "secret_file"), f"secret_file {str(secret_file)!r}"
        if secret is None and env.get("KEEPER_SECRET"):
            secret, where = env["KEEPER_SECRET"], "KEEPER_SECRET"
        if secret is None and env.get("KEEPER_SECRET_FILE"):
            path = env["KEEPER_SECRET_FILE"]
            secret, where = _read_secret(path, "KEEPER_SECRET_FILE"), f"KEEPER_SECRET_FILE {path!r}"
        if read_only and secret:
            raise ReadOnlyClientError(f"this client is read-only, yet {where} gives it a secret for team {team!r}; a "
                                      "read-only client holds none: unset it where the client runs, or drop "
                                      "read-only to write")
        if user is None:
            user = env.get("KEEPER_USER") or _login()
        return cls(team=team, user=user, secret=secret or None, read_only=bool(read_only))

    @classmethod
    def from_config(cls, config: Any) -> "Client":
        """The client a service config names (its ``team``, ``user``, ``secret_file``, ``read_only`` keys; the
        environment where they are unset)."""
        return cls.from_env(getattr(config, "team", None), user=getattr(config, "user", None),
                            secret_file=getattr(config, "secret_file", None),
                            read_only=True if getattr(config, "read_only", False) else None)

    def check_presentation(self, what: str) -> None:
        """Refuse a read-only client that presents a secret, whatever it asks (:class:`ReadOnlyClientError`)."""
        if self.read_only and self.secret:
            raise ReadOnlyClientError(f"{what}: this client is read-only yet presents a secret for team {self.team!r}; "
                                      "a read-only client holds none: unset KEEPER_SECRET / KEEPER_SECRET_FILE (and "
                                      "the config's secret_file) where it runs, or drop read-only to write")

    def to_wire(self) -> dict[str, Any]:
        """Plain data for a Ray call (the secret as presented: it travels to the service, never further)."""
        return {"team": self.team, "user": self.user, "secret": self.secret, "read_only": self.read_only,
                "host": self.host, "pid": self.pid}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any] | "Client" | None) -> "Client":
        """The client a request carries; None (a caller from before teams) is the default team without a secret."""
        if isinstance(d, Client):
            return d
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise AccessError(f"a request's client must be a dict (Client.to_wire()), got {type(d).__name__}; "
                              "nothing changed")
        secret = d.get("secret")
        return cls(team=_team_name(d.get("team") or DEFAULT_TEAM, "request"),
                   user=None if d.get("user") is None else str(d["user"]),
                   secret=secret if isinstance(secret, str) and secret else None,
                   read_only=bool(d.get("read_only", False)), host=str(d.get("host") or "?"),
                   pid=int(d.get("pid") or 0))


def _read_secret(path: str | os.PathLike, what: str) -> str:
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{what} {str(path)!r} cannot be read ({exc.strerror or exc}); point it at the file the "
                          "operator gave your team") from None
    if not text:
        raise ConfigError(f"{what} {str(path)!r} is empty; it must hold your team's secret")
    return text


def _login() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


@dataclass(frozen=True)
class Principal:
    """A client as the zoo's rules see it after :meth:`Access.authenticate`: ``verified`` when its secret matched
    its team's (always False in a zoo without teams, where nothing is checked)."""

    team: str
    user: str | None
    operator: bool
    verified: bool
    read_only: bool
    host: str
    pid: int

    def who(self) -> dict[str, Any]:
        """Who did it, for the log and a hold entry (never a secret)."""
        return {"team": self.team, "user": self.user, "host": self.host, "pid": self.pid}


class Access:
    """The team rules over one store (see the module docstring); the team table is re-read at most every
    ``ttl_s`` seconds, so a running service follows ``keeper team`` changes.

    Args:
        store: a :class:`~keeper.store.ModelStore` (anything with ``read_teams()`` and ``uri``).
        clock: seconds for the rate limit (a test's fake clock).
    """

    def __init__(self, store: Any, ttl_s: float = 2.0, clock: Any = time.monotonic):
        self._store = store
        self._ttl_s = float(ttl_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._table: TeamTable | None = None
        self._read_at = -float("inf")
        self._buckets: dict[str, tuple[float, float]] = {}   # team -> (tokens, when)

    # -- the table
    @property
    def table(self) -> TeamTable | None:
        """The team table now (None: a zoo without teams)."""
        now = time.monotonic()
        with self._lock:
            if now - self._read_at < self._ttl_s:
                return self._table
        raw = self._store.read_teams()
        table = None
        if raw is not None:
            try:
                table = TeamTable.from_json(json.loads(raw))
            except ValueError as exc:  # fail closed: a damaged table must not open a shared zoo to every writer
                raise StoreError(f"the team table of the zoo at {self._store.uri} is damaged ({exc}); an operator "
                                 "writes it again with `keeper team add`") from None
        with self._lock:
            self._table, self._read_at = table, now
        return table

    def forget(self) -> None:
        """Read the table again on next use (after this process changed it)."""
        with self._lock:
            self._read_at = -float("inf")

    @property
    def has_teams(self) -> bool:
        return self.table is not None

    # -- who
    def authenticate(self, client: Client | Mapping[str, Any] | None, doing: str, model: str | None = None,
                     owner: str | None = None, *, write: bool = True) -> Principal:
        """The principal ``client`` is, checked for ``doing`` (``"registering"``, ``"removing"``...) model
        ``model`` (owned by ``owner``, when known). ``write=False`` (a read): no secret needed, but one presented
        must match.

        Raises:
            ReadOnlyClientError, UnknownTeamError, SecretMissingError, SecretRejectedError: named in the message,
            with the model, its owner and the fix.
        """
        c = Client.from_wire(client)
        what = _what(doing, model, owner)
        c.check_presentation(what)
        if c.read_only and write:
            raise ReadOnlyClientError(f"{what}: this client is read-only (KEEPER_READ_ONLY, --read-only or read_only "
                                      "in the config) and writes nothing; drop read-only and present your team's "
                                      "secret to write")
        table = self.table
        if table is None:  # a zoo without teams: nothing to check, the declared team is recorded as it is
            return Principal(c.team, c.user, False, False, c.read_only, c.host, c.pid)
        if c.team == OPERATOR:
            expected = table.operator
        elif c.team in table.teams:
            expected = table.teams[c.team].secret
        elif c.team == DEFAULT_TEAM:
            expected = None
        else:
            raise UnknownTeamError(f"{what}: team {c.team!r} is not configured in the zoo at {self._store.uri} (its "
                                   f"teams: {', '.join(sorted(table.teams)) or 'none yet'}); set KEEPER_TEAM (--team, "
                                   f"team= in the config) to yours, or ask the operator to add it: "
                                   f"`keeper team add {c.team}`")
        if c.secret is None:
            if write and c.team == DEFAULT_TEAM and expected is None:
                raise SecretMissingError(
                    f"{what} needs a team: this client names none (KEEPER_TEAM, --team, team= in the config), and in "
                    f"a zoo with teams the default team writes nothing; set your team "
                    f"({', '.join(sorted(table.teams)) or 'none yet'}) and its secret (KEEPER_SECRET or "
                    "KEEPER_SECRET_FILE)")
            if write:
                raise SecretMissingError(
                    f"{what} needs the secret of team {c.team!r}, and none was presented; set KEEPER_SECRET or "
                    f"KEEPER_SECRET_FILE (--secret-file, secret_file in the config) to the secret the operator gave "
                    f"team {c.team!r}")
            return Principal(c.team, c.user, False, False, c.read_only, c.host, c.pid)
        if expected is None or not expected.matches(c.secret):
            raise SecretRejectedError(
                f"{what}: the secret presented for team {c.team!r} does not match the one the operator configured; "
                f"check KEEPER_SECRET / KEEPER_SECRET_FILE, or ask the operator for the current secret of team "
                f"{c.team!r}")
        return Principal(c.team, c.user, c.team == OPERATOR, True, c.read_only, c.host, c.pid)

    # -- the table itself (the operator's)
    def init_table(self, operator_secret: str, client: Client | None = None) -> TeamTable:
        """Turn a zoo without teams into one with teams: a table holding the operator's secret's hash and no team
        yet (``keeper team init``). Its models until now belong to :data:`DEFAULT_TEAM`.

        Raises:
            AccessError: the zoo has a team table already (changing it is the operator's: :meth:`change_table`).
        """
        if self.table is not None:
            raise AccessError(f"the zoo at {self._store.uri} has a team table already; the operator changes it "
                              f"(`keeper team add/rm/policy` with KEEPER_TEAM={OPERATOR} and the operator's secret)")
        table = TeamTable(operator=SecretHash.of(operator_secret))
        self._write(table, Client.from_wire(client), "init")
        return table

    def change_table(self, client: Client | Mapping[str, Any] | None, change: Any, what: str) -> TeamTable:
        """Apply ``change`` (a function of the table to a new table) as the operator; returns the new table.

        Raises:
            AccessError: the zoo has no table (``keeper team init`` first), or ``client`` is not the operator
            (:class:`NotOwnerError`; a wrong secret: :class:`SecretRejectedError`).
        """
        self.forget()
        if self.table is None:
            raise AccessError(f"{what}: the zoo at {self._store.uri} has no team table yet; `keeper team init` makes "
                              "one (with the operator's secret)")
        c = Client.from_wire(client)
        principal = self.authenticate(c, what) if c.team == OPERATOR else None
        if principal is None or not principal.operator:
            raise NotOwnerError(f"{what}: the team table is the operator's, and this client is team "
                                f"{c.team!r}; run it as the operator (KEEPER_TEAM={OPERATOR} or --team "
                                f"{OPERATOR}, with the operator's secret)")
        table = change(self.table)
        self._write(table, Client.from_wire(client), what)
        return table

    def _write(self, table: TeamTable, client: Client, what: str) -> None:
        self._store.write_teams(table.to_bytes())
        self.forget()
        # the log says what changed, never a hash or a secret
        self._store.audit.append("teams", None, owner=None, team=client.team, user=client.user, host=client.host,
                                 pid=client.pid, change=what, teams=sorted(table.teams))

    def recorded_user(self, principal: Principal) -> str | None:
        """The user a new record names: the client's where the zoo has teams; none in a zoo without (its entries
        stay as they were before teams)."""
        return principal.user if self.has_teams else None

    # -- what
    def may_read(self, principal: Principal | None, rec: ModelRecord) -> bool:
        """Whether ``principal`` may see, read and warm from ``rec`` (None: an anonymous reader)."""
        return not rec.private or self._reads_private_of(principal, rec.owner)

    def _reads_private_of(self, principal: Principal | None, owner: str) -> bool:
        if principal is None:
            return False
        if not self.has_teams:  # nothing is checked: the declared team is the team
            return principal.team == owner
        return principal.operator or (principal.verified and principal.team == owner)

    def readable(self, principal: Principal | None, names: Iterable[str], private: Mapping[str, str]) -> set[str]:
        """The names among ``names`` that ``principal`` may read, given the owners of the private ones (name ->
        owning team)."""
        return {n for n in names if n not in private or self._reads_private_of(principal, private[n])}

    def check_read(self, principal: Principal | None, rec: ModelRecord) -> None:
        """Refuse a read of a private model of another team."""
        if not self.may_read(principal, rec):
            team = principal.team if principal is not None else "(anonymous)"
            raise NotOwnerError(f"reading model {rec.name!r}: it is private to team {rec.owner!r}, and this client "
                                f"(team {team!r}{'' if principal is None or principal.verified else ', no secret'}) "
                                f"may not read it; present the secret of team {rec.owner!r}, or ask that team to "
                                "make the model public")

    def check_register(self, principal: Principal, name: str, team: str | None) -> str:
        """The owner a registration by ``principal`` records (``team``, default the principal's own).

        Raises:
            TeamMismatchError: ``team`` is another team's and the principal is no operator (in a zoo with teams).
        """
        owner = principal.team if team is None else _team_name(team, f"registering model {name!r}")
        if owner != principal.team and self.has_teams and not principal.operator:
            raise TeamMismatchError(
                f"registering model {name!r} for team {owner!r}: this client is of team {principal.team!r}, and only "
                f"an operator registers for another team; register it as team {principal.team!r} (leave team "
                f"unset), or have team {owner!r} register it")
        return owner

    def check_change(self, principal: Principal, rec: ModelRecord, action: str) -> None:
        """Refuse ``action`` (``"update"``, ``"alias"``, ``"private"``, ``"remove"``, ``"restore"``,
        ``"record-again"``) on ``rec`` unless ``principal`` is its team or an operator (always allowed in a zoo
        without teams).

        Raises:
            NotOwnerError: naming the model, its owner and who may.
        """
        if not self.has_teams or principal.operator or (principal.verified and principal.team == rec.owner):
            return
        verb = _ACTIONS.get(action, action)
        whose = (f"the default team (registered before the zoo had teams)" if rec.owner == DEFAULT_TEAM
                 else f"team {rec.owner!r}")
        ask = "an operator" if rec.owner == DEFAULT_TEAM else f"team {rec.owner!r}, or an operator"
        raise NotOwnerError(
            f"{verb} model {rec.name!r}: it belongs to {whose}, and team {principal.team!r} may not (only its team "
            f"or an operator may); ask {ask} (KEEPER_TEAM={OPERATOR} with the operator's secret). Nothing changed")

    def check_rate(self, principal: Principal, name: str | None) -> None:
        """Count one registration of ``principal``'s team against its rate (zoos with teams, operators exempt).

        Raises:
            RateLimitedError: the team's burst is spent; the message says when to retry.
        """
        table = self.table
        if table is None or principal.operator:
            return
        now = self._clock()
        with self._lock:
            tokens, then = self._buckets.get(principal.team, (float(table.rate_burst), now))
            tokens = min(float(table.rate_burst), tokens + (now - then) * table.rate_per_s)
            if tokens < 1.0:
                self._buckets[principal.team] = (tokens, now)
                # rounded up: "retry in 0.0 s" would read as "now", which is refused again
                wait = math.ceil(10 * (1.0 - tokens) / table.rate_per_s) / 10 if table.rate_per_s > 0 else math.inf
                raise RateLimitedError(
                    f"registering model {name or '(unnamed)'!r} for team {principal.team!r}: the team sent more than "
                    f"{table.rate_burst} registrations in a burst (then {table.rate_per_s:g} per second); nothing was "
                    f"stored. Retry in {wait:.1f} s, or ask the operator to raise the team table's rate")
            self._buckets[principal.team] = (tokens - 1.0, now)

    def budget(self, team: str, global_bytes: int | None, holding: Iterable[str]) -> int | None:
        """Team ``team``'s byte budget (see the module docstring): in a zoo without teams the global budget, which
        every model shares as before teams. ``holding``: the teams that hold models now."""
        table = self.table
        if table is None:
            return global_bytes
        caps = []
        entry = table.teams.get(team)
        if entry is not None and entry.capacity_bytes is not None:
            caps.append(entry.capacity_bytes)
        if global_bytes is not None:
            members = set(table.teams) | set(holding) | {team}
            shares = {m: table.teams[m].share if m in table.teams else 1.0 for m in members}
            caps.append(int(global_bytes * shares[team] / sum(shares.values())))
        return min(caps) if caps else None

    def retention_s(self, default: float) -> float:
        """How long a held model waits for ``gc``: the table's setting, else the client's ``default``."""
        table = self.table
        return default if table is None or table.retention_s is None else table.retention_s

    def outlier_above_gap(self) -> float | None:
        """How far above the best model of its architecture an accuracy may be; None: no limit (zoos without teams,
        or a table that turns it off)."""
        table = self.table
        return None if table is None else table.outlier_above_gap


def _what(doing: str, model: str | None, owner: str | None) -> str:
    if model is None:
        return doing
    return f"{doing} model {model!r}" + (f" (owner {owner!r})" if owner else "")
