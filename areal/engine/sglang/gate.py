"""The moment generation continues, for coroutines on any event loop that wait for it.

An answer aborted by a weight update's pause waits until the servers continue, then resubmits
prompt + tokens so far. SGLang queues requests first come, first served (its default
schedule_policy "fcfs"), and the trainer consumes episodes in submission order, so those
remainders, of the oldest episodes, must reach the servers before the new episodes that the
rollout executor admits at the same continue. `ServerControl.resume` therefore wakes them here
before it resumes its listeners (the executor): each wake-up is a callback on its waiter's loop,
queued ahead of the executor's own, so every remainder is posted before a new episode starts.
Waking by polling instead (every 50 ms) let up to a whole batch queue ahead of the remainders:
the SmolLM2 recipe's abort runs then waited 1.3-3.3 s for their stragglers every other step
(docs/benchmarks.md, section 10).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

BACKSTOP_S = 0.05  # a waiter re-reads the gate this often anyway (a continue seen some other way)


class ContinueSignal:
    def __init__(self, backstop_s: float = BACKSTOP_S):
        self.backstop_s = backstop_s
        self._lock = threading.Lock()
        self._waiters: dict[asyncio.Future, asyncio.AbstractEventLoop] = {}  # in the order they came

    async def wait(self, paused: Callable[[], bool]) -> None:
        """Return once `paused()` is false: read again at each notify() and every backstop_s."""
        loop = asyncio.get_running_loop()
        while paused():
            woken = loop.create_future()
            with self._lock:
                self._waiters[woken] = loop
            backstop = loop.call_later(self.backstop_s, _settle, woken)
            try:
                if paused():  # a notify() between the first read and the registration found no waiter
                    await woken
            finally:
                backstop.cancel()
                with self._lock:
                    self._waiters.pop(woken, None)

    def notify(self) -> None:
        """Wake every waiter (from any thread), the earliest first: call after the gate opened."""
        with self._lock:
            waiters = list(self._waiters.items())
        for woken, loop in waiters:
            try:
                loop.call_soon_threadsafe(_settle, woken)
            except RuntimeError:  # its loop has closed: nothing waits there any more
                pass

    @property
    def waiting(self) -> int:
        """Coroutines waiting now."""
        with self._lock:
            return len(self._waiters)


def _settle(woken: asyncio.Future) -> None:
    if not woken.done():
        woken.set_result(None)
