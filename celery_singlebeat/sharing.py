"""Sharing the entries out among live replicas: who proposes a slot first.

Every replica still proposes every slot, and the database still decides each
one by its unique key: sharing only changes *when* a replica proposes. Each
entry has one *first* replica among the replicas seen alive (those that won a
slot lately, :meth:`~celery_singlebeat.store.base.Store.recent_owners`), the
same on every replica that sees the same set (:func:`first_replicas`): it
proposes the entry's slots as soon as they are due. Every other replica
proposes them :data:`FALLBACK_DELAY_US` later, and so sends them only if the
first replica did not claim them by then (it died, stalled, fell behind, or does
not know it is first yet).

Without it, the replica that wakes first claims every due slot in one statement
and the others win nothing: one replica does all the publishing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from .clock import US

#: how long after a slot the replicas that are not its entry's first replica
#: propose it. Longer than the first replica needs to claim it when it keeps up
#: (wake-up jitter and one round trip: a few ms), short enough that the slots of
#: a replica that just died leave little later than usual.
FALLBACK_DELAY_US = 250_000

#: about this many slots at most claimed in one tick (an entry's slots are not
#: split): of the entries a replica proposes first, and of the others' (after
#: the fallback delay). A replica that is
#: free takes the others' leftovers in small bites, so the work stays shared
#: when the replicas cannot keep up, instead of going to whoever asked first.
FIRST_BATCH = 2500
FALLBACK_BATCH = 500

#: a replica counts as live while it holds a slot row this recent.
LIVE_WINDOW_US = 10 * US

#: seconds after its last read that a replica reads the live replicas again when
#: another replica claimed slots it proposes first (otherwise: with each sweep).
SHARE_RECHECK = 1.0


def entry_hash(name: str) -> int:
    """A hash of the entry name that every process computes alike."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def live_replicas(recent: Sequence[str], me: str) -> tuple[str, ...]:
    """The replicas to share among: those seen lately, and this one, sorted."""
    return tuple(sorted({*recent, me}))


def first_replicas(names: Iterable[str], live: Sequence[str]) -> dict[str, str]:
    """Each entry's first replica: the entries ordered by :func:`entry_hash`, then
    dealt out in turn over the sorted ``live`` replicas, so that the shares differ
    by one entry at most (5 entries over 3 replicas: 2, 2 and 1).

    Replicas with the same entries and the same live set agree; with different
    schedules (a rolling deploy) they may not, and then race for some slots as
    they would without sharing.
    """
    return deal(order_entries(names), live)


def order_entries(names: Iterable[str]) -> list[str]:
    """The entries in the order they are dealt out (by hash, then name)."""
    return sorted(names, key=lambda name: (entry_hash(name), name))


def deal(ordered: Sequence[str], live: Sequence[str]) -> dict[str, str]:
    """:func:`first_replicas` for entries already in :func:`order_entries` order."""
    if not live:
        return {}
    return {name: live[i % len(live)] for i, name in enumerate(ordered)}
