"""Optional persistence: the whole store (and the issued ServiceAccount tokens, as digests) as one JSON file,
saved shortly after changes and on shutdown."""
from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from specfleet.cluster.apiserver.auth import TokenAuthority
from specfleet.cluster.apiserver.store import Event, Store

log = logging.getLogger(__name__)


@dataclass
class StateFile:
    path: Path
    store: Store
    tokens: TokenAuthority | None = None
    delay: float = 0.2
    loop: asyncio.AbstractEventLoop | None = None
    dirty: bool = False

    def load(self) -> bool:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return False
        data = json.loads(self.path.read_text())
        self.store.restore(data)
        if self.tokens is not None:
            self.tokens.restore(data.get("tokens") or [])
        return True

    def on_event(self, _: Event) -> None:
        self.changed()

    def changed(self) -> None:
        if self.dirty:
            return
        self.dirty = True
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.call_later, self.delay, self.save)

    def save(self) -> None:
        self.dirty = False
        state = self.store.snapshot()
        if self.tokens is not None:
            state["tokens"] = self.tokens.snapshot()
        data = json.dumps(state, separators=(",", ":"))
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(data)
        os.replace(tmp, self.path)
