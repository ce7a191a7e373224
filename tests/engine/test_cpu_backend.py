"""The CPU backend: the C++ paged-attention kernel against the torch reference, the fused elementwise steps
against theirs, packed linears against `nn.Linear`, and the fall-back to the torch path when the kernel
cannot be built."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specfleet.engine import LLM, SamplingParams
from specfleet.engine.attention import TorchPagedAttention, write_kv
from specfleet.engine.cpu import attention as cpu_attention
from specfleet.engine.cpu import linear as cpu_linear
from specfleet.engine.cpu.linear import PackedLinear, calibrate_small_rows, pack_linears
from specfleet.engine.cpu.row_limits import RowLimitStore

BF16_PACKED = torch.bfloat16 in cpu_linear.packed_dtypes()
needs_bf16_packing = pytest.mark.skipif(not BF16_PACKED, reason="oneDNN has no bf16 path on this CPU (AVX-512 or "
                                        "AVX-NE-CONVERT): bf16 linears stay nn.Linear")
from specfleet.engine.model.llama import TorchElementwise
from testkit import build_step

CASES = [  # query lens, context lens (keys visible to each sequence's last query), block size
    ([1, 1, 1, 1], [1, 16, 17, 150], 16),       # decodes: a single key, a block exactly full, one past it
    ([3, 3, 5], [3, 40, 77], 8),                # verifications, one whose context is all new tokens
    ([1, 2, 5, 5, 40], [9, 30, 64, 65, 100], 16),  # mixed step with a prefill chunk (the SDPA path)
]


@pytest.mark.parametrize("query_lens,context_lens,block_size", CASES)
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (6, 3), (9, 3), (8, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_the_torch_reference(query_lens, context_lens, block_size, heads, dtype):
    q_heads, kv_heads = heads
    meta = build_step(query_lens, context_lens, block_size, num_blocks=64, device="cpu")
    gen = torch.Generator().manual_seed(7)
    k_cache, v_cache = (torch.randn(64, block_size, kv_heads, 32, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(sum(query_lens), q_heads, 32, generator=gen).to(dtype)
    expected = TorchPagedAttention(0.2)(q.float(), k_cache.float(), v_cache.float(), meta)
    got = cpu_attention.CpuPagedAttention(0.2)(q, k_cache, v_cache, meta)
    assert got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


PREFILL_CASES = [  # query lens, context lens, block size, head dim
    ([20, 20], [20, 50], 16, 64),              # two fresh-or-cached chunks of one length: one group
    ([257], [257], 16, 64),                    # a whole prompt, its last tile one token long
    ([1, 1, 33], [40, 9, 96], 8, 32),          # decodes beside a chunk after a 63-token cached prefix
    ([17, 31], [17, 31], 16, 128),
    ([30], [45], 16, 48),                      # a head size of three 16-column strips
]


@pytest.mark.parametrize("query_lens,context_lens,block_size,head_dim", PREFILL_CASES)
@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_prefill_kernel_matches_the_torch_reference(query_lens, context_lens, block_size, head_dim, heads, dtype):
    q_heads, kv_heads = heads
    meta = build_step(query_lens, context_lens, block_size, num_blocks=64, device="cpu")
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = (torch.randn(64, block_size, kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(sum(query_lens), q_heads, head_dim, generator=gen).to(dtype)
    expected = TorchPagedAttention(head_dim ** -0.5)(q.float(), k_cache.float(), v_cache.float(), meta)
    group = meta.groups[-1]                          # the prefill chunks' group: the kernel itself, not SDPA
    assert cpu_attention.load_kernel().paged_attention_prefill(
        q[group.start:group.start + group.num_seqs * group.query_len], k_cache, v_cache, group.block_tables,
        group.context_lens, group.query_len, 0.1).numel() > 0
    got = cpu_attention.CpuPagedAttention(head_dim ** -0.5)(q, k_cache, v_cache, meta)
    assert got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2     # bf16 inputs and P, fp32 sums
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])     # bf16: slabs packed as element pairs
def test_no_key_a_query_cannot_see_reaches_its_output(dtype):
    meta = build_step([40], [100], 16, num_blocks=16, device="cpu")
    k_cache, v_cache = torch.randn(16, 16, 3, 64).to(dtype), torch.randn(16, 16, 3, 64).to(dtype)
    q = torch.randn(40, 9, 64).to(dtype)
    group = meta.groups[0]
    prefill = cpu_attention.load_kernel().paged_attention_prefill
    before = prefill(q, k_cache, v_cache, group.block_tables, group.context_lens, 40, 0.125)
    table = meta.block_tables[0].tolist()
    for block in set(range(16)) - set(table[:7]):
        k_cache[block], v_cache[block] = float("nan"), float("nan")
    k_cache[table[6], 4:], v_cache[table[6], 4:] = float("nan"), float("nan")      # slots past key 99
    after = prefill(q, k_cache, v_cache, group.block_tables, group.context_lens, 40, 0.125)
    torch.testing.assert_close(after, before)
    # the first query sees keys 0-60 only: other keys and values there leave its output alone
    k_cache[table[3], 13:] += 100.0
    v_cache[table[3], 13:] += 100.0
    again = prefill(q, k_cache, v_cache, group.block_tables, group.context_lens, 40, 0.125)
    torch.testing.assert_close(again[0], before[0])


@pytest.mark.parametrize("dtype,head_dim", [(torch.float16, 64), (torch.float32, 40)])
def test_the_prefill_kernel_leaves_what_it_does_not_cover_to_sdpa(dtype, head_dim):
    meta = build_step([24], [24], 16, num_blocks=8, device="cpu")
    k_cache, v_cache = (torch.randn(8, 16, 2, head_dim).to(dtype) for _ in range(2))
    q = torch.randn(24, 4, head_dim).to(dtype)
    group = meta.groups[0]
    assert cpu_attention.load_kernel().paged_attention_prefill(
        q, k_cache, v_cache, group.block_tables, group.context_lens, 24, 0.1).numel() == 0
    expected = TorchPagedAttention(0.1)(q, k_cache, v_cache, meta)
    torch.testing.assert_close(cpu_attention.CpuPagedAttention(0.1)(q, k_cache, v_cache, meta), expected)


def test_a_build_lock_left_by_a_killed_build_is_removed_under_the_builder_lock(tmp_path, caplog):
    (tmp_path / "lock").write_text("")                 # torch's lock file, as a build killed mid-compile leaves it
    with cpu_attention.builder_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
    assert "stale build lock" in caplog.text


def test_kernel_ignores_blocks_past_the_context():
    meta = build_step([1, 1], [5, 20], 8, num_blocks=16, device="cpu")
    k_cache, v_cache = torch.randn(16, 8, 2, 16), torch.randn(16, 8, 2, 16)
    q = torch.randn(2, 4, 16)
    before = cpu_attention.CpuPagedAttention(0.25)(q, k_cache, v_cache, meta)
    used = {b for row, c in zip(meta.block_tables.tolist(), [5, 20]) for b in row[:-(-c // 8)]}
    for block in set(range(16)) - used:
        k_cache[block], v_cache[block] = float("nan"), float("nan")
    k_cache[meta.block_tables[0, 0], 5:] = float("nan")             # slots after the first context's end
    after = cpu_attention.CpuPagedAttention(0.25)(q, k_cache, v_cache, meta)
    torch.testing.assert_close(after, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])   # fp16: index_copy_
@pytest.mark.parametrize("tokens", [3, 700])                                           # 700: over threads
@pytest.mark.parametrize("views", [True, False])          # views into a fused QKV output, or contiguous rows
def test_the_kernels_kv_write_equals_index_copy(dtype, tokens, views):
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(tokens, 9 * 16 + 2 * 3 * 16, generator=gen).to(dtype)
    k, v = qkv[:, 144:192].view(-1, 3, 16), qkv[:, 192:].view(-1, 3, 16)
    if not views:
        k, v = k.contiguous(), v.contiguous()
    slots = torch.randperm(64 * 16, generator=gen)[:tokens]
    caches = [torch.randn(64, 16, 3, 16, generator=gen).to(dtype) for _ in range(2)]
    expected = [cache.clone() for cache in caches]
    cpu_attention.load_kernel().write_kv(*caches, k, v, slots)
    write_kv(*expected, k, v, slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def test_the_kernels_kv_write_refuses_a_slot_outside_the_cache():
    k_cache, v_cache = torch.zeros(4, 16, 2, 16), torch.zeros(4, 16, 2, 16)
    with pytest.raises(RuntimeError, match="out of range"):
        cpu_attention.load_kernel().write_kv(k_cache, v_cache, torch.ones(2, 2, 16), torch.ones(2, 2, 16),
                                             torch.tensor([3, 64]))
    assert not k_cache.any() and not v_cache.any()         # checked before anything is written


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_nn_linear(bias):
    linear = nn.Linear(48, 80, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(3, 5, 48)
    torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)
    assert packed(x).shape == (3, 5, 80)


@pytest.mark.parametrize("rows", [1, 3, 8, 40])           # few-row steps take linear_small, the rest oneDNN
@pytest.mark.parametrize("out_features", [8, 20, 96])     # 20: the last block of 8 overlaps the one before
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_with_the_kernel_equals_nn_linear_at_any_row_count(rows, out_features, bias):
    linear = nn.Linear(64, out_features, bias=bias)
    packed = PackedLinear(linear, cpu_attention.load_kernel())
    x = torch.randn(rows, 64)
    torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed(x.view(rows, 1, 64)), linear(x).view(rows, 1, -1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_features,out_features", [(64, 8), (64, 100), (30, 50), (31, 48)])  # 31: half a bf16 pair
@pytest.mark.parametrize("bias", [False, True])
def test_output_panels_equal_nn_linear_for_every_row_count_up_to_two_passes(dtype, in_features, out_features, bias):
    if dtype not in cpu_linear.packed_dtypes():
        pytest.skip("oneDNN has no bf16 path on this CPU: bf16 linears are not packed")
    kernel = cpu_attention.load_kernel()
    linear = nn.Linear(in_features, out_features, bias=bias).to(dtype)
    packed = PackedLinear(linear, kernel)
    if packed.panels is None:
        pytest.skip("no panel kernel for this CPU and dtype (AVX-512, AVX512-BF16 for bf16)")
    assert packed.weight is None                           # the panels are the few-row path's only copy
    for rows in range(1, 18):                              # 1-8 rows in one pass over the panels, then 9-16, 17
        x = torch.randn(rows, in_features).to(dtype)
        expected = F.linear(x.float(), linear.weight.float(), None if linear.bias is None else linear.bias.float())
        got = packed.small(x)
        assert got.dtype == dtype and got.shape == (rows, out_features)
        if dtype == torch.float32:
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        else:                                              # fp32 sums rounded once to bf16
            torch.testing.assert_close(got.float(), expected, atol=1e-2, rtol=8e-3)


@pytest.mark.parametrize("in_features,limit", [(64, 8), (1536, 4)])
def test_steps_up_to_the_row_limit_take_linear_small_and_larger_ones_onednn(in_features, limit):
    kernel, rows_seen = cpu_attention.load_kernel(), []

    class Spy:
        def linear_small(self, x, weight, bias):
            rows_seen.append(x.shape[0])
            return kernel.linear_small(x, weight, bias)

    packed = PackedLinear(nn.Linear(in_features, 16), Spy())
    for rows in (1, limit, limit + 1):
        packed(torch.randn(rows, in_features))
    assert rows_seen == [1, limit]


class Timed(PackedLinear):
    """A PackedLinear whose two paths take known times: linear_small 1 ms per row, oneDNN a fixed `gemm_ms`."""

    def __init__(self, linear: nn.Linear, gemm_ms: float) -> None:
        super().__init__(linear, cpu_attention.load_kernel())
        self.gemm_ms = gemm_ms

    def small(self, rows):
        time.sleep(rows.shape[0] * 1e-3)
        return super().small(rows)

    def gemm(self, rows):
        time.sleep(self.gemm_ms * 1e-3)
        return super().gemm(rows)


def test_calibration_sets_each_shape_to_the_most_rows_where_linear_small_measures_faster():
    model = nn.ModuleList([Timed(nn.Linear(16, 8), gemm_ms=6), Timed(nn.Linear(16, 8), gemm_ms=6),
                           Timed(nn.Linear(16, 24), gemm_ms=3), PackedLinear(nn.Linear(16, 40))])  # last: no kernel
    limits = calibrate_small_rows(model)
    assert limits == {(16, 8): 4, (16, 24): 2}                 # 1, 2, 4 ms < 6 ms < 8 ms; 1, 2 < 3 < 4
    assert [m.small_rows for m in model[:3]] == [4, 4, 2]
    assert model[3].small_rows == cpu_linear.small_rows_limit(16)


def test_a_store_keeps_the_measured_limits_so_a_later_load_reads_them_without_timing(tmp_path):
    store = RowLimitStore(tmp_path / "limits.json")
    first = nn.ModuleList([Timed(nn.Linear(16, 8), gemm_ms=6), Timed(nn.Linear(16, 24), gemm_ms=3)])
    assert calibrate_small_rows(first, store) == {(16, 8): 4, (16, 24): 2}
    assert store.load() == {"float32:16x8": 4, "float32:16x24": 2}
    # a second process on the machine times other limits (gemm now 1.5 ms: 1 row only), yet reads the first's
    later = nn.ModuleList([Timed(nn.Linear(16, 8), gemm_ms=1.5), Timed(nn.Linear(16, 40), gemm_ms=1.5)])
    assert calibrate_small_rows(later, store) == {(16, 8): 4, (16, 40): 1}     # 16x40 is new: measured, kept
    assert store.load() == {"float32:16x8": 4, "float32:16x24": 2, "float32:16x40": 1}


def test_an_unreadable_store_is_measured_again_and_rewritten(tmp_path):
    store = RowLimitStore(tmp_path / "limits.json")
    store.path.write_text("{not json")
    assert calibrate_small_rows(nn.ModuleList([Timed(nn.Linear(16, 8), gemm_ms=6)]), store) == {(16, 8): 4}
    assert store.load() == {"float32:16x8": 4}


def test_engine_loads_read_the_machine_store(tiny_llama, tmp_path, monkeypatch):
    """What makes a server and an offline LLM on one host run the same rows on the same kernels."""
    store = RowLimitStore(tmp_path / "limits.json")
    monkeypatch.setattr(RowLimitStore, "for_this_machine", classmethod(lambda cls: store))
    LLM(tiny_llama, num_kv_blocks=32)
    assert store.load()
    store.save({key: 3 for key in store.load()})            # limits no timing gives: 3 is not a candidate
    llm = LLM(tiny_llama, num_kv_blocks=32)
    linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, PackedLinear)]
    assert linears and {m.small_rows for m in linears} == {3}


def test_calibration_times_a_shape_over_enough_layers_to_be_cold_and_no_more(monkeypatch):
    monkeypatch.setattr(cpu_linear, "COLD_BYTES", 3 * 64 * 64 * 4)
    layers = [PackedLinear(nn.Linear(64, 64), cpu_attention.load_kernel()) for _ in range(5)]
    assert cpu_linear.cold_subset(layers) == layers[:3]
    assert cpu_linear.cold_subset(layers[:2]) == layers[:2]


def test_linear_small_falls_back_to_torch_for_shapes_it_does_not_take():
    kernel = cpu_attention.load_kernel()
    for x, weight in ((torch.randn(2, 12), torch.randn(16, 12)),         # in_features not a multiple of 8
                      (torch.randn(2, 16), torch.randn(5, 16)),          # fewer than 8 outputs
                      (torch.randn(16, 2).t(), torch.randn(16, 16))):    # a non-contiguous input
        torch.testing.assert_close(kernel.linear_small(x, weight, None), x @ weight.t())


def test_pack_linears_packs_fp32_and_bf16_where_onednn_can_and_leaves_other_dtypes_alone():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).to(torch.bfloat16), nn.Linear(8, 8).to(torch.float16))
    kernel = cpu_attention.load_kernel()
    assert pack_linears(model, kernel) == 1 + BF16_PACKED
    assert isinstance(model[0], PackedLinear) and type(model[2]) is nn.Linear
    assert isinstance(model[1], PackedLinear) if BF16_PACKED else type(model[1]) is nn.Linear


def test_without_a_onednn_bf16_path_bf16_is_not_packed(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).to(torch.bfloat16))
    assert pack_linears(model, cpu_attention.load_kernel()) == 1 and type(model[1]) is nn.Linear


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("few_rows", [False, True])     # oneDNN's bf16 GEMM, or linear_small over the bf16 weight
@pytest.mark.parametrize("in_features", [96, 40])      # AVX512-BF16 dot products where the CPU has them; widened
@needs_bf16_packing
def test_packed_bf16_linear_equals_nn_linear_within_bf16_rounding(rows, few_rows, in_features):
    gen = torch.Generator().manual_seed(11)
    linear = nn.Linear(in_features, 44, bias=True).to(torch.bfloat16)     # 44 outputs: a last block of 4 rows
    x = torch.randn(rows, in_features, generator=gen).to(torch.bfloat16)
    want = linear(x)
    packed = PackedLinear(linear, cpu_attention.load_kernel())
    packed.small_rows = 64 if few_rows else 0
    got = packed(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)


def test_engine_falls_back_to_torch_attention_when_the_kernel_cannot_build(tiny_llama, monkeypatch, caplog):
    monkeypatch.setattr(cpu_attention, "_module", None)
    monkeypatch.setattr(cpu_attention, "_error", "OSError: no compiler")
    llm = LLM(tiny_llama, num_kv_blocks=32)
    assert type(llm.engine.runner.model.model.layers[0].self_attn.attend) is TorchPagedAttention
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3
    with pytest.raises(RuntimeError, match="does not build"):
        LLM(tiny_llama, num_kv_blocks=32, attention_backend="cpu")


def test_engine_uses_the_kernel_by_default_on_cpu(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=32)
    layer = llm.engine.runner.model.model.layers[0]
    assert isinstance(layer.self_attn.attend, cpu_attention.CpuPagedAttention)
    assert layer.mlp.ops is layer.self_attn.ops is layer.input_layernorm.ops is cpu_attention.load_kernel()


@pytest.mark.parametrize("tokens", [3, 700])      # a decode step (run serially) and a prefill chunk (parallel)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])   # loops for both, rounding as the reference
def test_fused_elementwise_steps_equal_the_torch_reference(tokens, dtype):
    ops, ref = cpu_attention.load_kernel(), TorchElementwise
    close = dict(rtol=2e-6, atol=2e-6) if dtype == torch.float32 else dict(rtol=0, atol=0)
    gen = torch.Generator().manual_seed(3)
    x, residual = (torch.randn(tokens, 576, generator=gen).to(dtype) for _ in range(2))
    weight = torch.randn(576, generator=gen).to(dtype)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), ref.rms_norm(x, weight, 1e-5), **close)
    for got, want in zip(ops.add_rms_norm(x, residual, weight, 1e-6), ref.add_rms_norm(x, residual, weight, 1e-6)):
        torch.testing.assert_close(got, want, **close)
    gate_up = 4 * torch.randn(tokens, 2 * 1536, generator=gen).to(dtype)      # silu's exp over a wide range
    torch.testing.assert_close(ops.silu_and_mul(gate_up), ref.silu_and_mul(gate_up), **close)
    qkv = torch.randn(tokens, (9 + 3 + 3) * 64, generator=gen).to(dtype)   # q and k as views, as the model has them
    q, k, _ = qkv.split([9 * 64, 3 * 64, 3 * 64], dim=-1)
    q, k = q.view(tokens, 9, 64), k.view(tokens, 3, 64)
    cos, sin = (torch.randn(tokens, 1, 64, generator=gen).to(dtype) for _ in range(2))
    for got, want in zip(ops.rotary(q, k, cos, sin), ref.rotary(q, k, cos, sin)):
        torch.testing.assert_close(got, want, **close)
        assert got.is_contiguous()


def test_fused_silu_saturates_like_the_reference_at_the_ends_of_the_float_range():
    gate_up = torch.tensor([[-1e4, -100.0, 0.0, 100.0, 1e4, 1.0, 1.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(cpu_attention.load_kernel().silu_and_mul(gate_up), TorchElementwise.silu_and_mul(gate_up))


def test_bf16_engine_picks_what_transformers_in_bf16_ranks_first_up_to_rounding(tiny_llama, mixed_prompts):
    """The bf16 CPU path (bf16 linears, packed where oneDNN can, the fused steps rounding as the reference,
    attention over a bf16 cache): each greedy token it picks is transformers' bf16 argmax, or within bf16 rounding of it, on
    the same prefix (teacher-forced). Exact token equality is not asserted: two bf16 GEMMs that sum in
    another order may break a near-tie either way."""
    from transformers import AutoModelForCausalLM

    prompts = mixed_prompts(4, seed=5)
    llm = LLM(tiny_llama, dtype="bfloat16", num_kv_blocks=64, skip_tokenizer_init=True)
    layer = llm.engine.runner.model.model.layers[0]
    if BF16_PACKED:
        assert isinstance(layer.mlp.gate_up_proj, PackedLinear) and layer.mlp.gate_up_proj.packed.dtype == torch.bfloat16
    else:
        assert type(layer.mlp.gate_up_proj) is nn.Linear and layer.mlp.gate_up_proj.weight.dtype == torch.bfloat16
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        for prompt, out in zip(prompts, outs):
            tokens = out.token_ids
            logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
            picked = logits.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)
            best = logits.max(dim=1).values
            assert torch.all(best - picked <= 0.02 * best.abs().clamp(min=1.0)), (best - picked).tolist()
