"""A small exact min-cost flow solver (primal-dual: Dijkstra on reduced costs, then a
blocking flow over the zero-reduced-cost arcs, so one shortest-path search serves many
augmenting paths). STICKY's zone-affine placement is a transportation problem over a few
hundred nodes, well within reach of pure Python.
"""

from __future__ import annotations

import heapq

_INF = float("inf")


class MinCostFlow:
    """Integer capacities and non-negative integer costs; arcs are numbered as added."""

    def __init__(self, nodes: int) -> None:
        self._adj: list[list[int]] = [[] for _ in range(nodes)]
        self._to: list[int] = []
        self._cap: list[int] = []
        self._cost: list[int] = []
        self._initial: list[int] = []

    def add_arc(self, tail: int, head: int, capacity: int, cost: int) -> int:
        """Add an arc and return its number (use it with :meth:`flow_on`)."""
        if cost < 0:
            raise ValueError("costs must be non-negative")
        arc = len(self._to)
        self._to += (head, tail)
        self._cap += (capacity, 0)
        self._cost += (cost, -cost)
        self._initial += (capacity, 0)
        self._adj[tail].append(arc)
        self._adj[head].append(arc + 1)
        return arc

    def push(self, path: list[int], amount: int) -> None:
        """Send flow along a path of cost-0 arcs before solving (a warm start).

        Any flow on cost-0 arcs is a cheapest flow of its value: its residual graph has
        no negative arc, so no negative cycle, and zero potentials stay valid.
        """
        if any(self._cost[arc] for arc in path):
            raise ValueError("a warm start may only use cost-0 arcs")
        if amount > min(self._cap[arc] for arc in path):
            raise ValueError("a warm start may not exceed an arc's capacity")
        for arc in path:
            self._cap[arc] -= amount
            self._cap[arc ^ 1] += amount

    def residual(self, arc: int) -> int:
        return self._cap[arc]

    def flow_on(self, arc: int) -> int:
        return self._initial[arc] - self._cap[arc]

    def solve(self, source: int, sink: int) -> tuple[int, int]:
        """Send as much flow as possible at the least cost; returns (flow, cost)."""
        nodes = len(self._adj)
        potential = [0] * nodes
        total_flow = sum(self.flow_on(arc) for arc in self._adj[source] if arc % 2 == 0)
        while True:
            dist = self._shortest(source, potential)
            if dist[sink] == _INF:
                break
            reach = dist[sink]
            for v in range(nodes):
                potential[v] += int(min(dist[v], reach))
            while True:
                level = self._levels(source, sink, potential)
                if level[sink] < 0:
                    break
                cursor = [0] * nodes
                while True:
                    pushed = self._augment(source, sink, level, cursor, potential)
                    if not pushed:
                        break
                    total_flow += pushed
        cost = sum(self._cost[a] * self.flow_on(a) for a in range(0, len(self._to), 2))
        return total_flow, cost

    def _shortest(self, source: int, potential: list[int]) -> list[float]:
        dist: list[float] = [_INF] * len(self._adj)
        dist[source] = 0
        heap: list[tuple[float, int]] = [(0, source)]
        to, cap, cost, adj = self._to, self._cap, self._cost, self._adj
        while heap:
            d, u = heapq.heappop(heap)
            if d > dist[u]:
                continue
            pu = potential[u]
            for arc in adj[u]:
                if cap[arc] > 0:
                    v = to[arc]
                    nd = d + cost[arc] + pu - potential[v]
                    if nd < dist[v]:
                        dist[v] = nd
                        heapq.heappush(heap, (nd, v))
        return dist

    def _admissible(self, arc: int, tail: int, potential: list[int]) -> bool:
        return self._cap[arc] > 0 and self._cost[arc] + potential[tail] - potential[self._to[arc]] == 0

    def _levels(self, source: int, sink: int, potential: list[int]) -> list[int]:
        level = [-1] * len(self._adj)
        level[source] = 0
        frontier = [source]
        while frontier and level[sink] < 0:
            following = []
            for u in frontier:
                for arc in self._adj[u]:
                    v = self._to[arc]
                    if level[v] < 0 and self._admissible(arc, u, potential):
                        level[v] = level[u] + 1
                        following.append(v)
            frontier = following
        return level

    def _augment(
        self, source: int, sink: int, level: list[int], cursor: list[int], potential: list[int]
    ) -> int:
        """One augmenting path in the level graph (iterative DFS with current-arc pointers)."""
        path: list[int] = []
        u = source
        while True:
            if u == sink:
                pushed = min(self._cap[a] for a in path)
                for a in path:
                    self._cap[a] -= pushed
                    self._cap[a ^ 1] += pushed
                return pushed
            arcs = self._adj[u]
            while cursor[u] < len(arcs):
                arc = arcs[cursor[u]]
                v = self._to[arc]
                if level[v] == level[u] + 1 and self._admissible(arc, u, potential):
                    path.append(arc)
                    u = v
                    break
                cursor[u] += 1
            else:
                if not path:
                    return 0
                level[u] = -1  # dead end for the rest of this phase
                arc = path.pop()
                u = self._to[arc ^ 1]
                cursor[u] += 1
