"""The trace of a move as this pod's sidecar sees it.

A generation that gives this pod queues or takes some away is a move here. Its steps are timed
from the moment the sidecar began serving it, on the sidecar's monotonic clock:

- ``read``: the application was first answered with it (``GET /v1/queues``);
- ``applied``, ``committed``: as the application's helper reports them with its release (milliseconds
  from its read to its RocketMQ client applying the generation, and to the last offset of a revoked
  queue committed), placed after the sidecar's ``read``;
- ``released``: the application's release of it arrived (``POST /v1/release``);
- ``recorded``: that release was written where the operator reads it;
- ``pulled``, ``consumed``: as the helper reports them (``POST /v1/trace``): milliseconds from its
  read to its RocketMQ client sending the first pull of a queue the generation gave the pod (its
  rebalance took the queue and read the queue's offset), and to the first message consumed from
  such a queue, placed after the ``read``.

Each step is observed once per move (``mqbalance_sidecar_move_step_seconds``), and each move is
logged as one JSON line (``"kind": "mqbalance.move"``) once its release is recorded (and, if it gave
the pod queues, their first consumption reported), when the next move replaces it, or when the
sidecar stops. The operator's part (from the event to the generation, from a
release to the next generation) is its own metric. Pure: no HTTP, no Kubernetes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from mqbalance.sidecar.grant import Monotonic

KIND = "mqbalance.move"
"""The ``kind`` field of a move's log line."""

STEPS = ("read", "applied", "committed", "released", "recorded", "pulled", "consumed")
"""The steps, in the order a move takes them."""

REPORTED = {"appliedMs": "applied", "committedMs": "committed"}
"""The release body's fields a helper reports its steps in -> the step."""

MAX_REPORTED_MS = 86_400_000
"""A reported step beyond a day is no step of this move (and would distort the histogram)."""

Observe = Callable[[str, float], None]
"""Called with (step, seconds since the move began) once per step and move."""


@dataclass
class Move:
    generation: int
    began: float
    """Monotonic time the sidecar began serving the generation."""
    gained: int
    revoked: int
    propagation: float | None
    """Seconds from the operator computing the generation to the sidecar receiving it (None: unknown)."""
    steps: dict[str, float] = field(default_factory=dict)
    """Step -> seconds after ``began``."""

    def line(self, group: str) -> str:
        """The move as one JSON log line."""
        record: dict[str, object] = {
            "kind": KIND,
            "group": group,
            "generation": self.generation,
            "gained": self.gained,
            "revoked": self.revoked,
        }
        if self.propagation is not None:
            record["propagationMs"] = _ms(self.propagation)
        record.update({f"{step}Ms": _ms(self.steps[step]) for step in STEPS if step in self.steps})
        return json.dumps(record, separators=(",", ":"))


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


class MoveTrace:
    """The current move of one group on this pod, and the steps it has taken."""

    def __init__(
        self, group: str, observe: Observe, log: Callable[[str], None], monotonic: Monotonic
    ) -> None:
        self.group = group
        self._observe = observe
        self._log = log
        self._monotonic = monotonic
        self.current: Move | None = None

    def began(self, generation: int, gained: int, revoked: int, propagation: float | None) -> None:
        """The sidecar serves ``generation`` now; a move if it changes what this pod holds."""
        if not gained and not revoked:
            return
        self._finish()
        self.current = Move(generation, self._monotonic(), gained, revoked, propagation)

    def read(self, generation: int) -> None:
        """The application was answered with ``generation`` (or a later one)."""
        self._step("read", generation)

    def released(self, generation: int, reported: dict[str, float]) -> None:
        """The application's release of ``generation`` arrived, with the steps its helper reported
        (``appliedMs``, ``committedMs``: milliseconds after it read the generation)."""
        move = self.current
        if move is None or generation < move.generation:
            return
        read = move.steps.get("read")
        if read is not None:
            for name, step in REPORTED.items():
                ms = reported.get(name)
                if ms is not None and step not in move.steps:
                    self._set(move, step, read + ms / 1000.0)
        self._step("released", generation)

    def recorded(self, generation: int) -> None:
        """The release of ``generation`` was written for the operator: the move is complete unless the
        first consumption of what it gave is still to come."""
        self._step("recorded", generation)
        move = self.current
        if move is not None and "recorded" in move.steps and (not move.gained or "consumed" in move.steps):
            self._finish()

    def consumed(self, generation: int, ms: float, pulled_ms: float | None = None) -> bool:
        """The helper consumed the first message of a queue ``generation`` gave the pod, ``ms`` after
        it read the generation (its first pull of such a queue ``pulled_ms`` after, if it says);
        whether that counted (the move under way, read and not timed yet)."""
        move = self.current
        if move is None or move.generation != generation or "consumed" in move.steps:
            return False
        read = move.steps.get("read")
        if read is None:
            return False
        if pulled_ms is not None:
            self._set(move, "pulled", read + min(pulled_ms, ms) / 1000.0)
        self._set(move, "consumed", read + ms / 1000.0)
        if "recorded" in move.steps:
            self._finish()
        return True

    def _step(self, step: str, generation: int) -> None:
        move = self.current
        if move is not None and generation >= move.generation and step not in move.steps:
            self._set(move, step, self._monotonic() - move.began)

    def _set(self, move: Move, step: str, seconds: float) -> None:
        move.steps[step] = max(0.0, seconds)
        self._observe(step, move.steps[step])

    def flush(self) -> None:
        """Log the move under way as it stands (the sidecar stops)."""
        self._finish()

    def _finish(self) -> None:
        move, self.current = self.current, None
        if move is not None:
            self._log(move.line(self.group))


def reported_steps(body: dict[str, object], names: Iterable[str] = REPORTED) -> dict[str, float]:
    """The helper's reported steps of a request body (``names``: the fields of :data:`REPORTED` in a
    release), checked: a ValueError names a field that is no number of milliseconds from 0 to a day."""
    steps: dict[str, float] = {}
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not 0 <= value <= MAX_REPORTED_MS
        ):
            raise ValueError(
                f"field {name!r} must be milliseconds from 0 to {MAX_REPORTED_MS}, got {value!r}"
            )
        steps[name] = float(value)
    return steps
