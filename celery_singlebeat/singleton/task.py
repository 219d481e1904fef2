"""SingletonTask: at most one execution at a time per key, each slot executed once.

An execution goes through these steps (``docs/singleton.md`` has the why):

1. a message the scheduler sent carries its slot (header ``singlebeat_slot``):
   :meth:`.SingletonStore.begin_run` records the slot's start, or finds it already
   finished/running, in which case this delivery is a repeat and is dropped;
2. the key's lease is acquired (one round trip); a busy key follows the
   task's ``singleton_busy`` policy;
3. the body runs while the heartbeat renews the lease every third of the TTL;
4. the run row is finished (or, for ``self.retry()``, abandoned so the retry
   may start the slot again) and the lease is released, checking the token.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from datetime import timedelta
from functools import partial
from typing import Any, ClassVar, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.signals import worker_init

from .. import signals
from ..exceptions import (
    ConfigurationError,
    ConnectionReplaced,
    SingletonBusy,
    StoreUnavailable,
)
from ..observe import decisions
from ..observe.decisions import run_fields
from ..store.singleton_store import SingletonStore
from ..store.values import Busy, Lease, Run, RunStatus
from ..timeline.clock import US, slot_text, us_to_datetime
from . import context
from .context import Singleton, SlotInfo, slot_of
from .heartbeat import Held, heartbeat
from .keys import (
    KeyOption,
    check_busy_option,
    check_key_option,
    compute_key,
    parse_ttl,
)
from .retrying import REPUBLISH_INTERVAL as REPUBLISH_INTERVAL
from .retrying import retry_through_broker
from .runtime import PRUNE_TURN_US, Runtime, runtime_for
from .writeback import through_reconnect

logger = logging.getLogger("celery_singlebeat.singleton")

#: Retry delay when the database cannot decide who may run (StoreUnavailable).
UNAVAILABLE_RETRY_DELAY = 5.0
#: statements a start tries when each meets a reconnect (ConnectionReplaced):
#: more in a row means the database is flapping, an outage for the task
RECONNECTS = 3


def _is_concrete(cls: type) -> bool:
    """True for a class with a body: a ``@app.task`` class or one defining ``run``."""
    for klass in cls.__mro__:
        if klass is Task:
            return False
        if "run" in vars(klass):
            return True
    return False


def _raw_option(cls: type, name: str) -> Any:
    """A class attribute as written: a function stays a function (not a method)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    return None


