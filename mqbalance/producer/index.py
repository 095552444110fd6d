"""The moving index behind round robin, and the Java int arithmetic it relies on."""

from __future__ import annotations

import random

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1
_POSITIVE_MASK = 0x7FFFFFFF


def to_int32(value: int) -> int:
    """``value`` wrapped to a Java ``int`` (two's complement, 32 bits)."""
    return ((value - INT_MIN) & 0xFFFFFFFF) + INT_MIN


def java_abs(value: int) -> int:
    """``Math.abs(int)``: ``Integer.MIN_VALUE`` stays negative, as in Java."""
    return value if value == INT_MIN else abs(value)


def java_rem(dividend: int, divisor: int) -> int:
    """Java's ``%`` on ints: the remainder takes the dividend's sign."""
    remainder = abs(dividend) % abs(divisor)
    return -remainder if dividend < 0 else remainder


class MovingIndex:
    """RocketMQ's ``ThreadLocalIndex`` (4.9.4 and later): the producer's ``sendWhichQueue``.

    A Java ``int`` that every ``increment_and_get`` bumps (wrapping at 2**31) and
    returns with the sign bit masked off, so it is never negative. Java starts it at
    a random value per thread and topic; here the start is given, or drawn from an
    injected ``random.Random``, so a test can pin it.
    """

    __slots__ = ("_value",)

    def __init__(self, start: int = 0) -> None:
        if not INT_MIN <= start <= INT_MAX:
            raise ValueError(f"index start must fit a Java int ({INT_MIN}..{INT_MAX}), got {start}")
        self._value = start

    @staticmethod
    def random_start(rng: random.Random | None = None) -> int:
        """A start as Java draws it (``Math.abs(random.nextInt())`` in 4.x: 0..2**31-1)."""
        return (rng or random).randrange(0, INT_MAX + 1)

    @property
    def value(self) -> int:
        """The raw Java int, possibly negative after wrapping."""
        return self._value

    def set(self, value: int) -> None:
        """Pin the raw Java int (a replay, or a test matching Java's random start)."""
        if not INT_MIN <= value <= INT_MAX:
            raise ValueError(f"index value must fit a Java int ({INT_MIN}..{INT_MAX}), got {value}")
        self._value = value

    def increment_and_get(self) -> int:
        self._value = to_int32(self._value + 1)
        return self._value & _POSITIVE_MASK

    def reset(self, rng: random.Random | None = None) -> None:
        """5.x ``ThreadLocalIndex.reset``: jump to ``Math.abs(random.nextInt(Integer.MAX_VALUE))``."""
        self._value = (rng or random).randrange(0, INT_MAX)
