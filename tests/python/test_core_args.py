"""Integer and dict arguments of the bindings: any Python int is read, and
one that does not fit the C++ parameter (int: 32 bits, int64_t) is a
tilejit.Error naming the argument, the value and the range, never
pybind11's "incompatible function arguments" TypeError (which printed
every argument's repr: 3.3 KB for flash_attn_varlen) or its "Unable to cast
Python instance" RuntimeError."""

import numpy as np
import pytest
import torch

import tilejit
from conftest import bf16

I32 = "an int from -2147483648 to 2147483647"
I64 = "an int from -9223372036854775808 to 9223372036854775807"


def _int4_checkpoint():
    # GPTQ, per channel (group_size=-1): K = 8 * 8 = 64, N = 16.
    return np.zeros((8, 16), np.int32), np.ones((1, 16), np.float16)


def _calls():
    """(name, the call with the argument set to v) for every integer
    parameter of the bindings, each otherwise valid."""
    x = bf16((2, 64), 1)
    pw = tilejit.pack_weight(bf16((16, 64), 2))
    q, k = bf16((4, 2, 64), 3), bf16((4, 1, 64), 4)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    kc = bf16((2, 4, 1, 64), 5)
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    sl = torch.tensor([5], dtype=torch.int32)
    logits = torch.randn(3, 8)
    tw, ti = torch.empty(3, 2), torch.empty(3, 2, dtype=torch.int32)
    qw, sc = _int4_checkpoint()
    f8 = np.zeros((16, 64), np.uint8)
    mx_blocks, mx_scales = np.zeros((16, 2, 16), np.uint8), np.full((16, 2), 127, np.uint8)
    e13 = tilejit.pack_experts(bf16((2, 32, 64), 6), "gate_up")
    e2 = tilejit.pack_experts(bf16((2, 64, 16), 7), "down")
    hidden = bf16((3, 64), 8)
    ids = torch.tensor([[0, 1]] * 3, dtype=torch.int32)
    rq, cache = bf16((3, 2, 64), 9), torch.randn(16, 64)
    pos = torch.tensor([0, 1, 2])
    return [
        ("act_zero_point", I32, lambda v: tilejit.gemm(x, pw, act_zero_point=v)),
        ("window_left", I32, lambda v: tilejit.flash_attn_varlen(q, k, k, cu, cu, window_left=v)),
        ("window_right", I32,
         lambda v: tilejit.decode_attention(q[:1], kc, kc, bt, sl, window_right=v)),
        ("window_left", I32, lambda v: tilejit.extend_attention(
            q[:1], kc, kc, torch.tensor([0, 1], dtype=torch.int32), bt, sl - 1, window_left=v)),
        ("rotary_dim", I64, lambda v: tilejit.rope(rq, None, pos, cache, rotary_dim=v)),
        ("ndim", I32, lambda v: tilejit.rope(rq, None, pos, cache, ndim=v)),
        ("mrope_section[1]", I64,
         lambda v: tilejit.rope(rq, None, pos.expand(2, 3), cache, mrope_section=[16, v])),
        ("group_size", I64, lambda v: tilejit.pack_int4(qw, sc, group_size=v)),
        ("n", I64, lambda v: tilejit.pack_int4(qw, sc, group_size=-1, n=v)),
        ("k", I64, lambda v: tilejit.pack_int4(qw, sc, group_size=-1, k=v)),
        ("block_n", I64, lambda v: tilejit.pack_fp8(f8, np.ones(1, np.float32), block_n=v)),
        ("block_k", I64, lambda v: tilejit.pack_fp8(f8, np.ones(1, np.float32), block_k=v)),
        ("k", I64, lambda v: tilejit.pack_mxfp4(mx_blocks, mx_scales, k=v)),
        ("block_n", I64, lambda v: tilejit.pack_experts_fp8([(f8, np.ones(1, np.float32))],
                                                            block_n=v, proj="down")),
        ("group_size", I64,
         lambda v: tilejit.pack_experts_int4([{"qweight": qw, "scales": sc}], group_size=v)),
        ("k", I64, lambda v: tilejit.pack_experts_mxfp4([(mx_blocks, mx_scales)], k=v)),
        ("act_zero_point13", I32,
         lambda v: tilejit.fused_experts(hidden, e13, e2, tw, ids, act_zero_point13=v)),
        ("act_zero_point2", I32,
         lambda v: tilejit.fused_experts(hidden, e13, e2, tw, ids, act_zero_point2=v)),
        ("num_expert_group", I32,
         lambda v: tilejit.grouped_topk(logits, tw, ti, num_expert_group=v)),
        ("topk_group", I32, lambda v: tilejit.grouped_topk(logits, tw, ti, topk_group=v)),
        ("n", I32, lambda v: tilejit.set_num_threads(v)),
        ("Buffer: shape[1]", I64, lambda v: tilejit.Buffer([2, v])),
    ]


