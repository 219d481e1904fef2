"""Pipelined publishing (kombu's ``Producer.batch``): what counts as sent, and when.

The memory broker publishes at once, so these tests use a producer that
buffers like kombu's Redis pipeline: a message reaches the queue only when its
group is flushed, and a flush can fail as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kombu import Connection, Queue
from kombu.messaging import Producer
from test_scheduler import SECOND, Harness, every, harness_for  # noqa: F401

from celery_singlebeat.engine.publishing import GROUP_SIZE, PublishGroup, skip_declared


class PipelinedProducer(Producer):  # type: ignore[misc]
    """Buffers publishes inside ``batch()``; ``flush`` sends them, or fails."""

    flushes: list[int] = []
    fail_flush = False

    @property
    def supports_batch_publish(self) -> bool:
        return True

    def batch(self, max_size: int = 1000) -> Any:
        producer = self
        buffered: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

        class Context:
            def __enter__(self) -> Context:
                producer._buffer = buffered
                return self

            def __exit__(self, exc_type: Any, *_: Any) -> None:
                producer._buffer = None
                if exc_type is None:
                    self.flush()
                buffered.clear()

            def flush(self) -> None:
                if not buffered:  # like kombu: nothing buffered, no round trip
                    return
                if type(producer).fail_flush:
                    buffered.clear()
                    raise ConnectionError("pipeline broke half-way")
                type(producer).flushes.append(len(buffered))
                for args, kwargs in buffered:
                    Producer.publish(producer, *args, **kwargs)
                buffered.clear()

        return Context()

    _buffer: list[tuple[tuple[Any, ...], dict[str, Any]]] | None = None

    def publish(self, *args: Any, **kwargs: Any) -> None:
        if self._buffer is not None:
            self._buffer.append((args, kwargs))
        else:
            super().publish(*args, **kwargs)


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    PipelinedProducer.flushes = []
    PipelinedProducer.fail_flush = False
    yield


def _due(harness: Harness, replica: Any) -> None:
    replica.tick()
    harness.clock.advance(SECOND)
    replica.tick()


def test_messages_leave_in_groups_and_are_confirmed_after_their_flush(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    n = 2 * GROUP_SIZE + 50
    harness = harness_for({f"job-{i:03d}": every(1) for i in range(n)})
    replica = harness.replica(Producer=PipelinedProducer)
    _due(harness, replica)
    sent = harness.drain()
    assert sorted(m.entry for m in sent) == [f"job-{i:03d}" for i in range(n)]
    assert PipelinedProducer.flushes == [GROUP_SIZE, GROUP_SIZE, 50]
    assert replica.stats["sent"] == n
    assert all(row.state == 1 for row in harness.store.slot_rows())


def test_a_failed_flush_releases_its_group_and_tries_no_more(
    harness_for: Callable[..., Harness],  # noqa: F811
) -> None:
    n = GROUP_SIZE + 10
    harness = harness_for({f"job-{i:03d}": every(1) for i in range(n)})
    PipelinedProducer.fail_flush = True
    broken = harness.replica(Producer=PipelinedProducer)
    _due(harness, broken)
    assert harness.drain() == []
    assert broken.stats["claimed"] == n and broken.stats["sent"] == 0
    rows = harness.store.slot_rows()
    assert len(rows) == n and all(r.state == 0 and r.lease_until_us == 0 for r in rows)
    # released at once: a replica whose broker works takes them over and sends them
    healthy = harness.replica()
    healthy.tick()
    assert len(harness.drain()) == n
    assert all(r.state == 1 for r in harness.store.slot_rows())


def test_a_group_is_never_flushed_after_the_publish_deadline(
    harness_for: Callable[..., Harness],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = harness_for({f"job-{i:03d}": every(1) for i in range(30)}, singlebeat_lease=2)
    replica = harness.replica(Producer=PipelinedProducer)
    replica.tick()
    harness.clock.advance(SECOND)
    # Monotonic time runs normally until the 20th message is buffered, then jumps
    # past the deadline (a stall): the buffered group must be dropped, not sent.
    offset = harness.shift
    original = PipelinedProducer.publish
    count = [0]

    def publish(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        count[0] += 1
        if count[0] == 20:
            offset[0] = 60.0

    monkeypatch.setattr(PipelinedProducer, "publish", publish)
    replica.tick()
    assert harness.drain() == []
    assert PipelinedProducer.flushes == []
    rows = harness.store.slot_rows()
    assert len(rows) == 30 and all(r.state == 0 and r.lease_until_us == 0 for r in rows)


def test_a_producer_without_pipelining_hands_each_message_over_at_once() -> None:
    class Plain:
        pass

    group: PublishGroup[int] = PublishGroup(Plain())
    assert not group.pipelined
    assert group.added(1) == [1] and not group.full and group.flush() == []
    group.close()


def _count_binds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the queues kombu binds a copy of (what a declaration costs)."""
    bound: list[str] = []
    original = Queue.bind

    def bind(self: Queue, channel: Any) -> Any:
        bound.append(self.name)
        return original(self, channel)

    monkeypatch.setattr(Queue, "bind", bind)
    return bound


def test_the_scheduler_declares_the_queue_once_per_connection_not_per_message(
    harness_for: Callable[..., Harness],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 50
    harness = harness_for({f"job-{i:03d}": every(1) for i in range(n)})
    replica = harness.replica()
    replica.tick()
    bound = _count_binds(monkeypatch)
    harness.clock.advance(SECOND)
    replica.tick()
    assert len(harness.drain()) == n
    # the first message declares the queue (or found it declared): no copy per message
    assert len(bound) <= 1
    # A reconnect empties kombu's cache: the next publish declares the queue again.
    replica.producer.connection.declared_entities.clear()
    bound.clear()
    harness.clock.advance(SECOND)
    replica.tick()
    assert len(harness.drain()) == n
    assert bound[:1] == [harness.app.conf.task_default_queue]
    assert len(bound) == 1


def test_skip_declared_leaves_what_kombu_does_not_cache_to_kombu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Connection("memory://") as connection:
        producer = skip_declared(Producer(connection))
        assert skip_declared(producer) is producer  # once is enough
        kept = Queue("sb-kept", routing_key="sb-kept")
        passing = Queue("sb-passing", routing_key="sb-passing", auto_delete=True)
        bound = _count_binds(monkeypatch)
        for _ in range(3):
            producer.publish({}, routing_key="sb-kept", declare=[kept, passing], retry=True)
        # the auto-delete queue is never cached by kombu, so never skipped
        assert bound.count("sb-kept") == 1
        assert bound.count("sb-passing") == 3
        with connection.SimpleQueue(kept) as queue:
            assert len([queue.get(timeout=1) for _ in range(3)]) == 3
