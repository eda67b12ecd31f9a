"""A least-recently-used cache with a size limit, hit statistics and an optional time to live."""
import time
from collections import OrderedDict


class RecentCache:
    """Keeps at most `capacity` entries; the one used longest ago is dropped first.

    >>> cache = RecentCache(2)
    >>> cache.put("a", 1); cache.put("b", 2); cache.get("a")
    1
    >>> cache.put("c", 3)
    >>> "b" in cache
    False
    """

    def __init__(self, capacity, ttl=None, clock=time.monotonic):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.ttl = ttl
        self._clock = clock
        self._items = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self):
        return len(self._items)

    def __contains__(self, key):
        return self._fresh(key)

    def _fresh(self, key):
        if key not in self._items:
            return False
        if self.ttl is None:
            return True
        _, stored_at = self._items[key]
        if self._clock() - stored_at > self.ttl:
            del self._items[key]
            return False
        return True

    def get(self, key, default=None):
        if not self._fresh(key):
            self.misses += 1
            return default
        self.hits += 1
        self._items.move_to_end(key)
        return self._items[key][0]

    def put(self, key, value):
        if key in self._items:
            self._items.move_to_end(key)
        self._items[key] = (value, self._clock())
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def hit_rate(self):
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def clear(self):
        self._items.clear()
        self.hits = self.misses = 0


def memoize(capacity=128):
    """Decorator: remember a function's results for its positional arguments."""
    def wrap(func):
        cache = RecentCache(capacity)
        missing = object()

        def inner(*args):
            value = cache.get(args, missing)
            if value is missing:
                value = func(*args)
                cache.put(args, value)
            return value

        inner.cache = cache
        inner.__name__ = func.__name__
        inner.__doc__ = func.__doc__
        return inner
    return wrap


@memoize(capacity=256)
def ways_to_climb(steps):
    """Ways to climb `steps` stairs taking one or two at a time."""
    if steps <= 1:
        return 1
    return ways_to_climb(steps - 1) + ways_to_climb(steps - 2)


if __name__ == "__main__":
    print([ways_to_climb(n) for n in range(10)])
    print(f"hit rate {ways_to_climb.cache.hit_rate():.2f}")
