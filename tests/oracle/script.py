"""The oracle's script language, run on mqbalance's producer model, and random scenarios in it.

A script is a list of commands, one a line; ``tests/oracle/java/Oracle.java`` runs the same
lines on RocketMQ's classes. Every query prints one line, ``END`` prints ``END``:

- ``FAULT`` a new MQFaultStrategy (fault tolerance on); ``ROUTE T b:n:perm ...`` its topic route;
  ``ENABLE 0|1`` sendLatencyFaultEnable; ``INDEX v`` / ``WORST v`` pin sendWhichQueue /
  whichItemWorst; ``RAND v ...`` the draws of the next index resets; ``CLOCK ms`` the time.
- ``UPDATE b latency isolation reachable`` updateFaultItem; ``SELECT last|- [reset]`` ->
  ``broker:queueId``; ``AVAIL b`` / ``REACH b`` -> ``true|false``; ``PICK`` pickOneAtLeast;
  ``REMOVE b``; ``ORDER`` the fault table's keys in iteration order; ``ITEM b`` ->
  ``latency:startTimestamp``; ``QUEUES`` the publish info's queue list; ``IDX`` sendWhichQueue.
- ``MAP`` / ``PUT k`` / ``DEL k`` / ``KEYS`` / ``TABLE``: a bare ConcurrentHashMap<String, ?>(16).
- ``HASH n hex`` SelectMessageQueueByHash over n queues, the key as hex UTF-16 units -> queue id.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from mqbalance.model import PERM_READ, PERM_READ_WRITE, PERM_WRITE, Broker, TopicRoute
from mqbalance.producer import (
    ConcurrentMapOrder,
    FaultTable,
    Generation,
    QueueSelector,
    hash_index,
)

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1
TOPIC = "T"


class ScriptedRandom(random.Random):
    """Index resets draw these values, as the oracle's java.util.Random does."""

    def __init__(self) -> None:
        super().__init__(0)
        self.values: deque[int] = deque()

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        if not self.values:
            raise AssertionError("the script gave no RAND value for an index reset")
        return self.values.popleft()


@dataclass
class Model:
    """One script's state on the Python side."""

    generation: Generation
    now: int = 0
    selector: QueueSelector | None = None
    route: TopicRoute | None = None
    enabled: bool = True
    rng: ScriptedRandom = field(default_factory=ScriptedRandom)
    table: ConcurrentMapOrder | None = None

    def clock(self) -> int:
        return self.now

    def new_selector(self) -> QueueSelector:
        return QueueSelector(
            generation=self.generation, fault_tolerance=True, clock=self.clock, rng=self.rng, index_start=0
        )


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def run_model(lines: Iterable[str], generation: Generation) -> list[str]:
    """What mqbalance answers to a script, in the oracle's output format."""
    model = Model(generation)
    out: list[str] = []
    for line in lines:
        cmd = line.split(" ")
        out.extend(_step(model, cmd))
    return out


def _step(m: Model, cmd: list[str]) -> list[str]:
    op = cmd[0]
    sel = m.selector
    if op == "FAULT":
        m.selector = m.new_selector()
        m.enabled = True
        return []
    if op == "ROUTE":
        brokers = []
        for spec in cmd[2:]:
            name, nums, perm = spec.split(":")
            brokers.append(Broker(name, int(nums), int(nums), perm=int(perm)))
        m.route = TopicRoute(cmd[1], tuple(brokers))
        return []
    if op == "ENABLE":
        m.enabled = cmd[1] == "1"
        return []
    if op == "CLOCK":
        m.now = int(cmd[1])
        return []
    if op == "RAND":
        m.rng.values = deque(int(v) for v in cmd[1:])
        return []
    if op in ("MAP", "PUT", "DEL", "KEYS", "TABLE"):
        return _map_step(m, cmd)
    if op == "HASH":
        key = cmd[2] if len(cmd) > 2 else ""
        units = [int(key[i : i + 4], 16) for i in range(0, len(key), 4)]
        text = b"".join(u.to_bytes(2, "big") for u in units).decode("utf-16-be", "surrogatepass")
        return [str(hash_index(text, int(cmd[1])))]
    if op == "END":
        return ["END"]
    assert sel is not None, f"{op} before FAULT"
    assert m.route is not None, f"{op} before ROUTE"
    faults = sel.faults
    if op == "INDEX":
        sel.index(m.route.topic).set(int(cmd[1]))
        return []
    if op == "WORST":
        faults.which_item_worst.set(int(cmd[1]))
        return []
    if op == "UPDATE":
        if m.enabled:  # Java drops reports while sendLatencyFaultEnable is off
            sel.report(cmd[1], int(cmd[2]), failed=cmd[3] == "1", reachable=cmd[4] == "1")
        return []
    if op == "SELECT":
        last = None if cmd[1] == "-" else cmd[1]
        reset = len(cmd) > 2 and cmd[2] == "1"
        mq = sel.select_queue(m.route, last_broker=last, fault_tolerance=m.enabled, reset_index=reset)
        return [f"{mq.broker_name}:{mq.queue_id}"]
    if op == "AVAIL":
        return [_bool(faults.is_available(cmd[1]))]
    if op == "REACH":
        return [_bool(faults.is_reachable(cmd[1]))]
    if op == "PICK":
        return [str(faults.pick_one_at_least()).replace("None", "null")]
    if op == "REMOVE":
        faults.remove(cmd[1])
        return []
    if op == "ORDER":
        return [",".join(faults.java_order())]
    if op == "ITEM":
        item = faults.item(cmd[1])
        return ["null" if item is None else f"{item.current_latency_ms}:{item.isolated_until_ms}"]
    if op == "QUEUES":
        return [",".join(f"{q.broker_name}:{q.queue_id}" for q in m.route.writable_queues())]
    if op == "IDX":
        return [str(sel.index(m.route.topic).value)]
    raise ValueError(f"unknown command {op}")


