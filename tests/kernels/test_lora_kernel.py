"""The multi-LoRA ops (the triton kernels, the CPU extension's `lora_add` and the CPU torch op) add each row's
own adapter: mixed adapters, base rows, ranks padded below the maximum, widths that are no multiple of a tile."""
from __future__ import annotations

import pytest
import torch

from specfleet.engine.kernels.lora import TritonLoRAOps, lora_segments
from specfleet.engine.cpu import attention as cpu_attention
from specfleet.engine.lora.layers import KernelLoRAOps, TorchLoRAOps


@pytest.fixture(params=["triton", "cpu_kernel", "torch"])
def ops(request, device):
    if request.param == "triton":
        return TritonLoRAOps
    if request.param == "torch":
        return TorchLoRAOps
    if device.type != "cpu" or cpu_attention.load_kernel() is None:
        pytest.skip("the CPU extension's lora_add runs on CPU tensors, where the extension builds")
    return KernelLoRAOps(cpu_attention.load_kernel())


def slot_weights(slots: int, ranks: list[int], r_max: int, fan_in: int, fan_out: int, gen: torch.Generator):
    """A [slots, r_max, in] and B^T [slots, r_max, out] as `LoRASlots` holds them: slot s of rank ranks[s],
    zero past it."""
    a, bt = torch.zeros(slots, r_max, fan_in), torch.zeros(slots, r_max, fan_out)
    for s, r in enumerate(ranks):
        a[s, :r] = torch.randn(r, fan_in, generator=gen)
        bt[s, :r] = torch.randn(r, fan_out, generator=gen) / r
    return a, bt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, fan_in, fan_out, ranks, r_max", [
    (21, 48, 40, [4, 16, 8], 16),             # decode-like: rows spread over every slot, odd widths
    (37, 160, 200, [3, 12, 12, 1], 12),      # widths past one tile, a rank below 16 padded
    (5, 24, 136, [16, 16], 16),               # fewer rows than one tile
    (60, 40, 72, [16, 2], 16),                # a group longer than the CPU kernel's 16-row tasks
    (9, 20, 40, [4, 8], 8),                   # a fan-in the CPU kernel does not tile: its torch fall-back
])
def test_each_row_gets_its_own_adapter_and_base_rows_stay_bit_exact(ops, dtype, tokens, fan_in, fan_out, ranks,
                                                                     r_max, device):
    gen = torch.Generator().manual_seed(tokens)
    slots = len(ranks)
    a, bt = slot_weights(slots, ranks, r_max, fan_in, fan_out, gen)
    x, y = torch.randn(tokens, fan_in, generator=gen), torch.randn(tokens, fan_out, generator=gen)
    token_slots = torch.randint(-1, slots, (tokens,), generator=gen)
    token_slots[:3] = torch.tensor([-1, slots - 1, 0])[:tokens]
    token_slots[-4:] = slots - 1                       # a prefill-like run of one adapter
    expected = y.clone()
    for t, s in enumerate(token_slots.tolist()):
        if s >= 0:
            expected[t] += (a[s] @ x[t]) @ bt[s]

    cast = [t.to(device=device, dtype=dtype) for t in (y, x, a, bt)]
    out = ops.add_lora(*cast, ops.prepare(token_slots.to(device), slots, dtype)).float().cpu()

    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
    torch.testing.assert_close(out, expected, **tol)
    base = token_slots < 0
    assert base.any() and torch.equal(out[base], y.to(dtype)[base].float())


def test_a_step_with_only_base_rows_changes_nothing(device):
    y = torch.randn(9, 40, device=device)
    a, bt = torch.randn(2, 16, 24, device=device), torch.randn(2, 16, 40, device=device)
    base_only = torch.full((9,), -1, device=device)
    state = TritonLoRAOps.prepare(base_only, 2, torch.float32)
    out = TritonLoRAOps.add_lora(y.clone(), torch.randn(9, 24, device=device), a, bt, state)
    assert torch.equal(out, y)
    assert TorchLoRAOps.prepare(base_only, 2, torch.float32) is None        # the torch op is skipped


