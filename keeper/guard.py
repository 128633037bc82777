"""The zoo's catalog writes under its team rules: each one checked (:class:`keeper.teams.Access`), done by the store
(:class:`~keeper.store.ModelStore`), then recorded in the audit log (:mod:`keeper.store.audit`). Neither graphs
nor weights are read here, so the ``keeper`` command removes, updates, lists held models and collects garbage on a
zoo of any size without loading it; :class:`keeper.Zoo` (and so the service's ZooManager) makes the same writes
through the same guard, adding what needs graphs (registration, eviction).

Invariants: a refused write raises before the store is touched, so nothing changes; a write that happened is
logged (best effort: a failed log write never undoes it); a secret is never stored or logged (only the rules see
what a client presents).

Example:
    >>> guard = Guard(ModelStore("/data/zoo"), Client.from_env(team="vision"))   # doctest: +SKIP
    >>> held = guard.remove("r18"); guard.restore("r18")[0].name                 # doctest: +SKIP
    'r18'
"""

from __future__ import annotations

from typing import Any, Mapping

from keeper.errors import AdmissionError
from keeper.store import ModelRecord, ModelStore
from keeper.store.audit import LogEntry
from keeper.store.holding import Held
from keeper.teams import Access, Client, Principal

__all__ = ["Guard", "check_accuracy"]


def check_accuracy(accuracy: object, name: str) -> float:
    """Accuracy must be a finite number in [0, 1]."""
    import math

    try:
        a = float(accuracy)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AdmissionError(f"model {name!r}: accuracy {accuracy!r} is not a number; pass a float in [0, 1]") from None
    if not math.isfinite(a) or not 0.0 <= a <= 1.0:
        raise AdmissionError(f"model {name!r}: accuracy {accuracy!r} is outside [0, 1]; pass a fraction "
                             "(e.g. 0.93, not 93 or NaN)")
    return a


class Guard:
    """The team rules over one store's catalog writes (see the module docstring).

    Args:
        store: the zoo's store.
        client: who the calls come from unless a call names its own (default: :meth:`Client.from_env`).
    """

    def __init__(self, store: ModelStore, client: Client | None = None):
        self.store = store
        self.client = client if client is not None else Client.from_env()
        self.access = Access(store)

    def principal(self, client: Client | Mapping[str, Any] | None, doing: str, model: str | None = None,
                  owner: str | None = None, *, write: bool = True) -> Principal:
        """Who ``client`` (default: the guard's) is, checked for ``doing`` (:meth:`Access.authenticate`)."""
        return self.access.authenticate(self.client if client is None else client, doing, model, owner,
                                        write=write)

    def log(self, action: str, rec: ModelRecord, principal: Principal, **details: Any) -> None:
        """Record a write that happened (best effort)."""
        self.store.audit.append(action, rec.name, owner=rec.owner, team=principal.team, user=principal.user,
                                host=principal.host, pid=principal.pid, **details)

    def readable(self, names: list[str], client: Client | None = None) -> list[str]:
        """The names among ``names`` that ``client`` may see and warm from: all but other teams' private ones."""
        private = {r.name: r.owner for r in self.store.records() if r.private}
        if not private:
            return names
        reader = self.principal(client, "reading", write=False)
        return sorted(self.access.readable(reader, names, private))

    def record(self, name: str, client: Client | None = None) -> ModelRecord:
        """``name``'s record, unless it is another team's private model (:class:`~keeper.errors.NotOwnerError`)."""
        rec = self.store.record(name)
        if rec.private:
            self.access.check_read(self.principal(client, "reading", name, rec.owner, write=False), rec)
        return rec

    def remove(self, name: str, client: Client | None = None, *, reason: str = "removed",
               by: Principal | None = None) -> tuple[ModelRecord, Held]:
        """Hold ``name`` (its team's or an operator's right; ``reason="evicted"`` with ``by``, the principal whose
        registration evicts it, is the zoo's own act and checks nothing more). Returns ``(its record, the hold)``.

        Raises:
            ModelNotFoundError: no such model. AccessError: refused; nothing changed.
        """
        rec = self.store.record(name)
        if by is None:
            by = self.principal(client, "removing", name, rec.owner)
            self.access.check_change(by, rec, "remove")
        held = self.store.remove(name, reason=reason, by=by.who())
        action = "remove" if reason == "removed" else "evict"
        self.log(action, rec, by, hold=held.hold_id, checksum=rec.checksum)
        return rec, held

    def restore(self, name: str, hold_id: str | None = None, as_name: str | None = None,
                client: Client | None = None) -> tuple[ModelRecord, Principal]:
        """Bring a held model back (its team's or an operator's right): the same record, weights hash and lineage.
        Returns ``(the record, who restored it)``; the caller keeps the team's budget.

        Raises:
            HeldModelNotFoundError: no such hold. RestoreConflictError: the name is live again. AccessError: the
            hold is another team's. Nothing changed then.
        """
        holds = [h for h in self.store.held(name) if hold_id is None or h.hold_id == hold_id]
        principal = self.principal(client, "restoring", name, holds[-1].record.owner if holds else None)
        if holds:
            self.access.check_change(principal, holds[-1].record, "restore")
        rec, held = self.store.restore(name, hold_id, as_name)
        self.log("restore", rec, principal, hold=held.hold_id, checksum=rec.checksum,
                 **({"from": name} if rec.name != name else {}))
        return rec, principal

    def update(self, name: str, *, accuracy: float | None = None, private: bool | None = None,
               client: Client | None = None) -> ModelRecord:
        """Change a model's accuracy or privacy (its team's or an operator's right).

        Raises:
            ModelNotFoundError: no such model. AdmissionError: an accuracy outside [0, 1]. AccessError: refused;
            nothing changed.
        """
        rec = self.store.record(name)
        principal = self.principal(client, "updating", name, rec.owner)
        fields: dict[str, Any] = {}
        if accuracy is not None:
            self.access.check_change(principal, rec, "update")
            fields["accuracy"] = check_accuracy(accuracy, name)
        if private is not None:
            self.access.check_change(principal, rec, "private")
            fields["private"] = bool(private)
        if not fields:
            return rec
        new = self.store.update(name, **fields)
        for key, action in (("accuracy", "update"), ("private", "private")):
            if key in fields:
                self.log(action, new, principal, **{key: fields[key], "before": getattr(rec, key)})
        return new

    def held(self, client: Client | None = None) -> list[Held]:
        """The holds ``client`` may see (not other teams' private models), oldest first."""
        holds = self.store.held()
        if not any(h.record.private for h in holds):
            return holds
        reader = self.principal(client, "reading", write=False)
        return [h for h in holds if self.access.may_read(reader, h.record)]

    def entries(self, *, model: str | None = None, since: float | None = None,
                last: int | None = None) -> list[LogEntry]:
        """The audit log, oldest first."""
        return self.store.audit.entries(model=model, since=since, last=last)

    def gc(self, retention_s: float, min_age_s: float = 3600.0,
           client: Client | None = None) -> tuple[int, list[Held]]:
        """Delete the holds whose retention has ended (the team table's ``retention_s``, else ``retention_s``) and
        what killed writers left. Returns ``(leftover files removed, holds deleted)``.

        Raises:
            AccessError: a read-only client, or in a zoo with teams a client without its team's secret.
        """
        principal = self.principal(client, "collecting garbage in the zoo")
        gone = self.store.expire(self.access.retention_s(retention_s))
        for held in gone:
            self.log("purge", held.record, principal, hold=held.hold_id, held_at=held.held_at, reason=held.reason)
        return self.store.gc(min_age_s=min_age_s), gone
