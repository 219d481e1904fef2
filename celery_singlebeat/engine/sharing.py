"""Sharing the entries out among live replicas: who proposes a slot first.

Every replica still proposes every slot, and the database still decides each
one by its unique key: sharing only changes *when* a replica proposes. Each
entry has one *first* replica among the live replicas (the replica rows the
heartbeat reads, :func:`celery_singlebeat.timeline.membership.replica_live`), the same
on every replica that sees the same set (:func:`first_replicas`): it proposes
the entry's slots as soon as they are due. Every other replica proposes them
:data:`FALLBACK_DELAY_US` later, and so sends them only if the first replica
did not claim them by then (it died, stalled, fell behind, or does not know it
is first yet).

Without it, the replica that wakes first claims every due slot in one statement
and the others win nothing: one replica does all the publishing.

Who is first is decided by rendezvous (highest random weight) hashing over a
fixed set of :data:`BUCKETS`: an entry falls in the bucket its name hashes to,
every replica has a pseudo-random weight for every bucket, and the live replica
of greatest weight is first for the bucket's entries. The choice depends on the
entry's name and the live set alone, so an entry added or removed moves no
other entry, a replica that joins takes only the buckets it now outweighs
(about 1/k of them) and one that leaves hands over only its own, each to the
replica that weighed most after it. The positional deal it replaces (entries in
hash order, dealt round robin) balanced to one entry but moved most entries on
any change; with entries that come and go while beat runs, and replicas that
roll, staying put is worth a binomial spread (docs/performance.md measures both).
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence

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

#: seconds after its last read that a replica reads the live replicas again when
#: another replica claimed slots it proposes first (otherwise: with each sweep).
SHARE_RECHECK = 1.0

#: the buckets the entries fall in. Weighing buckets rather than entries makes a
#: deal cost k passes over the buckets plus one over the entries, whatever the
#: entries (a weight per entry and replica, computed in Python, cost 0.6 s at
#: 100,000 entries and 10 replicas). Fixed, since changing it moves every entry;
#: large enough that entries rarely share one below some thousands (1,000 entries:
#: about 8 pairs do), and that at 100,000 entries the shares still come within
#: ~3% of 1/k (each replica holds ~65,536/k buckets, binomially).
BUCKETS = 1 << 16

_WORD = 8  # bytes of one weight


def entry_hash(name: str) -> int:
    """A 64-bit hash of a name that every process computes alike (blake2b:
    Python's ``hash()`` of a string differs from process to process)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def bucket_of(name: str) -> int:
    """The bucket an entry falls in (its :func:`entry_hash` modulo :data:`BUCKETS`)."""
    return entry_hash(name) % BUCKETS


def weights(replica: str, tag: int = 0, tag_bytes: int = 0) -> array[int]:
    """The replica's weight for every bucket, in bucket order: SHAKE-128 of its
    id read as unsigned 64-bit big-endian words. One C call per replica (0.5 MB
    of output), independent of every other replica's, the same on every host.

    With ``tag_bytes``, the low bytes of each weight are replaced by ``tag``
    (see :func:`bucket_owners`), still in C: a slice assignment per byte."""
    stream = bytearray(hashlib.shake_128(replica.encode()).digest(BUCKETS * _WORD))
    for i in range(tag_bytes):
        stream[_WORD - 1 - i :: _WORD] = bytes(((tag >> (8 * i)) & 0xFF,)) * BUCKETS
    words = array("Q", stream)
    if sys.byteorder == "little":
        words.byteswap()  # the words as big-endian numbers on every machine
    return words


def live_replicas(live: Iterable[str], me: str) -> tuple[str, ...]:
    """The replicas to share among: the live ones, and this one, sorted.

    This replica always counts itself: it is live as long as it runs, even
    before its first heartbeat row is written or read back."""
    return tuple(sorted({*live, me}))


def entry_buckets(names: Iterable[str]) -> dict[str, int]:
    """Each entry's bucket: hashed once per entry, then dealt many times."""
    return {name: bucket_of(name) for name in names}


def first_replicas(names: Iterable[str], live: Sequence[str]) -> dict[str, str]:
    """Each entry's first replica among ``live``: of the replicas, the one of
    greatest weight for the entry's bucket.

    Replicas with the same live set agree, whatever entries each has; with
    different live sets (a replica has just started or stopped, and not all
    have read its row yet) they disagree only about the entries that replica
    gains or loses, and race for those as they would without sharing.
    """
    return deal(entry_buckets(names), live)


def deal(buckets: Mapping[str, int], live: Sequence[str]) -> dict[str, str]:
    """:func:`first_replicas` for entries whose buckets are known
    (:func:`entry_buckets`)."""
    owners = bucket_owners(live)
    if not owners:
        return {}
    return dict(zip(buckets, map(owners.__getitem__, buckets.values())))


def bucket_owners(live: Sequence[str]) -> list[str]:
    """Each bucket's first replica among ``live`` (empty when none is): what a
    change of the live set costs, whatever the number of entries.

    Each weight's low bytes are replaced by the replica's index in ``live``
    (:func:`weights`), so that the greatest tagged weight of a bucket names its
    replica and one ``map(max, ...)`` over all the replicas' weights finds it in
    C. Two weights equal in all their other bits (once in 2**50 buckets or so at
    10 replicas) go to the replica sorted last: such a tie alone may move when
    the live set changes.
    """
    if len(live) <= 1:
        return list(live) * BUCKETS
    tag_bytes = (len(live).bit_length() + 7) // 8
    columns = [weights(replica, index, tag_bytes) for index, replica in enumerate(live)]
    low = (1 << (8 * tag_bytes)) - 1
    # all in C: the tag of each bucket's greatest weight, then its replica
    return list(map(live.__getitem__, map(low.__and__, map(max, *columns))))
