"""Loading this folder's conftest (TRITON_INTERPRET=1 for the process) leaves the CPU engine as it was."""
from __future__ import annotations

from specfleet.engine import LLM, SamplingParams
from specfleet.engine.cpu.attention import CpuPagedAttention


def test_cpu_engine_still_selects_the_cpu_backend_by_default(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=16, block_size=8)
    assert type(llm.engine.runner.model.model.layers[0].self_attn.attend) is CpuPagedAttention
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3
