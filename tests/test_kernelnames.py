"""Kernel names shown short (fleet/kernelnames.py): a table over the names the real nsys 2025.3
and ncu 2025.3 wrote on an H200 (tests/fixtures), up to 1,400 characters of PyTorch templates and
lambdas, and over the shapes a name can take that those runs did not have: operators, anonymous
namespaces as c++filt writes them, and names that are not C++ at all."""

from __future__ import annotations

import csv
from collections import Counter

import pytest

from fleet.kernelnames import ELLIPSIS, WIDTH, base_name, short_name, short_names, tag
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures"


def recorded_names() -> list[str]:
    """Every kernel name in the recorded summaries: nsys's kernel sums and ncu's raw page."""
    files = sorted(FIXTURES.glob("**/*cuda_gpu_kern_sum.csv")) + [FIXTURES / "ncu-raw-h200.csv"]
    names = {}
    for path in files:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                name = row.get("Name") or row.get("Kernel Name")
                if name and name != "Kernel Name":  # ncu's second row holds the units
                    names[name] = None
    return list(names)


def recorded(start: str, length: int | None = None) -> str:
    """The one recorded name that begins with ``start`` (and is ``length`` long)."""
    [name] = [n for n in recorded_names() if n.startswith(start) and (length is None or len(n) == length)]
    return name


# (full name: recorded, or how it begins and how long it is; its short name)
RECORDED = [
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)",
     "cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(T1::Params)",
     "cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>"),
    # short enough: only the return type and the parameters go, templates and casts stay
    ("void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, const T1 *, "
     "const T1 *, const T1 *, T2 *, T2 *, T1 *)",
     "at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>"),
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, "
     "std::array<char *, (unsigned long)1>>(int, T2, T3)",
     "at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, 1>>"),
    # longer: casts go, then the namespaces inside the brackets, then the deepest brackets empty
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
     "std::array<char *, (unsigned long)3>>(int, T2, T3)",
     "at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, array<char *, 3>>"),
    (("void at::native::reduce_kernel<(int)512", 167),
     "at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps<…>, unsigned int, float, 4, 4>>"),
    (("void at::native::reduce_kernel<(int)128", 271),  # a lambda in an operator () in a template
     "at::native::reduce_kernel<128, 4, ReduceOp<float, func_wrapper_t<…>, unsigned int, float, 4, 4>>"),
    (("void at::native::vectorized_elementwise_kernel<(int)4, at::native::GeluCUDAKernelImpl", None),
     "at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl(…)::[lambda], array<…>>"),
    (("void at::native::vectorized_elementwise_kernel<(int)4, at::native::GeluBackwardCUDAKernelImpl", None),
     "at::native::vectorized_elementwise_kernel<4, GeluBackwardCUDAKernelImpl(…)::[lambda], array<…>>"),
    (("void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast", None),
     "at::native::elementwise_kernel<128, 2, gpu_kernel_impl_nocast<…>(…)::[lambda]>"),
    (("void at::native::<unnamed>::GammaBetaBackwardCUDAKernelTemplate", None),
     "at::native::<unnamed>::GammaBetaBackwardCUDAKernelTemplate<float, float, 32, 32, 256, false, true…>"),
    # 1,386 and 1,397 characters: cut, their brackets closed; normal and uniform still apart
    (("void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel", 1386),
     "at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, normal_and_transform…>"),
    (("void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel", 1397),
     "at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, uniform_and_transform…>"),
    # ncu writes the same kernel as "4", not "(int)4", and in other namespaces
    (("void at::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, ", 1240),
     "at::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, normal_and_transform<…>(…)…>"),
    # not C++: cuBLAS's own names, kept, and bounded
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_"
     "kernel__5x_cublas",
     "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_e…"),
]

