"""Slots this replica may still hold in the store without working on them.

The store only says that a slot's row changed hands (``fence > 1``), also
when it went back to this replica: a claim it released and wins back at the
next fence, or a claim whose answer was lost. Remembering those here keeps a
slot won back from being logged and counted as a takeover.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..store.base import Claim, SlotKey


class HeldSlots:
    """Key -> (the fence this replica released the slot at, or None when a
    claim's answer was lost; when, on the monotonic clock)."""

    def __init__(self) -> None:
        self._held: dict[SlotKey, tuple[int | None, float]] = {}

    def __bool__(self) -> bool:
        return bool(self._held)

    def answer_lost(self, keys: Iterable[SlotKey], at: float) -> None:
        """A claim of ``keys`` got no answer: it may have been applied."""
        for key in keys:
            self._held[key] = (None, at)

    def released(self, claims: Iterable[Claim], at: float) -> None:
        """``claims`` were handed back (released or left for another replica)."""
        for claim in claims:
            self._held[claim.key] = (claim.fence, at)

    def lost(self, keys: Iterable[SlotKey]) -> None:
        """Another replica won ``keys``: not ours (our retry would have won them)."""
        for key in keys:
            self._held.pop(key, None)

    def forget_before(self, horizon: float) -> None:
        """Forget what another replica has long taken over (or sent) by now."""
        self._held = {k: v for k, v in self._held.items() if v[1] >= horizon}

    def taken_from_another(self, claim: Claim) -> bool:
        """True when another replica held ``claim``'s slot before us (a takeover).

        A claim this replica released is won back at the next fence when nobody
        else held it in between. A claim whose answer was lost has an unknown
        fence: winning it back is taken as ours, which is wrong only if that
        claim never reached the database and another replica held the slot and
        abandoned it meanwhile.
        """
        held = self._held.pop(claim.key, None)
        if claim.fence == 1:
            return False
        if held is None:
            return True
        fence = held[0]
        return fence is not None and claim.fence != fence + 1

    def forget(self, key: SlotKey) -> None:
        self._held.pop(key, None)
