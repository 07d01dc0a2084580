"""The bounded cache a process keeps of objects written once (a run's spec, its judged
items, the API's write-once reads), one per name on each Context (Context.cache)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any


class BoundedCache:
    """A thread-safe least-recently-used map of at most `size` entries: what a process
    keeps of objects written once (a run's spec, its judged items) while its thread pool
    reads them. An entry is read and evicted whole, so a reader never sees half of one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: Any, value: Any) -> Any:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value

    def __len__(self) -> int:
        # under the lock: a put holds one entry over the size until it evicts
        with self._lock:
            return len(self._data)
