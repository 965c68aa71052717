"""What names a setting and a run: canonical keys and content hashes.

A run's id is the content hash of its resolved benchmark, device type and base-model
recipe (harness/README.md, "Unit of work"); a setting is stored under its canonical key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def setting_key(params: dict[str, Any]) -> str:
    """The canonical name of a method setting, e.g. ``sigma=0.25``."""
    return ",".join(f"{k}={params[k]}" for k in sorted(params)) or "default"


def content_hash(obj: Any) -> str:
    """SHA-256 of the canonical JSON of ``obj`` (sorted keys), as hex."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