def _map_step(m: Model, cmd: list[str]) -> list[str]:
    if cmd[0] == "MAP":
        m.table = ConcurrentMapOrder()
        return []
    assert m.table is not None, "MAP first"
    if cmd[0] == "PUT":
        m.table.add(cmd[1])
    elif cmd[0] == "DEL":
        m.table.discard(cmd[1])
    elif cmd[0] == "KEYS":
        return [",".join(m.table)]
    else:
        return [str(m.table.table_size)]
    return []


# -- scenarios -----------------------------------------------------------------------------

# Broker names: ordinary ones, pairs with equal String.hashCode ("Aa" and "BB" hash alike), and
# names that share a bin of the 32-bin table without sharing a hash.
ORDINARY = [f"broker-{c}" for c in "abcdefgh"] + ["b1", "b2", "idc1@b3", "zz"]
COLLIDING = ["xAaAa", "xAaBB", "xBBAa", "xBBBB"]


def same_hash_names(blocks: int, prefix: str = "k") -> list[str]:
    """2**blocks distinct strings with one String.hashCode: every mix of "Aa" and "BB" blocks."""
    names = [prefix]
    for _ in range(blocks):
        names = [n + part for n in names for part in ("Aa", "BB")]
    return names


def fault_scenario(
    rng: random.Random, table: FaultTable, generation: Generation, *, unreachable: float = 0.3
) -> list[str]:
    """A producer's life: a route, reports around the table's bounds, clock steps onto window ends,
    selections with and without a last broker, and probes of the fault state."""
    pool = rng.sample(ORDINARY, rng.randint(1, 5)) + rng.sample(COLLIDING, rng.randint(0, 2))
    specs = []
    for name in pool:
        perm = rng.choice([PERM_READ_WRITE] * 5 + [PERM_WRITE, PERM_READ])
        specs.append(f"{name}:{rng.randint(0, 4) if rng.random() < 0.1 else rng.randint(1, 4)}:{perm}")
    if not any(s.split(":")[2] != str(PERM_READ) and s.split(":")[1] != "0" for s in specs):
        specs.append("broker-w:2:6")  # at least one writable queue
    names = [s.split(":")[0] for s in specs] + ["gone"]  # "gone": reported, not in the route
    index_start = rng.choice([0, rng.randint(0, INT_MAX), INT_MAX - rng.randint(0, 20)])
    if generation is Generation.V5 and rng.random() < 0.3:
        index_start = rng.randint(INT_MIN, -1)  # 5.x starts at random.nextInt(), either sign
    now = rng.randint(0, 10**13)
    lines = ["FAULT", f"ROUTE {TOPIC} " + " ".join(specs), f"INDEX {index_start}"]
    lines += [
        f"WORST {rng.choice([0, rng.randint(0, INT_MAX), INT_MAX - rng.randint(0, 5)])}",
        f"CLOCK {now}",
    ]
    bounds = sorted(set(table.latency_max_ms) | {0, table.failure_latency_ms})
    ends: list[int] = []
    enabled = True
    draws: list[int] = []
    for _ in range(rng.randint(5, 60)):
        roll = rng.random()
        broker = rng.choice(names)
        if roll < 0.3 and enabled:
            latency = max(0, rng.choice(bounds) + rng.choice([-1, 0, 0, 1, rng.randint(0, 500)]))
            failed = rng.random() < 0.3
            lines.append(f"UPDATE {broker} {latency} {int(failed)} {int(rng.random() >= unreachable)}")
            effective = table.failure_latency_ms if failed else latency
            ends.append(now + table.not_available_duration(effective))
        elif roll < 0.45:
            if ends and rng.random() < 0.7:
                now = max(now, rng.choice(ends) + rng.choice([-1, 0, 0, 1]))
            else:
                now += rng.choice([0, 1, rng.randint(0, 700_000)])
            lines.append(f"CLOCK {now}")
        elif roll < 0.75:
            last = rng.choice(["-", "-", *names])
            reset = int(rng.random() < 0.5)
            if enabled and generation is Generation.V5 and reset:
                draws.append(rng.randint(0, INT_MAX - 1))
            lines.append(f"SELECT {last} {reset}")
        elif roll < 0.8:
            enabled = not enabled if rng.random() < 0.3 else enabled
            lines.append(f"ENABLE {int(enabled)}")
        else:
            probe = rng.choice(["AVAIL", "REACH", "ITEM", "ORDER", "IDX", "PICK", "QUEUES"])
            if probe == "REACH" and generation is Generation.V4:
                probe = "AVAIL"  # 4.x has no reachable flag
            if probe == "PICK" and generation is Generation.V5:
                probe = "ORDER"  # 5.x's pickOneAtLeast shuffles; its selection never calls it
            lines.append(f"{probe} {broker}" if probe in ("AVAIL", "REACH", "ITEM") else probe)
    if draws:
        lines.insert(5, "RAND " + " ".join(map(str, draws)))
    lines.append("END")
    return lines


