"""LoRARequest: which adapter a request runs with, as in vLLM's offline API (`LoRARequest(name, int_id, path)`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int            # unique per adapter, >= 1 (0 is the base model); keys the prefix cache
    lora_path: str              # a PEFT folder: adapter_config.json + adapter_model.safetensors

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("lora_name must not be empty")
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
