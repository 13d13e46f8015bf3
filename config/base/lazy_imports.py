"""Modules imported on first use.

A worker process imports every app at start (Django's setup, the workflows they register), and the MCP SDK and the
openai SDK were most of that: 1.7 s of the 3.7 s of CPU a worker spent before its first task, measured on this machine
(`python -X importtime`, 2026-12-02: mcp.types 0.85 s, openai 0.69 s), paid by every worker, management command and
test process, most of which never call a tool or a model. The modules that call them (agents_app.gateway's,
agents_app.llm) bind a stand-in at import that imports the real module on the first attribute read.

Not importlib.util.LazyLoader: on Python 3.11 two threads reading a lazy module's first attribute at once can see it
half-initialised (the effects' timeout threads and the heartbeat run beside a step). importlib.import_module holds the
import system's per-module lock, so the first read imports once, and a concurrent one waits for it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any


class _Deferred(ModuleType):
    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attribute)


def lazy_module(name: str) -> ModuleType:
    """``name`` if it is imported already, else a stand-in that imports it when one of its attributes is read."""
    return sys.modules.get(name) or _Deferred(name)
