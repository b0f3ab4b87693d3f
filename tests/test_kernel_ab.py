"""The kernels' A/B comparison (rakv.bench.kernel_ab, scripts/ab_kernels.py): its cases, the module-local copies two
builds load as, and the comparison's bit-for-bit verdict. Compiling two builds takes minutes, so the comparison runs
here on the one native build, and on a build whose outputs differ."""

import pytest
import torch

from rakv.bench.kernel_ab import SOURCE, AttentionCase, attention_case, compare, gemm_case, module_local, source_at
from rakv.runtime.kernels import compact_of, native
from rakv.runtime.paths import ROOT


def test_attention_cases_parse_and_bad_ones_are_refused():
    assert AttentionCase.parse("16:256") == AttentionCase(16, 256, 1)
    assert AttentionCase.parse("1:256:5") == AttentionCase(1, 256, 5)
    for bad in ("16", "0:256", "1:256:0", "a:b", "1:2:3:4"):
        with pytest.raises(ValueError):
            AttentionCase.parse(bad)


def test_every_python_class_of_the_kernels_is_made_module_local():
    source = (ROOT / SOURCE).read_text()
    patched = module_local(source)
    assert source.count("py::class_<") >= 3
    assert patched.count("py::module_local()") == source.count("py::module_local()") + source.count("py::class_<")
    assert module_local(patched) == patched  # a copy already patched is left as it is


def test_the_base_source_comes_from_git_and_an_unknown_revision_is_refused():
    assert "attention" in source_at("HEAD")
    with pytest.raises(ValueError, match="no src/rakv/runtime/kernels.cpp at revision"):
        source_at("no-such-revision-anywhere")


class _Perturbed:
    """A 'build' whose attention output differs from the native one's in one element."""

    def attention(self, *args):
        out = native().attention(*args)
        out.view(-1)[0] += 1.0
        return out


def test_compare_times_each_build_and_says_whether_their_outputs_are_the_same_bits(tiny_pair):
    target = compact_of(tiny_pair.target.module)
    case = AttentionCase(2, 20, 3)
    attend = attention_case(case, len(target.blocks), target.heads, target.kv_heads, target.head_dim)
    cases = {"gemm": gemm_case(target.projections(), 3), case.label(): attend}
    with torch.inference_mode():
        same = compare({"base": native(), "new": native()}, cases, repeats=2)
        different = compare({"base": native(), "new": _Perturbed()}, {case.label(): attend}, repeats=2)
    assert [row.case for row in same] == ["gemm", case.label()]
    assert all(row.bitwise_equal for row in same)
    assert all(row.over_first["base"] == 1.0 and row.ms["new"] > 0 for row in same)  # keyed by the builds' names
    assert not different[0].bitwise_equal
    assert all(row.max_relative_difference == 0.0 for row in same)
    assert 0.0 < different[0].max_relative_difference < float("inf")
