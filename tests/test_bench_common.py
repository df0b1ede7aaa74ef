"""bench.common's operand rotation, host side: how many operand sets a shape gets (enough to move 4x
the L2 per pass, at most 32; one when warm), that each set is a fresh make(), and that rotated_ms
reports the time of one call (one call per set in each timed pass); output_of poisons the output
before the call it records. The GPU timings themselves come from bench/ runs (docs/perf.md)."""

import torch

from bench import common as C

L2 = 50 << 20


class _Props:
    L2_cache_size = L2


def _maker(nbytes, made):
    def make():
        t = torch.empty(nbytes, dtype=torch.uint8)
        made.append(t)
        return t, nbytes  # a non-tensor member is not counted
    return make


def test_operand_sets_move_four_l2s_per_pass(monkeypatch):
    monkeypatch.setattr(C.torch.cuda, "get_device_properties", lambda index: _Props())
    monkeypatch.setattr(C.torch.cuda, "current_device", lambda: 0)
    made = []
    sets = C.operand_sets(_maker(15 << 20, made))
    assert len(sets) == 14 == -(-4 * L2 // (15 << 20))  # 14 x 15 MiB >= 200 MiB > 13 x 15 MiB
    # fresh sets, in order
    assert [id(s[0]) for s in sets] == [id(t) for t in made] and len({t.data_ptr() for t in made}) == 14
    assert len(C.operand_sets(_maker(300 << 20, []))) == 1  # larger than 4 L2s: one set
    assert len(C.operand_sets(_maker(4 * L2, []))) == 1
    assert len(C.operand_sets(_maker(4 * L2 - 1, []))) == 2
    assert len(C.operand_sets(_maker(1 << 10, []))) == 32  # at most `most`
    assert len(C.operand_sets(_maker(1 << 10, []), most=5)) == 5
    made = []
    assert len(C.operand_sets(_maker(15 << 20, made), cold=False)) == 1 and len(made) == 1  # warm: one make()


def test_rotated_ms_is_per_call(monkeypatch):
    passes = []

    def graph_ms(fn, rep=100):
        fn()  # one timed pass
        passes.append(rep)
        return 6.0

    monkeypatch.setattr(C, "graph_ms", graph_ms)
    calls = []
    assert C.rotated_ms(lambda i, tag: calls.append((i, tag)), [(0, "a"), (1, "b"), (2, "c")], rep=7) == 2.0
    assert calls == [(0, "a"), (1, "b"), (2, "c")] and passes == [7]


def test_output_of_poisons_out_first_and_returns_a_copy():
    """What the call leaves unwritten is NaN, not the values out held before (a reference's)."""
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(7))
    out = x.clone()

    def half(x, out):
        out[:2] = x[:2] * 2

    got = C.output_of(half, (x, out), out)
    assert torch.equal(got[:2], x[:2] * 2) and bool(torch.isnan(got[2:]).all())
    out.zero_()
    assert bool(torch.isnan(got[2:]).all())  # a copy: later writes to out do not reach it


def test_rel_l2_is_the_float64_relative_distance():
    """bench.common.rel_l2: ||out - ref|| / ||ref|| in float64 (bf16 inputs included); 0 for equal tensors."""
    ref = torch.tensor([3.0, 4.0], dtype=torch.bfloat16)
    assert C.rel_l2(ref, ref) == 0.0
    assert C.rel_l2(torch.tensor([3.0, 5.0], dtype=torch.bfloat16), ref) == 0.2
    assert C.rel_l2(2 * ref, ref) == 1.0
