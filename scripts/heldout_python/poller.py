"""Poll several sensors concurrently with asyncio, with a concurrency limit, timeouts and retries."""
import asyncio
import random
import statistics


class SensorOffline(Exception):
    pass


class FakeSensor:
    def __init__(self, name, mean, flaky=0.1, seed=None):
        self.name = name
        self.mean = mean
        self.flaky = flaky
        self.rng = random.Random(seed)

    async def read(self):
        await asyncio.sleep(self.rng.uniform(0.01, 0.05))
        if self.rng.random() < self.flaky:
            raise SensorOffline(self.name)
        return self.rng.gauss(self.mean, 0.5)


async def read_with_retry(sensor, attempts=3, timeout=0.2, backoff=0.02):
    for attempt in range(1, attempts + 1):
        try:
            return await asyncio.wait_for(sensor.read(), timeout)
        except (SensorOffline, asyncio.TimeoutError):
            if attempt == attempts:
                return None
            await asyncio.sleep(backoff * 2 ** (attempt - 1))


async def poll_all(sensors, limit=4, rounds=5):
    gate = asyncio.Semaphore(limit)
    readings = {s.name: [] for s in sensors}

    async def one(sensor):
        async with gate:
            value = await read_with_retry(sensor)
        if value is not None:
            readings[sensor.name].append(value)

    for _ in range(rounds):
        await asyncio.gather(*(one(s) for s in sensors))
    return readings


def summarise(readings):
    rows = []
    for name, values in sorted(readings.items()):
        if not values:
            rows.append(f"{name:>10}: no data")
            continue
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        rows.append(f"{name:>10}: {statistics.mean(values):6.2f} +/- {spread:.2f} ({len(values)} readings)")
    return "\n".join(rows)


if __name__ == "__main__":
    sensors = [FakeSensor(f"room-{i}", 19 + i, seed=i) for i in range(6)]
    print(summarise(asyncio.run(poll_all(sensors))))
