"""What the scheduler reports as it works: the hooks behind metrics and probes.

The scheduler calls a :class:`Telemetry` at each decision; the default does
nothing, so a replica without metrics or probes pays one method call per
batch (never per slot: every hook takes the whole batch). :mod:`.metrics`
turns the calls into Prometheus series, :mod:`.health` into liveness and
readiness; :class:`Fanout` hands each call to several. Which of them a process runs
is :mod:`.observers`' business: this module imports none of them, so each
can subclass these hooks without a circle.

Instants are microseconds on the database's clock (the replica's estimate of
it), durations seconds.
"""

from __future__ import annotations

# Annotations only: health.py subclasses Telemetry, and the exec probe imports
# health.py, which must not pay for the store's modules (mypy reads any name
# TYPE_CHECKING as typing's; importing typing would cost the probe ~8 ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..store.base import Claim, SlotKey


class Telemetry:
    """No-op hooks; subclasses override what they record."""

    def loop(self, monotonic: float) -> None:
        """A tick ended (also one that met an outage): the loop is alive."""

    def schema_ready(self) -> None:
        """The schema was checked and the entries registered."""

    def round_trip(self, seconds: float, ok: bool) -> None:
        """One statement to the database took ``seconds``; ``ok`` False: it failed."""

    def outage(self, active: bool) -> None:
        """The database became unreachable (True) or reachable again (False)."""

    def claimed(self, claims: Sequence[Claim]) -> None:
        """Slots this replica won (by its claim or a sweep)."""

    def lost(self, keys: Sequence[SlotKey]) -> None:
        """Slots it proposed that another replica had won."""

    def paused(self, keys: Sequence[SlotKey]) -> None:
        """Slots it proposed that were not sent because their entry is paused."""

    def taken_over(self, claims: Sequence[Claim]) -> None:
        """Slots it took over from another replica (lease ran out)."""

    def skipped(self, entry: str, count: int) -> None:
        """Slots the missed-run policy did not send."""

    def publish_failed(self, claims: Sequence[Claim]) -> None:
        """Slots whose publish failed (released for a replica to send again)."""

    def sent(self, claims: Sequence[Claim], accepted_us: int) -> None:
        """Slots the broker accepted at ``accepted_us`` (dispatch delay:
        ``accepted_us - claim.slot_us``)."""

    def lost_writes(self, count: int) -> None:
        """After a broken connection, ``count`` slots this replica had sent were
        missing from the database (a failover lost them) and were written again."""

    def fleet(self, live_replicas: int, open_claims: int | None) -> None:
        """What the last heartbeat read: replicas that won a slot lately
        (itself included), and claimed-but-unsent rows in the whole store."""

    def close(self) -> None:
        """The scheduler stops: release what the hooks hold (a listener, a file)."""


class Fanout(Telemetry):
    """Hands every call to each of ``parts``, in order."""

    def __init__(self, parts: Sequence[Telemetry]) -> None:
        self.parts = tuple(parts)

    def loop(self, monotonic: float) -> None:
        for part in self.parts:
            part.loop(monotonic)

    def schema_ready(self) -> None:
        for part in self.parts:
            part.schema_ready()

    def round_trip(self, seconds: float, ok: bool) -> None:
        for part in self.parts:
            part.round_trip(seconds, ok)

    def outage(self, active: bool) -> None:
        for part in self.parts:
            part.outage(active)

    def claimed(self, claims: Sequence[Claim]) -> None:
        for part in self.parts:
            part.claimed(claims)

    def lost(self, keys: Sequence[SlotKey]) -> None:
        for part in self.parts:
            part.lost(keys)

    def paused(self, keys: Sequence[SlotKey]) -> None:
        for part in self.parts:
            part.paused(keys)

    def taken_over(self, claims: Sequence[Claim]) -> None:
        for part in self.parts:
            part.taken_over(claims)

    def skipped(self, entry: str, count: int) -> None:
        for part in self.parts:
            part.skipped(entry, count)

    def publish_failed(self, claims: Sequence[Claim]) -> None:
        for part in self.parts:
            part.publish_failed(claims)

    def sent(self, claims: Sequence[Claim], accepted_us: int) -> None:
        for part in self.parts:
            part.sent(claims, accepted_us)

    def lost_writes(self, count: int) -> None:
        for part in self.parts:
            part.lost_writes(count)

    def fleet(self, live_replicas: int, open_claims: int | None) -> None:
        for part in self.parts:
            part.fleet(live_replicas, open_claims)

    def close(self) -> None:
        for part in self.parts:
            part.close()


#: the hooks of a replica without metrics or probes
NOTHING = Telemetry()


class SingletonTelemetry:
    """No-op hooks of SingletonTask in a worker (:class:`.metrics.WorkerMetrics`
    records them); ``task`` is the task's name. Each is one call per execution
    or per renewal, never inside the database's answer."""

    def acquired(self, task: str) -> None:
        """An execution acquired its key and runs."""

    def busy(self, task: str, policy: str) -> None:
        """A call found its key held; ``policy`` is what it does (skip, retry, raise)."""

    def repeat_dropped(self, task: str) -> None:
        """A repeated delivery of a slot that already ran (or runs) was dropped."""

    def renewed(self, task: str, seconds: float) -> None:
        """The heartbeat renewed a running execution's lease in ``seconds``."""

    def renew_failed(self, task: str) -> None:
        """A renewal could not reach the database (retried until the lease ends)."""

    def lease_lost(self, task: str) -> None:
        """A running execution lost its lease."""

    def lost_writes(self, count: int) -> None:
        """After a broken connection, ``count`` run rows this process wrote were
        missing and were written again (singleton/writeback.py)."""


#: the hooks of a worker without metrics
SINGLETON_NOTHING = SingletonTelemetry()
