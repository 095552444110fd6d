"""MACHINE_ROOM (AllocateMessageQueueByMachineRoom, as in RocketMQ 4.8.0 and later).

Only queues of brokers named ``<idc>@<broker>`` whose idc the group consumes are shared;
the rest go to nobody. Both the blocks and the remainder queues are taken from the
filtered list. Before 4.8.0 the block loop read the full list (``mqAll.get(i)`` where
``premqAll.get(i)`` was meant, apache/rocketmq#2477), which could hand out a queue of
another idc; the remainder always came from the filtered list.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from mqbalance.model import MessageQueue
from mqbalance.strategies.avg import Shares


def java_split_at(text: str) -> list[str]:
    """Java's ``text.split("@")``: trailing empty strings are dropped ("" stays [""])."""
    if not text:
        return [""]
    parts = text.split("@")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def idc_of(broker_name: str) -> str | None:
    """The idc of a broker name when it has the form the strategy recognises, else None."""
    parts = java_split_at(broker_name)
    return parts[0] if len(parts) == 2 else None


def allocate_machine_room(
    queues: Sequence[MessageQueue], consumers: Sequence[str], consumer_idcs: Set[str]
) -> Shares:
    if not consumers:
        return {}
    eligible = [mq for mq in queues if idc_of(mq.broker_name) in consumer_idcs]
    count = len(consumers)
    mod, rem = divmod(len(eligible), count)
    shares: Shares = {}
    for index, consumer in enumerate(consumers):
        share = eligible[mod * index : mod * index + mod]
        if rem > index:
            share.append(eligible[index + mod * count])
        shares[consumer] = share
    return shares
