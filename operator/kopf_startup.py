"""Make kopf's start-up with indexes linear in the number of listed objects.

While kopf lists the indexed resources at start-up, every listed object adds a toggle
to one shared ``ToggleSet`` and drops it once indexed, and every object of every
watched resource waits on that set until all are indexed. kopf (1.45) wakes every
waiter on every add and drop, and each woken waiter re-takes the shared lock in turn:
O(objects x waiters) loop iterations. With 1,000 groups (8,000 pods) that is most of
the operator's cold start.

A waiter of the set waits for its aggregate state (all toggles on, or not), so
waking the waiters only when an add or drop changes that state loses no wake-up. A
Toggle made by the set wakes the shared condition itself when it turns on or off,
which this leaves as it is.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("mqbalance.operator")


def patch_toggle_sets() -> bool:
    """Replace ``ToggleSet.make_toggle``/``drop_toggle``/``drop_toggles``; False if kopf's differ."""
    try:
        from kopf._cogs.aiokits import aiotoggles
    except ImportError:
        return False
    cls: Any = aiotoggles.ToggleSet
    if getattr(cls, "_mqbalance_patched", False):
        return True
    probe = cls(all)
    if not all(hasattr(probe, a) for a in ("_condition", "_toggles", "is_on")) or not hasattr(
        aiotoggles, "Toggle"
    ):
        logger.warning("kopf's ToggleSet is not the expected one; start-up stays quadratic in objects")
        return False

    async def make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> Any:
        toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
        async with self._condition:
            before = self.is_on()
            self._toggles.add(toggle)
            if self.is_on() != before:
                self._condition.notify_all()
        return toggle

    async def drop_toggle(self: Any, toggle: Any) -> None:
        async with self._condition:
            before = self.is_on()
            self._toggles.discard(toggle)
            if self.is_on() != before:
                self._condition.notify_all()

    async def drop_toggles(self: Any, toggles: Any) -> None:
        async with self._condition:
            before = self.is_on()
            self._toggles.difference_update(toggles)
            if self.is_on() != before:
                self._condition.notify_all()

    cls.make_toggle = make_toggle
    cls.drop_toggle = drop_toggle
    cls.drop_toggles = drop_toggles
    cls._mqbalance_patched = True
    return True
