"""Where the benchmarks' results go: JSON files, their folder made on the way."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(path: str, data: Any) -> None:
    """Write `data` to `path` as indented JSON, creating its folder if missing."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
