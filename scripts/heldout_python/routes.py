"""Shortest routes on a small road network: breadth-first search for hops, Dijkstra for distance."""
from __future__ import annotations

import heapq
from collections import defaultdict, deque
from typing import Iterable


class RoadMap:
    def __init__(self) -> None:
        self._roads: dict[str, dict[str, float]] = defaultdict(dict)

    def add_road(self, a: str, b: str, km: float) -> None:
        if km <= 0:
            raise ValueError(f"road {a}-{b} must have a positive length")
        self._roads[a][b] = km
        self._roads[b][a] = km

    def towns(self) -> list[str]:
        return sorted(self._roads)

    def neighbours(self, town: str) -> Iterable[tuple[str, float]]:
        return self._roads.get(town, {}).items()

    def fewest_hops(self, start: str, goal: str) -> list[str] | None:
        if start == goal:
            return [start]
        previous = {start: None}
        queue = deque([start])
        while queue:
            town = queue.popleft()
            for nxt, _ in self.neighbours(town):
                if nxt in previous:
                    continue
                previous[nxt] = town
                if nxt == goal:
                    return self._unwind(previous, goal)
                queue.append(nxt)
        return None

    def shortest(self, start: str, goal: str) -> tuple[float, list[str]] | None:
        best = {start: 0.0}
        previous: dict[str, str | None] = {start: None}
        heap = [(0.0, start)]
        while heap:
            dist, town = heapq.heappop(heap)
            if town == goal:
                return dist, self._unwind(previous, goal)
            if dist > best.get(town, float("inf")):
                continue
            for nxt, km in self.neighbours(town):
                cand = dist + km
                if cand < best.get(nxt, float("inf")):
                    best[nxt] = cand
                    previous[nxt] = town
                    heapq.heappush(heap, (cand, nxt))
        return None

    @staticmethod
    def _unwind(previous: dict, goal: str) -> list[str]:
        path = []
        node = goal
        while node is not None:
            path.append(node)
            node = previous[node]
        return path[::-1]


if __name__ == "__main__":
    roads = RoadMap()
    for a, b, km in [("Ashby", "Brook", 12), ("Brook", "Cale", 7.5), ("Ashby", "Cale", 25),
                     ("Cale", "Dunmore", 9), ("Brook", "Dunmore", 30), ("Dunmore", "Esk", 4)]:
        roads.add_road(a, b, km)
    print(roads.fewest_hops("Ashby", "Esk"))
    print(roads.shortest("Ashby", "Esk"))
