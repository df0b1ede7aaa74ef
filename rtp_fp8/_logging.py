"""Log a message once per process: decisions (backend, executor, fallback) that every call repeats."""

from __future__ import annotations

import logging


def log_once(logger: logging.Logger, seen: set[str], key: str, msg: str, *args, level: int = logging.INFO) -> None:
    """Log `msg % args` at `level` the first time `key` is seen in `seen` (the caller's set)."""
    if key not in seen:
        seen.add(key)
        logger.log(level, msg, *args)
