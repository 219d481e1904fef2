"""Hand messages to the broker in pipelined groups, where the transport allows it.

Kombu 5.7 added ``Producer.batch()``: normal ``publish`` calls (so normal Celery
task messages, built by ``apply_async`` as always) are buffered and sent to the
broker in one pipeline per flush instead of one round trip each. The Redis
transport supports it; other transports (AMQP, ``memory://``) and older kombu
releases publish each message at once, and :class:`PublishGroup` then simply
reports every message as handed over immediately.

The scheduler decides when to flush (every :data:`GROUP_SIZE` messages, and at
the end of a batch), checking its publish deadline before each flush: a message
counts as published only once its flush succeeded. A flush that fails leaves
every message of that group uncertain (the pipeline may have run in part), and
the scheduler treats them as not published.

:func:`skip_declared` takes a cost off every publish that kombu pays for
nothing once a queue is declared (see there).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: messages handed to the broker per pipeline flush. Large enough to amortise the
#: round trip, small enough that the first message of a group is not held back
#: long while the rest are built (about 25 ms at 4,000 messages/s).
GROUP_SIZE = 100

#: kombu's own automatic flush threshold (in broker commands); the scheduler
#: flushes well before it, so that it checks its deadline before every flush.
_KOMBU_MAX = 1_000_000


#: marks a producer :func:`skip_declared` has already set up
_SHORTCUT = "_singlebeat_skips_declared"


def skip_declared(producer: Any) -> Any:
    """Let ``producer`` skip declarations its connection has already made.

    Celery asks kombu to declare the task's queue with every message it
    publishes, and kombu's ``Producer.maybe_declare`` binds a *copy* of the
    queue to the channel before it looks in the connection's cache of declared
    entities, where the answer almost always is "declared already". Profiled
    on a 2,000-slot tick, that copy was about a sixth of the cost of a publish.
    This looks in the same cache first and gives kombu's answer without the
    copy; whatever the cache does not hold (the first message on a connection,
    every message after a reconnect, which empties the cache, entities kombu
    never caches such as auto-delete queues) is declared by kombu as before.
    Returns ``producer``; calling it again changes nothing.
    """
    if getattr(producer, _SHORTCUT, False):
        return producer
    declare = producer.maybe_declare

    def maybe_declare(entity: Any, retry: bool = False, **retry_policy: Any) -> Any:
        if entity and _declared(producer, entity):
            return False
        return declare(entity, retry, **retry_policy)

    # An instance attribute: kombu's publish calls self.maybe_declare, and only
    # this producer (the scheduler's own) is changed.
    producer.maybe_declare = maybe_declare
    setattr(producer, _SHORTCUT, True)
    return producer


def _declared(producer: Any, entity: Any) -> bool:
    """True when kombu's own cache says ``entity`` is declared on this connection."""
    connection = getattr(producer.channel, "connection", None)
    client = getattr(connection, "client", None)
    declared = getattr(client, "declared_entities", None)
    if not declared or not getattr(entity, "can_cache_declaration", False):
        return False
    return hash(entity) in declared


class PublishGroup(Generic[T]):
    """Buffer published messages (each tagged with an item) until :meth:`flush`."""

    def __init__(self, producer: Any, size: int = GROUP_SIZE) -> None:
        self.size = size
        self._context: Any = None
        self._pending: list[T] = []
        batch = getattr(producer, "batch", None)
        if size > 1 and batch is not None and getattr(producer, "supports_batch_publish", False):
            self._context = batch(max_size=_KOMBU_MAX)
            self._context.__enter__()

    @property
    def pipelined(self) -> bool:
        """True when publishes are buffered (else each is sent at once)."""
        return self._context is not None

    def added(self, item: T) -> list[T]:
        """Record that the message for ``item`` was published.

        Returns the items now known to be handed to the broker: ``[item]`` when
        nothing is buffered, else nothing (call :meth:`flush`).
        """
        if self._context is None:
            return [item]
        self._pending.append(item)
        return []

    @property
    def full(self) -> bool:
        return len(self._pending) >= self.size

    def flush(self) -> list[T]:
        """Send what is buffered; returns its items. Raises if the broker failed
        (every pending item is then uncertain: see :meth:`discard`)."""
        if not self._pending:
            return []
        self._context.flush()
        done, self._pending = self._pending, []
        return done

    def discard(self) -> list[T]:
        """Drop what is buffered without sending it; returns its items."""
        dropped, self._pending = self._pending, []
        self._close(abort=True)
        return dropped

    def close(self) -> None:
        """End the group; anything still buffered is discarded, never sent."""
        if self._pending:
            self.discard()
        self._close(abort=False)

    def _close(self, abort: bool) -> None:
        context, self._context = self._context, None
        if context is None:
            return
        if abort:
            try:
                raise _Abort
            except _Abort as exc:
                context.__exit__(type(exc), exc, exc.__traceback__)
        else:
            context.__exit__(None, None, None)


class _Abort(Exception):
    """Exits kombu's batch context the way that discards unflushed messages."""
