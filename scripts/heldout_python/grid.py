"""A dense 2-D grid of numbers with arithmetic, transposition and matrix products."""
from __future__ import annotations

from typing import Iterable, Sequence


class Grid:
    def __init__(self, rows: Sequence[Sequence[float]]):
        rows = [list(map(float, r)) for r in rows]
        if not rows or any(len(r) != len(rows[0]) for r in rows):
            raise ValueError("a grid needs at least one row, and every row the same length")
        self._rows = rows

    @classmethod
    def zeros(cls, n_rows: int, n_cols: int) -> "Grid":
        return cls([[0.0] * n_cols for _ in range(n_rows)])

    @classmethod
    def identity(cls, n: int) -> "Grid":
        return cls([[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)])

    @property
    def shape(self) -> tuple[int, int]:
        return len(self._rows), len(self._rows[0])

    def __getitem__(self, index: tuple[int, int]) -> float:
        i, j = index
        return self._rows[i][j]

    def __iter__(self) -> Iterable[list[float]]:
        return (list(r) for r in self._rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Grid) and self._rows == other._rows

    def __repr__(self) -> str:
        body = ",\n      ".join(repr(r) for r in self._rows)
        return f"Grid([{body}])"

    def _zip(self, other: "Grid", op) -> "Grid":
        if self.shape != other.shape:
            raise ValueError(f"shapes differ: {self.shape} and {other.shape}")
        return Grid([[op(a, b) for a, b in zip(r, s)] for r, s in zip(self._rows, other._rows)])

    def __add__(self, other: "Grid") -> "Grid":
        return self._zip(other, lambda a, b: a + b)

    def __sub__(self, other: "Grid") -> "Grid":
        return self._zip(other, lambda a, b: a - b)

    def __mul__(self, k: float) -> "Grid":
        return Grid([[k * a for a in r] for r in self._rows])

    __rmul__ = __mul__

    def transpose(self) -> "Grid":
        return Grid([list(col) for col in zip(*self._rows)])

    def __matmul__(self, other: "Grid") -> "Grid":
        n, m = self.shape
        m2, p = other.shape
        if m != m2:
            raise ValueError(f"cannot multiply {self.shape} by {other.shape}")
        cols = other.transpose()._rows
        return Grid([[sum(a * b for a, b in zip(row, col)) for col in cols] for row in self._rows])

    def power(self, k: int) -> "Grid":
        n, m = self.shape
        if n != m:
            raise ValueError("only square grids have powers")
        result, base = Grid.identity(n), self
        while k > 0:
            if k & 1:
                result = result @ base
            base = base @ base
            k >>= 1
        return result


if __name__ == "__main__":
    fib = Grid([[1, 1], [1, 0]])
    print(fib.power(10)[0, 1])
    print(Grid.identity(3) * 2 + Grid.zeros(3, 3))
