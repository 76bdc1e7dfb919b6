"""The admission gate: how many generations run at once and how many more may wait."""
from __future__ import annotations

import threading


class AdmissionGate:
    """At most `running` generations at once and `queued` more waiting. A request is
    admitted (`admit`) before any work and leaves (`leave`) when it ends; in between it
    holds `sem` while it generates."""

    def __init__(self, running: int, queued: int):
        self.capacity = running + queued
        self.sem = threading.BoundedSemaphore(running)
        self.lock = threading.Lock()
        self.admitted = 0

    def admit(self) -> bool:
        with self.lock:
            if self.admitted >= self.capacity:
                return False
            self.admitted += 1
            return True

    def leave(self) -> None:
        with self.lock:
            self.admitted -= 1
