"""A strategy and its parameters on the wire: the one format (a ConsumerGroup's ``spec.strategy``)
and its one reader, used by the operator, the journal and ``mqbalance allocate``.

    {"name": "CONSISTENT_HASH", "virtualNodes": 10}
    {"name": "MACHINE_ROOM_NEARBY", "inner": "AVG"}
    {"name": "MACHINE_ROOM", "consumerIdcs": ["hz"]}
    {"name": "CONFIG", "config": {"pod-a": [{"broker": "broker-a", "queueId": 0}]}}
    {"name": "STICKY", "zoneAffinity": true}
    {"name": "STICKY", "load": {"tolerance": 0.2, "samples": 3, "maxQueueFactor": 2}}

A CONFIG queue carries no topic: it matches that broker and queue id in every topic allocated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mqbalance.contract.errors import SpecError
from mqbalance.model import (
    DEFAULT_VIRTUAL_NODES,
    INNER_STRATEGIES,
    LoadBalance,
    MessageModel,
    MessageQueue,
    StrategyName,
    StrategySpec,
    check_virtual_nodes,
    sort_queues,
)
from mqbalance.strategies.config import config_conflicts


def read_strategy(
    data: Any, model: MessageModel = MessageModel.CLUSTERING, where: str = "spec.strategy"
) -> StrategySpec:
    """``data`` as a StrategySpec; raises SpecError naming the field (``where`` prefixes it)."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where} must be an object with a name and its parameters")
    name = _name(data.get("name") or StrategyName.AVG, f"{where}.name")
    inner = _name(data.get("inner") or StrategyName.AVG, f"{where}.inner")
    if inner not in INNER_STRATEGIES:
        raise SpecError(f"{where}.inner is {inner}; use {', '.join(INNER_STRATEGIES)}")
    try:
        virtual_nodes = check_virtual_nodes(data.get("virtualNodes", DEFAULT_VIRTUAL_NODES))
    except ValueError as e:
        raise SpecError(f"{where}.{e}") from None
    idcs = data.get("consumerIdcs") or []
    if not isinstance(idcs, list) or not all(isinstance(i, str) and i for i in idcs):
        raise SpecError(f"{where}.consumerIdcs must be a list of idc names")
    if name is StrategyName.MACHINE_ROOM and not idcs:
        raise SpecError(
            f"strategy MACHINE_ROOM needs {where}.consumerIdcs: list the idcs (the part before '@' "
            "in broker names) this group consumes"
        )
    config = _read_config(data.get("config") or {}, model, where) if name is StrategyName.CONFIG else {}
    if name is StrategyName.CONFIG and not config:
        raise SpecError(f"strategy CONFIG needs {where}.config: map member pod names to their queues")
    zone_affinity = data.get("zoneAffinity", False)
    if not isinstance(zone_affinity, bool):
        raise SpecError(f"{where}.zoneAffinity must be true or false, got {zone_affinity!r}")
    load = data.get("load")
    if load is not None and name is not StrategyName.STICKY:
        raise SpecError(
            f"{where}.load balances measured traffic and only STICKY takes it; strategy is {name}: "
            f"set {where}.name to STICKY or remove {where}.load"
        )
    return StrategySpec(
        name=name,
        virtual_nodes=virtual_nodes,
        inner=inner,
        consumer_idcs=frozenset(idcs),
        config=config,
        zone_affinity=zone_affinity,
        load=None if load is None else read_load(load, f"{where}.load"),
    )


def read_load(data: Any, where: str = "spec.strategy.load") -> LoadBalance:
    """STICKY's ``load`` setting; ``{}`` is every default. Raises SpecError naming the field."""
    if not isinstance(data, Mapping):
        raise SpecError(
            f"{where} must be an object: {{tolerance, samples, maxQueueFactor}}, or {{}} for defaults"
        )
    defaults = LoadBalance()
    tolerance = data.get("tolerance", defaults.tolerance)
    if not _number(tolerance) or not 0 <= tolerance <= 10:
        raise SpecError(
            f"{where}.tolerance is {tolerance!r}; use a number from 0 to 10 (0.2: the busiest member "
            "may carry 1.2 times the mean member's rate, or the hottest queue's)"
        )
    samples = data.get("samples", defaults.samples)
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= 1000:
        raise SpecError(f"{where}.samples is {samples!r}; use a whole number of lag readings from 1 to 1000")
    factor = data.get("maxQueueFactor", defaults.max_queue_factor)
    if not _number(factor) or not 1 <= factor <= 100:
        raise SpecError(
            f"{where}.maxQueueFactor is {factor!r}; use a number from 1 to 100 (2: no member holds "
            "more than twice an even share of the queues)"
        )
    return LoadBalance(tolerance=float(tolerance), samples=samples, max_queue_factor=float(factor))


def write_load(load: LoadBalance) -> dict[str, Any]:
    return {"tolerance": load.tolerance, "samples": load.samples, "maxQueueFactor": load.max_queue_factor}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def write_strategy(spec: StrategySpec) -> dict[str, Any]:
    """The wire form of ``spec``: its name and the parameters that matter for it."""
    out: dict[str, Any] = {"name": spec.name.value}
    if spec.name is StrategyName.CONSISTENT_HASH or (
        spec.name is StrategyName.MACHINE_ROOM_NEARBY and spec.inner is StrategyName.CONSISTENT_HASH
    ):
        out["virtualNodes"] = spec.virtual_nodes
    if spec.name is StrategyName.MACHINE_ROOM_NEARBY:
        out["inner"] = spec.inner.value
    if spec.name is StrategyName.MACHINE_ROOM:
        out["consumerIdcs"] = sorted(spec.consumer_idcs)
    if spec.name is StrategyName.CONFIG:
        out["config"] = {
            member: [{"broker": mq.broker_name, "queueId": mq.queue_id} for mq in sort_queues(queues)]
            for member, queues in sorted(spec.config.items())
        }
    if spec.name is StrategyName.STICKY:
        out["zoneAffinity"] = spec.zone_affinity
        if spec.load is not None:
            out["load"] = write_load(spec.load)
    return out


def _read_config(data: Any, model: MessageModel, where: str) -> dict[str, tuple[MessageQueue, ...]]:
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}.config must map member pod names to lists of {{broker, queueId}}")
    out: dict[str, tuple[MessageQueue, ...]] = {}
    for member, queues in sorted(data.items()):
        if not isinstance(queues, list):
            raise SpecError(f"{where}.config[{member!r}] must be a list of {{broker, queueId}}")
        parsed = []
        for i, q in enumerate(queues):
            at = f"{where}.config[{member!r}][{i}]"
            if not isinstance(q, Mapping) or not isinstance(q.get("broker"), str) or not q["broker"]:
                raise SpecError(f"{at} needs a broker name, as {{broker: broker-a, queueId: 0}}")
            qid = q.get("queueId")
            if not isinstance(qid, int) or isinstance(qid, bool) or qid < 0:
                raise SpecError(f"{at}.queueId must be an integer of 0 or more")
            parsed.append(MessageQueue("", q["broker"], qid))
        out[str(member)] = tuple(parsed)
    conflicts = config_conflicts(out) if model is MessageModel.CLUSTERING else []
    if conflicts:
        raise SpecError(
            f"{where}.config gives queue {conflicts[0]} to more than one member; in CLUSTERING "
            "every queue has one owner, so keep it under one member"
        )
    return out


def _name(value: Any, where: str) -> StrategyName:
    try:
        return StrategyName(value)
    except ValueError:
        raise SpecError(f"{where} is {value!r}; use one of {', '.join(StrategyName)}") from None
