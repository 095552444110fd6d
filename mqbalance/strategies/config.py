"""CONFIG (AllocateMessageQueueByConfig).

RocketMQ hands each client the list it was configured with, unchecked. Here the group's
map names every consumer's queues. Two deliberate choices, both documented in
docs/strategies.md:

- a configured queue without a topic (the ConsumerGroup resource names queues as
  ``[broker, queueId]``) matches that broker and queue id in every topic allocated;
  one with a topic matches only that queue;
- a configured queue that does not exist among the queues allocated is left out rather
  than rejected: a group consuming several topics, or a topic that shrank, would
  otherwise stop balancing altogether. Quality figures report queues nobody holds;
- in CLUSTERING a queue configured for two consumers is refused (``config_conflicts``),
  by the library, ``mqbalance allocate`` and the operator alike: RocketMQ would let both
  consume it, and every message of it would be consumed twice. In BROADCASTING every
  consumer holds every queue anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mqbalance.model import MessageQueue
from mqbalance.strategies.avg import Shares


def config_conflicts(config: Mapping[str, Sequence[MessageQueue]]) -> list[str]:
    """Queues configured for more than one consumer, each as ``"broker/queueId ('c1', 'c2')"``.

    A configured queue without a topic matches that broker and queue id in every topic, so it
    conflicts with the same position configured for another consumer under any topic.
    """
    by_position: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for consumer, queues in config.items():
        for mq in queues:
            by_position.setdefault((mq.broker_name, mq.queue_id), []).append((mq.topic, consumer))
    conflicts = []
    for (broker, queue_id), entries in sorted(by_position.items()):
        clash = sorted(
            {
                consumer
                for topic, consumer in entries
                for other_topic, other in entries
                if other != consumer and (not topic or not other_topic or topic == other_topic)
            }
        )
        if clash:
            conflicts.append(f"{broker}/{queue_id} ({', '.join(map(repr, clash))})")
    return conflicts


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