def test_torch_groups_use_only_the_slots_in_use_padded_to_the_longest_group():
    groups = TorchLoRAOps.prepare(torch.tensor([-1, 3, 1, 3, -1, 3]), 5, torch.float32)
    assert (groups.lo, groups.hi, groups.length) == (1, 4, 3)
    assert groups.rows.tolist() == [2, 0, 0, 0, 0, 0, 1, 3, 5]
    assert groups.valid.flatten().tolist() == [1, 0, 0, 0, 0, 0, 1, 1, 1]
    assert groups.inverse.tolist() == [1, 6, 0, 7, 1, 8]                # base rows read a padding row


def test_torch_groups_add_a_padding_row_when_base_rows_have_none_to_read():
    groups = TorchLoRAOps.prepare(torch.tensor([0, 1, -1]), 2, torch.float32)
    assert groups.length == 2 and groups.valid.flatten().tolist() == [1, 0, 1, 0]
    assert groups.inverse.tolist() == [0, 2, 1]


def test_segments_group_rows_by_slot_in_order_and_leave_base_rows_out():
    seg = lora_segments(torch.tensor([2, -1, 0, 2, -1, 0, 0]), 4)
    assert seg.counts.tolist() == [3, 0, 2, 0] and seg.starts.tolist() == [0, 3, 3, 5]
    assert seg.order[:5].tolist() == [2, 5, 6, 0, 3]


@pytest.mark.parametrize("r_max", [8, 3])        # 3: the CPU kernel's blocks of 8 rank rows span parts
def test_a_fused_projection_adds_each_parts_own_block(ops, device, r_max):
    """qkv-like: three parts own rank rows [r_max i, r_max i + r) of A and only their own output columns of B^T."""
    gen = torch.Generator().manual_seed(3)
    parts, slots, fan_in, tokens = (40, 24, 24), 3, 32, 19
    a, bt = torch.zeros(slots, 3 * r_max, fan_in), torch.zeros(slots, 3 * r_max, sum(parts))
    for s in range(slots):
        column = 0
        for i, width in enumerate(parts):
            r = r_max - s                                  # ranks r_max, r_max - 1, ...: padded rows stay zero
            a[s, i * r_max:i * r_max + r] = torch.randn(r, fan_in, generator=gen)
            bt[s, i * r_max:i * r_max + r, column:column + width] = torch.randn(r, width, generator=gen)
            column += width
    x, y = torch.randn(tokens, fan_in, generator=gen), torch.randn(tokens, sum(parts), generator=gen)
    token_slots = torch.randint(-1, slots, (tokens,), generator=gen)
    expected = torch.stack([y[t] + (a[s] @ x[t]) @ bt[s] if s >= 0 else y[t]
                            for t, s in enumerate(token_slots.tolist())])

    cast = [t.to(device) for t in (y, x, a, bt)]
    out = ops.add_lora(*cast, ops.prepare(token_slots.to(device), slots, torch.float32), parts).cpu()

    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_cpu_kernel_gives_a_row_the_same_bits_in_any_batch():
    """`lora_add` sums each row in one fixed order: a row alone and in a mixed batch get identical values."""
    kernel = cpu_attention.load_kernel()
    if kernel is None:
        pytest.skip("the CPU extension does not build here")
    gen = torch.Generator().manual_seed(5)
    a, bt = torch.randn(4, 16, 64, generator=gen), torch.randn(4, 16, 96, generator=gen)
    x, y = torch.randn(23, 64, generator=gen), torch.randn(23, 96, generator=gen)
    token_slots = torch.randint(-1, 4, (23,), generator=gen)
    token_slots[7] = 2
    ops = KernelLoRAOps(kernel)
    mixed = ops.add_lora(y.clone(), x, a, bt, ops.prepare(token_slots, 4, torch.float32))
    alone = ops.add_lora(y[7:8].clone(), x[7:8], a, bt, ops.prepare(token_slots[7:8], 4, torch.float32))
    assert torch.equal(mixed[7], alone[0])
