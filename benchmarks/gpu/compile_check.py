"""Compile the triton kernels for Hopper (sm_90) on a machine without a GPU, with triton's own ptxas.

Catches what the interpreter cannot: constructs that do not lower to PTX, and the shared memory each
tile configuration needs. Prints one line per configuration; exit status 1 if any fails to compile.
    python benchmarks/gpu/compile_check.py [--quick]     (TRITON_INTERPRET must be unset)
"""
from __future__ import annotations

import inspect
import sys

import triton
from triton.backends.compiler import GPUTarget

from specfleet.engine.kernels.lora import _lora_expand_kernel, _lora_shrink_kernel
from specfleet.engine.kernels.paged_attention import _paged_attention_kernel, launch_config
from specfleet.engine.kernels.reshape_and_cache import _reshape_and_cache_kernel

HOPPER = GPUTarget("cuda", 90, 32)
ATTENTION_POINTERS = ("out_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr")
INDEX_POINTERS = {"block_tables_ptr": "*i32", "query_start_loc_ptr": "*i32", "context_lens_ptr": "*i32",
                  "slot_ptr": "*i64", "order_ptr": "*i32", "starts_ptr": "*i32", "counts_ptr": "*i32",
                  "xa_ptr": "*fp32"}


def signature(kernel, dtype: str, constants: dict) -> dict:
    sig = {}
    for name in inspect.getfullargspec(kernel.fn).args:
        if name in constants:
            sig[name] = "constexpr"
        elif name in INDEX_POINTERS:
            sig[name] = INDEX_POINTERS[name]
        elif name.endswith("_ptr"):
            sig[name] = f"*{dtype}"
        else:
            sig[name] = "fp32" if name == "qk_scale_log2" else "i32"
    return sig


def compile_kernel(kernel, dtype: str, constants: dict):
    source = triton.compiler.ASTSource(kernel, signature(kernel, dtype, constants), constants)
    return triton.compile(source, target=HOPPER, options={"num_warps": 4})


SHAPES = [(1, 4, 64), (5, 4, 64), (512, 4, 64), (1, 1, 128), (16, 8, 128)]   # (max_query_len, group, head_dim)
QUICK = [("bf16", 1, 4, 64), ("bf16", 512, 4, 64), ("fp32", 5, 2, 64)]     # decode, prefill, the fp32 branch


def main(quick: bool) -> int:
    failures = 0
    configs = QUICK if quick else [(d, *shape) for d in ("bf16", "fp16", "fp32") for shape in SHAPES]
    for dtype, max_q, group, head_dim in configs:
        constants = dict(PAGE=16, FP32_DOT=dtype == "fp32", **launch_config(max_q, group, head_dim))
        try:
            compiled = compile_kernel(_paged_attention_kernel, dtype, constants)
            print(f"paged_attention {dtype} q={max_q} group={group} d={head_dim}: shared {compiled.metadata.shared} B")
        except Exception as exc:                                              # report every configuration
            failures += 1
            print(f"paged_attention {dtype} q={max_q} group={group} d={head_dim}: FAILED {exc}")
    constants = dict(PAGE=16, HEADS=8, HEAD_DIM=64, HEAD_DIM_PAD=64, WIDTH=512, BLOCK_T=4)
    try:
        compile_kernel(_reshape_and_cache_kernel, "bf16", constants)
        print("reshape_and_cache bf16: ok")
    except Exception as exc:
        failures += 1
        print(f"reshape_and_cache bf16: FAILED {exc}")
    return 1 if failures + lora_kernels() else 0


def lora_kernels() -> int:
    """The multi-LoRA shrink and expand (engine/kernels/lora.py) at rank 16 x 3 parts; failures."""
    failures = 0
    for dtype in ("bf16", "fp32"):
        for kernel, tile in ((_lora_shrink_kernel, "BLOCK_K"), (_lora_expand_kernel, "BLOCK_N")):
            constants = {"BLOCK_M": 16, "BLOCK_R": 64, tile: 64, "FP32_DOT": dtype == "fp32"}
            try:
                compiled = compile_kernel(kernel, dtype, constants)
                print(f"{kernel.fn.__name__} {dtype}: shared {compiled.metadata.shared} B")
            except Exception as exc:
                failures += 1
                print(f"{kernel.fn.__name__} {dtype}: FAILED {exc}")
    return failures


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv))