class SingletonTask(Task):  # type: ignore[misc]
    """A Celery task of which at most one execution runs at a time per key.

    Options (class attributes, or keyword arguments of ``@app.task``):

    * ``singleton_ttl`` (required): seconds or timedelta, at least 1 s. How
      long the key stays held after its worker died; the heartbeat renews it
      every third of it while the task runs, so a task may run much longer.
    * ``singleton_key``: ``None`` (default: the task name), ``"args"`` (the
      name and the JSON of the arguments) or a function ``(args, kwargs) ->
      str``.
    * ``singleton_busy``: what a call finding the key held does: ``"skip"``
      (default: logged at INFO, state SUCCESS with result ``None``),
      ``"retry"`` (``self.retry`` after ``singleton_retry_delay``; state
      RETRY, and FAILURE with :class:`.SingletonBusy` once ``max_retries`` is
      used up) or ``"raise"`` (state FAILURE with :class:`.SingletonBusy`).
    * ``singleton_retry_delay``: seconds before a busy retry (default: the TTL).
    * ``singleton_broker_patience``: seconds (default 300) for which a retry
      whose message the broker does not take (it is unreachable) is published
      again, every second, before the message is dropped as Celery drops it
      (:meth:`retry`); 0 drops it at the first failure, as a plain task does.

    In the body, ``self.singleton`` is the execution's
    :class:`~celery_singlebeat.singleton.context.Singleton` (key, fencing
    ``token``, ``slot``, ``lost``, ``check()``, ``guard()``).
    """

    singleton_ttl: ClassVar[float | timedelta | None] = None
    singleton_key: ClassVar[KeyOption] = None
    singleton_busy: ClassVar[str] = "skip"
    singleton_retry_delay: ClassVar[float | None] = None
    singleton_broker_patience: ClassVar[float] = 300.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not _is_concrete(cls):
            return  # an intermediate base: its subclasses are checked
        name = str(vars(cls).get("name") or f"{cls.__module__}.{cls.__qualname__}")
        cls._singleton_ttl_us = parse_ttl(name, cls.singleton_ttl) // timedelta(microseconds=1)
        check_key_option(name, _raw_option(cls, "singleton_key"))
        check_busy_option(name, cls.singleton_busy)
        delay = cls.singleton_retry_delay
        if delay is not None and (
            not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0
        ):
            raise ConfigurationError(
                f"{name}: singleton_retry_delay={delay!r}: expected seconds >= 0 or None"
            )
        patience = cls.singleton_broker_patience
        if not isinstance(patience, (int, float)) or isinstance(patience, bool) or patience < 0:
            raise ConfigurationError(
                f"{name}: singleton_broker_patience={patience!r}: expected seconds >= 0"
            )

    _singleton_ttl_us: ClassVar[int] = 0

    # -- the caller's side --------------------------------------------------

    def singleton_key_for(self, args: Any = None, kwargs: Any = None) -> str:
        """The key a call with these arguments holds (SingletonKeyError if none)."""
        return compute_key(self.name, _raw_option(type(self), "singleton_key"), args, kwargs)

    def apply_async(self, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        # A key function that cannot make a key fails here, in the caller,
        # rather than later in a worker's log.
        self.singleton_key_for(args, kwargs)
        return super().apply_async(args, kwargs, *rest, **options)

    # -- the worker's side --------------------------------------------------

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: Any = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Any:
        """Celery's ``retry``, except when the broker does not take the retry.

        A retry is a new message. When publishing it fails (the broker is
        unreachable), Celery raises ``Reject(requeue=False)``: the message in
        hand is dropped and, acknowledged when the worker took it (Celery's
        default), has no copy left at the broker, so the call never runs. For
        a SingletonTask that is never a duplicate: a busy key's retry (the
        slot's run row was abandoned for it), a start the database could not
        decide, or the body's own ``self.retry()``. So the retry is published
        again every ``REPUBLISH_INTERVAL`` (1 s) for ``singleton_broker_patience``
        seconds, its countdown shortened by the wait, and only then dropped as
        Celery drops it (logged at ERROR). The pool slot waits meanwhile (a
        body's lease stays held and renewed); with the broker away the worker
        receives no new messages anyway (docs/guarantees.md, "Broker
        unreachable")."""
        publish = super().retry
        return retry_through_broker(
            self,
            lambda left: publish(args, kwargs, exc, throw, eta, left, max_retries, **options),
            countdown,
        )

    @property
    def singleton(self) -> Singleton:
        """The running execution's lease (only inside the task body)."""
        current = context.current(self.name)
        if current is None:
            raise RuntimeError(
                f"{self.name}: self.singleton exists only while the task runs in a worker "
                "(or through apply()); a direct call holds no lease"
            )
        return current

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            # task(...) is a plain function call: no message, no lease
            return super().__call__(*args, **kwargs)
        key = self.singleton_key_for(args, kwargs)
        slot = slot_of(request)
        runtime = runtime_for(self.app)
        ttl_us = self._singleton_ttl_us
        task_id = str(request.id)
        run = Run(slot.entry, slot.slot_us, uuid.uuid4().hex) if slot else None
        started = time.monotonic()
        try:
            store = runtime.store()
            got = self._start(store, run, slot, key, runtime, task_id, ttl_us)
        except StoreUnavailable as exc:
            # Nobody can prove the key is free: run nothing, try later. The
            # retry waits past the TTL when a run row may be left behind.
            delay = UNAVAILABLE_RETRY_DELAY if run is None else ttl_us / US + 1
            logger.warning(
                "singlebeat: %s[%s]: cannot reach the singleton database (%s); retrying in %gs",
                self.name,
                task_id,
                exc,
                delay,
            )
            raise self.retry(countdown=delay, exc=exc) from exc
        if isinstance(got, Busy):
            runtime.telemetry.busy(self.name, self.singleton_busy)
            return self._busy(store, run, slot, key, got, task_id, runtime.owner)
        runtime.telemetry.acquired(self.name)
        if slot is not None and logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "singlebeat: %s[%s]: slot %s@%s started (singleton key %r, token %d)",
                self.name,
                task_id,
                slot.entry,
                slot_text(slot.slot_us),
                key,
                got.token,
                extra=run_fields(
                    decisions.RUN_STARTED, runtime.owner, task_id, key, slot, got.token
                ),
            )

        singleton = Singleton(store, self.name, key, got.token, task_id, slot)
        held = Held(
            singleton,
            store,
            got,
            run,
            ttl_us,
            started + ttl_us / US,
            sender=self,
            owner=runtime.owner,
            telemetry=runtime.telemetry,
            before=None if runtime.writeback is None else partial(runtime.writeback.check, store),
        )
        beat = heartbeat()
        beat.hold(held)
        context.push(singleton)
        outcome = "failure"
        try:
            result = super().__call__(*args, **kwargs)
            outcome = "success"
            return result
        except (Retry, Reject):
            outcome = "retry"
            raise
        except Ignore:
            outcome = "ignored"
            raise
        finally:
            context.pop()
            beat.drop(held)
            self._finish(store, held, outcome)
            self._maybe_prune(runtime, store)

    def _start(
        self,
        store: SingletonStore,
        run: Run | None,
        slot: SlotInfo | None,
        key: str,
        runtime: Runtime,
        task_id: str,
        ttl_us: int,
    ) -> Lease | Busy:
        """The key's lease (or its holder); for a slot, the run row first: a
        repeat is dropped here (Ignore) and takes no lease."""
        owner = runtime.owner
        writeback = runtime.writeback
        for attempt in range(1, RECONNECTS + 1):
            try:
                if writeback is not None:
                    # after a broken connection: this process's run rows first,
                    # then (an old slot) the other processes' (writeback.py)
                    writeback.check(store)
                    if run is not None:
                        writeback.hold(run.slot_us)
                if run is None:
                    return store.acquire_lease(key, owner, ttl_us)
                begin, got = store.begin_slot(run, key, owner, task_id, ttl_us)
            except ConnectionReplaced:
                # not sent: the store reconnected, maybe to a promoted standby
                if attempt == RECONNECTS:
                    raise
                continue
            except StoreUnavailable:
                if run is not None:
                    # The run row may have been started: let it go now, or it
                    # expires after the TTL, and the retry waits that long.
                    with contextlib.suppress(StoreUnavailable):
                        store.abandon_run(run, ran=False)
                raise
            break
        assert run is not None
        if begin.status is not RunStatus.STARTED:
            runtime.telemetry.repeat_dropped(self.name)
            self._drop_repeat(slot, begin.status, begin.owner, task_id, key, owner)
        if writeback is not None:
            writeback.journal.started(
                run, owner, task_id, store.clock.now_us(), ttl_us, time.monotonic()
            )
            runtime.wrote_runs(store)
        assert got is not None
        return got

    def _drop_repeat(
        self,
        slot: SlotInfo | None,
        status: RunStatus,
        holder: str,
        task_id: str,
        key: str,
        owner: str,
    ) -> NoReturn:
        assert slot is not None
        logger.info(
            "singlebeat: %s[%s]: slot %s@%s already %s (by %s): dropping this repeated delivery",
            self.name,
            task_id,
            slot.entry,
            slot.at.isoformat(),
            status.value,
            holder,
            extra=run_fields(decisions.REPEAT_DROPPED, owner, task_id, key, slot),
        )
        if signals.singleton_duplicate.receivers:
            signals.singleton_duplicate.send(
                sender=self, entry=slot.entry, slot=slot.at, task_id=task_id, status=status.value
            )
        # Ignore: no result is stored, so the result of the execution that
        # ran (same task id) is not overwritten.
        raise Ignore()

    def _busy(
        self,
        store: SingletonStore,
        run: Run | None,
        slot: SlotInfo | None,
        key: str,
        busy: Busy,
        task_id: str,
        owner: str,
    ) -> Any:
        until = us_to_datetime(busy.expires_us).isoformat() if busy.expires_us else "?"
        policy = self.singleton_busy
        if run is not None:
            outcome = "skipped" if policy == "skip" else "busy"

            writeback = runtime_for(self.app).writeback

            def record() -> None:
                # a retry may start the slot again; skip and raise end it
                if policy == "retry":
                    store.abandon_run(run, ran=False)
                    if writeback is not None:
                        writeback.journal.forget(run)
                elif store.finish_run(run, outcome) and writeback is not None:
                    writeback.journal.finished(run, outcome, store.clock.now_us(), time.monotonic())

            try:
                through_reconnect(record)
            except StoreUnavailable:
                heartbeat().defer(f"recording slot {run.entry}@{run.slot_us} as not run", record)
        if policy == "skip":
            logger.info(
                "singlebeat: %s[%s]: singleton key %r is held by %s until %s: skipped",
                self.name,
                task_id,
                key,
                busy.owner,
                until,
                extra=run_fields(decisions.BUSY_SKIPPED, owner, task_id, key, slot),
            )
            if signals.singleton_skipped.receivers:
                signals.singleton_skipped.send(
                    sender=self, key=key, holder=busy.owner, task_id=task_id
                )
            return None
        error = SingletonBusy(key, busy.owner, until)
        delay = self.singleton_retry_delay
        countdown = self._singleton_ttl_us / US if delay is None else delay
        logger.info(
            "singlebeat: %s[%s]: singleton key %r is held by %s until %s: %s",
            self.name,
            task_id,
            key,
            busy.owner,
            until,
            f"retrying in {countdown:g}s" if policy == "retry" else "raising SingletonBusy",
            extra=run_fields(
                decisions.BUSY_RETRY if policy == "retry" else decisions.BUSY_RAISED,
                owner,
                task_id,
                key,
                slot,
            ),
        )
        if policy == "retry":
            raise self.retry(countdown=countdown, exc=error)
        raise error

    def _finish(self, store: SingletonStore, held: Held, outcome: str) -> None:
        """Finish the run row (abandon it for a retry) and release the key;
        retried in the background while the database is unreachable."""
        run, lease, task_id = held.run, held.lease, held.singleton.task_id
        writeback = runtime_for(self.app).writeback

        def end() -> None:
            if run is None:
                through_reconnect(lambda: store.release_lease(lease))
                return
            final = None if outcome == "retry" else outcome

            def end_slot() -> tuple[bool, bool]:
                # the rows written back first: a finish must find its run row
                if writeback is not None:
                    writeback.check(store)
                return store.end_slot(run, final, lease)

            done, _released = through_reconnect(end_slot)
            if writeback is not None:
                if final is None:
                    writeback.journal.forget(run)
                elif done:
                    writeback.journal.finished(run, final, store.clock.now_us(), time.monotonic())
            if not done:
                logger.warning(
                    "singlebeat: the run row of slot %s@%s was taken by another start "
                    "before task %s finished",
                    run.entry,
                    run.slot_us,
                    task_id,
                    extra=run_fields(
                        decisions.RUN_TAKEN,
                        held.owner,
                        task_id,
                        lease.key,
                        (run.entry, run.slot_us),
                        lease.token,
                    ),
                )

        try:
            end()
        except StoreUnavailable as exc:
            logger.warning(
                "singlebeat: recording the end of task %s failed (%s); retrying in the background",
                task_id,
                exc,
            )
            heartbeat().defer(f"recording the end of task {task_id}", end)

    def _maybe_prune(self, runtime: Runtime, store: SingletonStore) -> None:
        if runtime.prune_due():
            retention = runtime.settings.run_retention
            heartbeat().defer("pruning old singleton rows", lambda: _prune(store, retention))