def pick_scenario(rng: random.Random) -> list[str]:
    """pickOneAtLeast with many ties: brokers with equal latencies and windows, in many orders."""
    names = rng.sample(ORDINARY + COLLIDING + same_hash_names(3, "p"), rng.randint(1, 14))
    now = rng.randint(0, 10**12)
    lines = ["FAULT", f"ROUTE {TOPIC} {names[0]}:2:6", f"WORST {rng.randint(0, INT_MAX)}", f"CLOCK {now}"]
    for name in names:
        latency = rng.choice([10, 10, 600, 600, 1200, 16000])
        lines.append(f"UPDATE {name} {latency} {int(rng.random() < 0.2)} 1")
    lines.append("ORDER")
    for _ in range(rng.randint(1, 6)):
        lines += ["PICK"] * rng.randint(1, 3)
        if rng.random() < 0.3:
            lines.append(f"REMOVE {rng.choice(names)}")
            lines.append("ORDER")
        lines.append(f"CLOCK {now + rng.choice([0, 30_000, 60_000, 600_000, 10**6])}")
    lines.append("END")
    return lines


def map_scenario(rng: random.Random) -> list[str]:
    """A bare ConcurrentHashMap(16): puts and removes through resizes, long bins and tree bins."""
    pools: Sequence[Callable[[], list[str]]] = (
        lambda: [f"broker-{i}" for i in range(rng.randint(1, 120))],
        lambda: same_hash_names(rng.randint(3, 5)),
        lambda: [f"{rng.choice('abc')}{rng.randint(0, 10**6)}" for _ in range(rng.randint(1, 80))],
        lambda: same_hash_names(4, "q") + [f"n{i}" for i in range(rng.randint(0, 60))],
    )
    keys = rng.choice(pools)()
    rng.shuffle(keys)
    lines = ["MAP"]
    live: list[str] = []
    for key in keys:
        lines.append(f"PUT {key}")
        live.append(key)
        if live and rng.random() < 0.1:
            gone = live.pop(rng.randrange(len(live)))
            lines.append(f"DEL {gone}")
        if rng.random() < 0.1:
            lines += ["KEYS", "TABLE"]
    lines += ["KEYS", "TABLE", "END"]
    return lines


def hash_scenario(rng: random.Random) -> list[str]:
    """SelectMessageQueueByHash on keys of every kind, the Integer.MIN_VALUE hash among them."""
    keys = ["polygenelubricants", "", "order-42", "Aa", "BB", "😀", "中文"]
    lines = []
    for _ in range(30):
        if rng.random() < 0.4:
            key = rng.choice(keys)
        else:
            key = "".join(
                chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0xD7FF)])) for _ in range(8)
            )
        units = key.encode("utf-16-be", "surrogatepass").hex()
        lines.append(f"HASH {rng.randint(1, 64)} {units}")
    lines.append("END")
    return lines