@pytest.mark.parametrize("i", range(len(_calls())))
def test_an_int_out_of_the_cpp_range_names_argument_value_and_range(i):
    name, allowed, call = _calls()[i]
    big = 2**40 if allowed == I32 else 2**70
    with pytest.raises(tilejit.Error) as e:
        call(big)
    assert str(e.value) == f"{name}: {big} is out of range; allowed: {allowed}"
    with pytest.raises(tilejit.Error) as e:
        call(-big)
    assert str(e.value) == f"{name}: {-big} is out of range; allowed: {allowed}"
    # A float is not an int (as pybind11 had it), named with its value.
    with pytest.raises(tilejit.Error) as e:
        call(1.5)
    assert str(e.value) == f"{name}: expected an int, got float 1.5; allowed: {allowed}"


def test_int_arguments_take_any_python_integer():
    # numpy and 0-d torch integers (__index__), as pybind11 took them.
    x, pw = bf16((2, 64), 1), tilejit.pack_weight(bf16((16, 64), 2))
    ref = tilejit.gemm(x, pw, act_zero_point=128)
    for v in (np.int64(128), np.uint8(128), torch.tensor(128)):
        assert torch.equal(tilejit.gemm(x, pw, act_zero_point=v), ref)
    assert tilejit.Buffer((np.int32(2), 3)).shape == (2, 3)
    assert tilejit.Buffer(np.array([2, 3])).shape == tilejit.Buffer(range(2, 4)).shape == (2, 3)
    with pytest.raises(tilejit.Error, match=r"^Buffer: shape: expected a list of ints, got str"):
        tilejit.Buffer("23")
    # An int too long to print (Python refuses str() past 4300 digits).
    with pytest.raises(tilejit.Error, match=r"^n: an int of 100001 bits is out of range"):
        tilejit.set_num_threads(2**100000)
    with pytest.raises(tilejit.Error, match=r"^n: expected an int, got str; allowed"):
        tilejit.set_num_threads("2")


def test_an_int4_expert_dict_names_its_fields():
    qw, sc = _int4_checkpoint()

    def pack(**fields):
        return tilejit.pack_experts_int4([{"qweight": qw, "scales": sc},
                                          dict({"qweight": qw, "scales": sc}, **fields)],
                                         group_size=-1, proj="down")

    with pytest.raises(tilejit.Error) as e:
        pack(n="x")
    assert str(e.value) == f"w[1]['n']: expected an int, got str; allowed: {I64}"
    with pytest.raises(tilejit.Error) as e:
        pack(k=2**64)
    assert str(e.value) == f"w[1]['k']: 18446744073709551616 is out of range; allowed: {I64}"
    with pytest.raises(tilejit.Error) as e:
        pack(zeros=None)
    assert str(e.value) == ("w[1]: key 'zeros' is not allowed; allowed: qweight, scales, "
                            "qzeros, g_idx, n, k")
    with pytest.raises(tilejit.Error) as e:
        tilejit.pack_experts_int4([{"qweight": qw}], group_size=-1, proj="down")
    assert str(e.value) == "w[0]: key 'scales' is missing; required: qweight, scales"
    with pytest.raises(tilejit.Error) as e:
        tilejit.pack_experts_int4([(qw, sc)], group_size=-1, proj="down")
    assert str(e.value) == ("w[0]: expected a dict with qweight, scales and optional qzeros, "
                            "g_idx, n, k; got tuple")
    with pytest.raises(tilejit.Error, match=r"^w\[1\]\['scales'\]: DLPack dtype \(code 2, 64 bits"):
        pack(scales=np.ones((1, 16)))
    # n and k given as the checkpoint's: accepted (numpy ints too).
    assert pack(n=np.int64(16), k=64).n == 16