def _prune(store: SingletonStore, retention: timedelta) -> None:
    """Offer to prune (the fleet-wide turn decides whether this process does).

    Logged when rows went, as the scheduler logs its own prune: without a line,
    an operator could not tell that the retention acts, or when a slot became
    new again to a late repeat of it."""
    deleted = store.prune_singletons(retention // timedelta(microseconds=1), PRUNE_TURN_US)
    if deleted:
        logger.info(
            "singlebeat: pruned %d SingletonTask run and key rows older than %s",
            deleted,
            retention,
        )


def _check_settings_at_start(sender: Any = None, **_: Any) -> None:
    """Fail a worker's start, naming the setting, when its app has SingletonTasks
    and the singlebeat settings are wrong (rather than failing every task).

    Celery's signal dispatch catches and logs a receiver's exceptions (and
    worker_init comes before the worker sets up logging, so not even that
    shows): the worker would start as if nothing were wrong. SystemExit is no
    Exception, so it ends the start, and its message is printed on stderr."""
    app = getattr(sender, "app", None)
    if app is None or not any(isinstance(t, SingletonTask) for t in app.tasks.values()):
        return
    try:
        runtime_for(app)
    except ConfigurationError as exc:
        raise SystemExit(f"celery_singlebeat: cannot start the worker: {exc}") from exc


worker_init.connect(_check_settings_at_start, weak=False)
