"""A small stock ledger for a workshop: parts come in, get reserved for jobs, and go out."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date


class StockError(Exception):
    """Raised when a movement would leave a part with negative stock."""


@dataclass
class Part:
    code: str
    name: str
    unit_cost: float
    on_hand: int = 0
    reserved: int = 0

    @property
    def available(self) -> int:
        return self.on_hand - self.reserved

    def value(self) -> float:
        return round(self.on_hand * self.unit_cost, 2)


@dataclass
class Movement:
    day: date
    code: str
    quantity: int
    note: str = ""


@dataclass
class Ledger:
    parts: dict[str, Part] = field(default_factory=dict)
    history: list[Movement] = field(default_factory=list)

    def add_part(self, code: str, name: str, unit_cost: float) -> Part:
        if code in self.parts:
            raise KeyError(f"part {code} already exists")
        part = Part(code, name, unit_cost)
        self.parts[code] = part
        return part

    def receive(self, code: str, quantity: int, day: date | None = None, note: str = "") -> None:
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self.parts[code].on_hand += quantity
        self.history.append(Movement(day or date.today(), code, quantity, note))

    def reserve(self, code: str, quantity: int) -> None:
        part = self.parts[code]
        if quantity > part.available:
            raise StockError(f"only {part.available} of {code} available, {quantity} requested")
        part.reserved += quantity

    def issue(self, code: str, quantity: int, day: date | None = None, note: str = "") -> None:
        part = self.parts[code]
        if quantity > part.on_hand:
            raise StockError(f"cannot issue {quantity} of {code}: {part.on_hand} on hand")
        part.on_hand -= quantity
        part.reserved = max(0, part.reserved - quantity)
        self.history.append(Movement(day or date.today(), code, -quantity, note))

    def low_stock(self, threshold: int = 5) -> list[Part]:
        return sorted((p for p in self.parts.values() if p.available < threshold), key=lambda p: p.available)

    def total_value(self) -> float:
        return round(sum(p.value() for p in self.parts.values()), 2)

    def movements_for(self, code: str) -> list[Movement]:
        return [m for m in self.history if m.code == code]


def main() -> None:
    ledger = Ledger()
    ledger.add_part("B-100", "hex bolt M8", 0.12)
    ledger.add_part("N-100", "hex nut M8", 0.05)
    ledger.receive("B-100", 250, note="order 4411")
    ledger.receive("N-100", 300, note="order 4411")
    ledger.reserve("B-100", 40)
    ledger.issue("B-100", 40, note="job 17")
    for part in ledger.low_stock(threshold=100):
        print(f"{part.code}: {part.available} left")
    print(f"stock value: {ledger.total_value():.2f}")


if __name__ == "__main__":
    main()
