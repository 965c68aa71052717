"""A process that ends with its parent: a plugin host with its keeper, an audit worker with its
harness, even while its own code blocks and its stdin's end is never read."""

from __future__ import annotations

import os
import threading
import time

PARENT_POLL_SECONDS = 1.0


def exit_with_parent(parent: int, poll: float = PARENT_POLL_SECONDS) -> threading.Thread:
    """End this process once its parent ``parent`` (a plugin host's keeper) has ended (this
    one is then reparented), also while a plugin's code blocks and stdin's end is never
    read."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(3)

    thread = threading.Thread(target=watch, daemon=True, name="parent-watch")
    thread.start()
    return thread
