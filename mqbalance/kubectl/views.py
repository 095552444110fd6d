"""What ``kubectl mqbalance`` shows, computed from a group's objects as the API server returns them.

Pure: a ConsumerGroup (its spec and status) and its published document in, plain data and text
out; main.py reads the objects and prints. What-if uses the same core as the operator
(``mqbalance.strategies``, ``mqbalance.quality``), from the assignment published now.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mqbalance.contract import AssignmentDocument, SpecError, read_strategy
from mqbalance.model import UNKNOWN_ZONE, MessageQueue, StrategySpec, Zones, sort_consumers
from mqbalance.quality import measure
from mqbalance.strategies import AllocationError, allocate_group

Row = Sequence[object]


class ViewError(ValueError):
    """What the user asked for cannot be shown; the message says what to fix."""


def table(headers: Sequence[str], rows: Sequence[Row]) -> str:
    """Columns padded as kubectl pads them: upper-case headers, three spaces between columns."""
    cells = [[h.upper() for h in headers]] + [["<none>" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def group_status(group: Mapping[str, Any], document: AssignmentDocument | None) -> dict[str, Any]:
    """A group as ``kubectl mqbalance status`` shows it: its figures and conditions, and per member
    its zone, its queues and its lag (the document published now, the lag loop's last reading)."""
    meta, spec, status = group["metadata"], group.get("spec") or {}, group.get("status") or {}
    lag = status.get("lag") or {}
    behind = {m["member"]: m.get("lag") for m in lag.get("mostBehind") or () if "member" in m}
    members = []
    if document is not None:
        for member in sort_consumers(document.members):
            members.append(
                {
                    "name": member,
                    "zone": document.members[member] or UNKNOWN_ZONE,
                    "queues": held(document, member),
                    "releasing": sum(len(r.queues) for r in document.releasing_of(member)),
                    "lag": behind.get(member),
                }
            )
    view: dict[str, Any] = {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "group": spec.get("consumerGroup") or meta["name"],
        "strategy": (spec.get("strategy") or {}).get("name"),
        "paused": bool(spec.get("paused")),
        "pausedBy": list(status.get("pausedBy") or ()),
        "heldQueues": status.get("heldQueues"),
        "generation": status.get("assignmentGeneration"),
        "members": members,
        "queues": status.get("queues"),
        "crossZoneQueues": status.get("crossZoneQueues"),
        "notServingPods": list(status.get("notServingPods") or ()),
        "lag": {k: lag[k] for k in ("total", "consumeRate", "produceRate", "recommendedMembers") if k in lag},
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message")}
            for c in status.get("conditions") or ()
        ],
    }
    if status.get("handover"):
        view["handover"] = dict(status["handover"])
    return view


def status_text(view: Mapping[str, Any]) -> str:
    lines = [
        f"ConsumerGroup {view['namespace']}/{view['name']} (RocketMQ group {view['group']})",
        f"Strategy:    {view['strategy']}",
        f"Generation:  {view['generation']}",
        f"Queues:      {view['queues']} ({view['crossZoneQueues'] or 0} consumed across zones)",
    ]
    if view["paused"] or view["pausedBy"]:
        by = ", ".join(view["pausedBy"]) or "spec.paused (not reconciled yet)"
        lines.append(f"Paused:      by {by}; {view['heldQueues'] or 0} queues still held")
    lag = view["lag"]
    if lag:
        rates = (
            f", consumed {lag['consumeRate']}/s, produced {lag['produceRate']}/s"
            if "consumeRate" in lag
            else ""
        )
        more = f", {lag['recommendedMembers']} members recommended" if "recommendedMembers" in lag else ""
        lines.append(f"Lag:         {lag.get('total')} messages{rates}{more}")
    handover = view.get("handover")
    if handover:
        waiting = ", ".join(handover.get("waitingFor") or ()) or "nobody"
        releasing = handover.get("releasingQueues", 0)
        lines.append(
            f"Handover:    {handover.get('mode')}: {releasing} queues being released, waiting for {waiting}"
        )
    lines += ["", "Members:"]
    rows = [[m["name"], m["zone"], m["queues"], m["releasing"], m["lag"]] for m in view["members"]]
    lines.append(_indent(table(["member", "zone", "queues", "releasing", "lag"], rows)) if rows else "  none")
    if view["notServingPods"]:
        lines += ["", "Pods not serving:"]
        lines.append(
            _indent(
                table(
                    ["pod", "reason", "message"],
                    [[p.get("name"), p.get("reason"), p.get("message")] for p in view["notServingPods"]],
                )
            )
        )
    lines += ["", "Conditions:"]
    conditions = [[c["type"], c["status"], c["reason"], c["message"]] for c in view["conditions"]]
    lines.append(
        _indent(table(["type", "status", "reason", "message"], conditions)) if conditions else "  none"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class WhatIf:
    """Another strategy or member count for a group: the members it would have, and the figures of
    going from the assignment published now to the one the core computes for them."""

    strategy: StrategySpec
    members: Mapping[str, str]
    """Member -> zone."""
    assignment: Mapping[str, int]
    """Member -> queues it would hold."""
    figures: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy.name.value,
            "members": dict(self.members),
            "queuesPerMember": dict(self.assignment),
            "figures": dict(self.figures),
        }


