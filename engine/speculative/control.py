"""SpeculationControl: the live on/off switch and depth k, set from any thread, read once per step."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


class SpeculationNotConfigured(RuntimeError):
    """Speculation was not set up at start-up (no speculative method), so it cannot be toggled."""


@dataclass
class SpeculationControl:
    method: str | None                 # None: not configured
    max_k: int                         # buffers and proposers are sized for this depth
    enabled: bool = True
    k: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def configured(self) -> bool:
        return self.method is not None

    @property
    def active_k(self) -> int:
        """Depth for the coming step: 0 means the plain decode path."""
        with self._lock:
            return self.k if (self.configured and self.enabled) else 0

    def state(self) -> dict:
        with self._lock:
            return {"configured": self.configured, "method": self.method, "enabled": self.configured and self.enabled,
                    "num_speculative_tokens": self.k, "max_speculative_tokens": self.max_k}

    def update(self, enabled: bool | None = None, num_speculative_tokens: int | None = None) -> dict:
        if not self.configured:
            raise SpeculationNotConfigured("speculation is not configured on this engine: start it with "
                                           "--speculative-method ngram|draft")
        if num_speculative_tokens is not None and not 0 <= num_speculative_tokens <= self.max_k:
            raise ValueError(f"num_speculative_tokens must be between 0 and {self.max_k} (the start-up maximum), "
                             f"got {num_speculative_tokens}")
        with self._lock:
            if enabled is not None:
                self.enabled = bool(enabled)
            if num_speculative_tokens is not None:
                self.k = num_speculative_tokens
        return self.state()
