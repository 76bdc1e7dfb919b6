"""The server's shutdown: a grace period for running requests, then the cut."""
from __future__ import annotations

import asyncio


class Shutdown:
    """`begin(grace)` marks the server closing and, `grace` seconds later, cuts the
    requests still running (sets `cut`); `cut_now()` cuts at once. Callable from any
    thread or a signal handler (everything goes through call_soon_threadsafe).
    `n_cut` counts the requests the cut ended."""

    def __init__(self):
        self.closing = False
        self.cut = asyncio.Event()
        self.n_cut = 0
        self.loop: asyncio.AbstractEventLoop | None = None   # set by the first request

    def _call(self, fn, *args):
        loop = self.loop
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:        # the loop is closed: nothing is running any more
            pass

    def begin(self, grace: float) -> None:
        self.closing = True
        self._call(lambda: asyncio.get_running_loop().call_later(grace, self.cut.set))

    def cut_now(self) -> None:
        self.closing = True
        self._call(self.cut.set)

    def error(self) -> tuple:
        """(message, type, param, code) of the error a cut request gets."""
        return ("the server is shutting down: the request was cut before it finished",
                "server_error", None, "server_shutting_down")