def what_if(
    group: Mapping[str, Any],
    document: AssignmentDocument,
    strategy: Mapping[str, Any] | None = None,
    members: int | None = None,
) -> WhatIf:
    """The moves ``strategy`` (a ``spec.strategy`` object; default: the group's) or ``members``
    members (default: those published) would cause now.

    Fewer members drop the last in name order; more add ``new-1``, ``new-2``, ... spread over the
    members' zones in turn, as a scale-up of a Deployment spread over zones would."""
    spec = group.get("spec") or {}
    try:
        chosen = read_strategy(
            strategy if strategy is not None else spec.get("strategy") or {},
            document.message_model,
            "--strategy" if strategy is not None else "spec.strategy",
        )
    except SpecError as e:
        raise ViewError(str(e)) from None
    current = {m: document.members[m] for m in sort_consumers(document.members)}
    wanted = dict(current)
    if members is not None:
        if members < 1:
            raise ViewError(f"--members must be at least 1, not {members}")
        names = list(current)[:members]
        wanted = {m: current[m] for m in names}
        zones = sorted(set(current.values())) or [UNKNOWN_ZONE]
        added = 0
        while len(wanted) < members:
            added += 1
            wanted[f"new-{added}"] = zones[(added - 1) % len(zones)]
    queues: dict[str, list[MessageQueue]] = {
        t: sorted({q for qs in a.values() for q in qs}) for t, a in document.topics.items()
    }
    for release in document.releasing:
        for q in release.queues:
            if q.topic in queues and q not in queues[q.topic]:
                queues[q.topic].append(q)
    previous: dict[str, tuple[MessageQueue, ...]] = {}
    for assignment in document.topics.values():
        for member, held in assignment.items():
            previous[member] = previous.get(member, ()) + tuple(held)
    zones_of = Zones(brokers=dict(document.broker_zones), consumers=wanted)
    try:
        topics = allocate_group(
            chosen, queues, wanted, zones=zones_of, previous=previous, message_model=document.message_model
        )
    except AllocationError as e:
        raise ViewError(str(e)) from None
    after: dict[str, tuple[MessageQueue, ...]] = {m: () for m in wanted}
    for assignment in topics.values():
        for member, held in assignment.items():
            after[member] = after.get(member, ()) + tuple(held)
    everything = [q for qs in queues.values() for q in qs]
    figures = measure(
        previous, after, zones=zones_of, queues=everything, message_model=document.message_model
    )
    return WhatIf(chosen, wanted, {m: len(q) for m, q in after.items()}, figures.to_json())


def what_if_text(group: Mapping[str, Any], document: AssignmentDocument, result: WhatIf) -> str:
    f, meta = result.figures, group["metadata"]
    now = {m: held(document, m) for m in document.members}
    rows = [
        [m, result.members.get(m) or document.members.get(m), now.get(m, "-"), result.assignment.get(m, "-")]
        for m in sort_consumers(set(now) | set(result.assignment))
    ]
    return "\n".join(
        [
            f"What if {meta['namespace']}/{meta['name']} used {result.strategy.name.value} with"
            f" {len(result.members)} members (generation {document.generation} now, {document.strategy}):",
            f"  queues moved:      {f['moved']} (fewest possible: {f['minimumMoves']})",
            f"  load per member:   {f['minLoad']} to {f['maxLoad']}",
            f"  cross-zone queues: {f['crossZone']}",
            "",
            _indent(table(["member", "zone", "queues now", "queues then"], rows)),
        ]
    )


def history_rows(group: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The generations the status keeps, newest first."""
    return [dict(entry) for entry in (group.get("status") or {}).get("history") or ()]


def history_text(entries: Sequence[Mapping[str, Any]]) -> str:
    if not entries:
        return "No generations recorded yet."
    keys = ["generation", "time", "reason", "members", "moved"]
    extra = [k for k in ("handoverSeconds", "overriddenQueues") if any(k in e for e in entries)]
    return table(keys + extra, [[e.get(k) for k in keys + extra] for e in entries])


def held(document: AssignmentDocument, member: str) -> int:
    """The queues ``document`` gives ``member``, over every topic."""
    return sum(len(queues) for queues in document.queues_of(member).values())


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def reset_preview_text(name: str, status: Mapping[str, Any]) -> str:
    """An OffsetReset's preview: each queue from its committed offset to its target, and the totals."""
    rows = []
    for q in status.get("queues") or []:
        committed = q.get("committed")
        move = None if committed is None else f"{int(q['target']) - int(committed):+d}"
        rows.append((q["topic"], q["brokerName"], q["queueId"], committed, q["target"], move))
    totals = status.get("totals") or {}
    head = (
        f"OffsetReset {name} (RocketMQ group {status.get('groupName', '?')}): {totals.get('queues', 0)} "
        f"queues, {totals.get('skipped', 0)} messages skipped, {totals.get('replayed', 0)} consumed again"
    )
    return head + "\n" + table(("topic", "broker", "queue", "committed", "target", "move"), rows)


def reset_outcome_text(name: str, status: Mapping[str, Any]) -> str:
    """How an OffsetReset ended (or where it stands): its phase and the Succeeded condition's words."""
    outcome: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Succeeded"), {}
    )
    words = outcome.get("message") or outcome.get("reason") or ""
    return f"OffsetReset {name}: {status.get('phase', 'Pending')}" + (f": {words}" if words else "")
