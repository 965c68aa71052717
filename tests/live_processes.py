"""What tests of plugin hosts look for after a run: processes still alive (read from
``/proc``), to assert that nothing a plugin started outlived it."""

from __future__ import annotations

import os


def live_processes(text: str) -> list[str]:
    """``"pid: command line"`` of every live process (not a zombie, not this one) whose
    command line holds ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                line = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as stat:
                zombie = stat.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if text in line and not zombie:
            found.append(f"{entry}: {line[:120]}")
    return found
