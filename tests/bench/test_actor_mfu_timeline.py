"""bench/actor_mfu.py's device timeline: how one profiled update's kernels are tallied by kind and where the GPU
waited. The names are the shapes torch.profiler reports on CUDA (templated kernels, inductor's, copies)."""

from __future__ import annotations

import pytest

from bench.actor_mfu import device_timeline, kernel_kind

MS = 1_000_000


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, cutlass::bfloat16_t>>",
            "attention",
        ),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "matmul"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNN", "matmul"),
        ("triton_poi_fused__to_copy_add_mul_rsqrt_0", "compiled"),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
            "copy",
        ),
        ("Memcpy HtoD (Pinned -> Device)", "copy"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>>",
            "reduction",
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>",
            "optimizer",
        ),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
        ("void at::native::index_elementwise_kernel_unknown", "elementwise"),
        ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float>", "other"),
    ],
)
def test_kernels_are_told_apart_by_name(name, kind):
    assert kernel_kind(name) == kind


def test_busy_time_is_the_union_and_the_waits_are_placed_between_their_kernels():
    kernels = [
        (0, 10 * MS, "sm90_xmma_gemm_a"),
        (2 * MS, 4 * MS, "Memcpy HtoD (Pinned -> Device)"),  # overlaps the matmul: busy once, counted in its kind
        (10 * MS + 10_000, 12 * MS + 10_000, "triton_red_fused_1"),  # 10 µs after: a short gap, not a wait
        (20 * MS, 21 * MS, "pytorch_flash::flash_bwd_kernel"),  # 8 ms after: the host kept the GPU waiting
        (21 * MS, 22 * MS, "indexSelectLargeIndex"),
    ]
    timeline = device_timeline(kernels, top_gaps=1)
    assert timeline["busy_ms"] == 14
    assert timeline["span_ms"] == 22
    assert timeline["idle_gaps"] == 2
    assert timeline["idle_ms"] == 8
    assert (timeline["idle_long_gaps"], timeline["idle_long_ms"]) == (1, 7.99)
    assert timeline["by_kind_ms"] == {"matmul": 10.0, "copy": 2.0, "compiled": 2.0, "attention": 1.0, "other": 1.0}
    assert timeline["other_top"] == {"indexSelectLargeIndex": 1.0}
    assert timeline["longest_gaps"] == [
        {"ms": 7.99, "at_ms": 12.01, "after": "triton_red_fused_1", "before": "pytorch_flash::flash_bwd_kernel"}
    ]


def test_no_kernels_means_nothing_busy():
    assert device_timeline([])["busy_ms"] == 0