OTHER = [
    # operators: their symbols are not brackets
    ("bool operator<(const A &, const B &)", "operator<"),
    ("void k<&Less::operator<, 3>(int)", "k<&Less::operator<, 3>"),
    ("void Functor::operator()(int) const", "Functor::operator()"),
    ("void *operator new[](unsigned long)", "operator new[]"),
    ("void Stream::operator<<<float>(const float &)", "Stream::operator<<<float>"),
    # c++filt's anonymous namespace is not a parameter list
    ("void (anonymous namespace)::scale<float>(float *, int)", "(anonymous namespace)::scale<float>"),
    ("(anonymous namespace)::fill", "(anonymous namespace)::fill"),
    ("unsigned int count<(unsigned long)3>(int)", "count<(unsigned long)3>"),
    # not C++ at all: as they are
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0"),
    ("_Z6kernelPfi", "_Z6kernelPfi"),  # a name nsys could not demangle
    ("my kernel (fast)", "my kernel (fast)"),  # words in brackets after a space: no parameter list
    ("kernel<int(", "kernel<int("),  # cut short: brackets that do not pair up
    ("  padded_kernel  ", "padded_kernel"),
    ("", ""),
]


def full(name) -> str:
    return name if isinstance(name, str) else recorded(*name)


@pytest.mark.parametrize("name,short", RECORDED + OTHER, ids=lambda v: (v if isinstance(v, str) else v[0])[:50])
def test_short_names(name, short):
    name = full(name)
    assert short_name(name) == short
    assert len(short) <= WIDTH


def test_every_recorded_name_is_short_unique_and_of_the_name_itself():
    names = recorded_names()
    assert len(names) >= 20 and max(map(len, names)) > 1_300  # the fixtures hold what the issue saw
    shown = short_names(names)
    assert len(set(shown.values())) == len(names)  # no two alike
    # tagged only where two short forms collide: two cuBLAS GEMMs of tests/fixtures/summaries-h200
    # differ only after 95 characters (..._execute_kernel__5x_cublas, ..._execute_split_k_kernel__5x_cublas)
    untagged = Counter(short_name(n) for n in names)
    for name, short in shown.items():
        assert len(short) <= WIDTH and not short.startswith("void ")
        assert ("#" in short) == (untagged[short_name(name)] > 1), short
        core = short.split(" #")[0].split("<")[0].rstrip("…")
        assert core in name  # the kernel's own qualified name, never something made up
    assert all(short_name(n) == short_name(n) for n in names)  # pure


def test_the_base_name_keeps_templates_whatever_their_length():
    name = recorded("void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel", 1397)
    base = base_name(name)
    assert name == "void " + base + "(long, at::PhiloxCudaState, T3, T4)"


def test_names_whose_short_names_collide_carry_a_tag_of_their_full_name():
    overloads = ["void scale(float *, int)", "void scale(double *, int)"]
    shown = short_names(overloads + ["void other(int)"])
    assert shown["void other(int)"] == "other"
    assert {shown[n] for n in overloads} == {f"scale #{tag(n)}" for n in overloads}
    # two 1,400-character names alike in their first 100: tagged, and still within the width
    a = recorded("void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel", 1386)
    b = a.replace("(instance 1)]>(long", "(instance 3)]>(long")
    assert a != b and short_name(a) == short_name(b)
    tagged = short_names([a, b])
    assert len(set(tagged.values())) == 2 and all(len(s) <= WIDTH for s in tagged.values())
    assert tagged[a].endswith(f" #{tag(a)}") and tagged[a] == short_names([b, a])[a]  # stable


def test_a_hostile_name_is_shortened_in_bounded_time():
    import time

    deep = "void k" + "<a" * 20_000 + ">" * 20_000 + "(int)"
    wide = "void k<" + ", ".join(f"T{i}" for i in range(50_000)) + ">(int)"
    started = time.monotonic()
    assert short_name(deep) == "k" + "<a" * 15 + "<…" + ">" * 16  # 16 levels, the deeper ones emptied at once
    assert short_name(wide).startswith("k<T0, T1, ") and short_name(wide).endswith("…>")
    assert len(short_name(wide)) <= WIDTH
    assert short_name("\x1b]0;x\x07" * 10_000).endswith(ELLIPSIS)  # not C++: cut (the terminal replaces controls)
    # A bound on a hang (a name read in quadratic or worse time takes minutes here), not a timing: the suite's
    # workers share two cores, and a second on a loaded machine says nothing.
    assert time.monotonic() - started < 60
