"""CONFIG (AllocateMessageQueueByConfig).

RocketMQ hands each client the list it was configured with, unchecked. Here the group's
map names every consumer's queues. Two deliberate choices, both documented in
docs/strategies.md:

- a configured queue without a topic (the ConsumerGroup resource names queues as
  ``[broker, queueId]``) matches that broker and queue id in every topic allocated;
  one with a topic matches only that queue;
- a configured queue that does not exist among the queues allocated is left out rather
  than rejected: a group consuming several topics, or a topic that shrank, would
  otherwise stop balancing altogether. Quality figures report queues nobody holds.

A queue configured for two consumers goes to both, as it would in RocketMQ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mqbalance.model import MessageQueue
from mqbalance.strategies.avg import Shares


def allocate_config(
    queues: Sequence[MessageQueue],
    consumers: Sequence[str],
    config: Mapping[str, Sequence[MessageQueue]],
) -> Shares:
    present = set(queues)
    by_position: dict[tuple[str, int], list[MessageQueue]] = {}
    for mq in queues:
        by_position.setdefault((mq.broker_name, mq.queue_id), []).append(mq)
    shares: Shares = {}
    for consumer in consumers:
        chosen: set[MessageQueue] = set()
        for wanted in config.get(consumer, ()):
            if wanted.topic:
                if wanted in present:
                    chosen.add(wanted)
            else:
                chosen.update(by_position.get((wanted.broker_name, wanted.queue_id), ()))
        shares[consumer] = list(chosen)
    return shares
