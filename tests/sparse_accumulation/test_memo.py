"""The memo of host-side call plans: one build per key, a bounded size, unhashable keys never kept."""
from sparse_accumulation.kernels import memo


def test_a_plan_is_built_once_per_key_and_the_memo_stays_bounded():
    plans = memo.Memo(3)
    built = []

    def builder(key):
        def build():
            built.append(key)
            return [key]
        return build

    first = plans.get(("fwd", 1), builder(("fwd", 1)))
    assert plans.get(("fwd", 1), builder(("fwd", 1))) is first
    assert built == [("fwd", 1)]
    for n in range(10):
        assert plans.get(n, builder(n)) == [n]
        assert len(plans.plans) <= 3
    assert plans.get(9, builder(9)) == [9] and built.count(9) == 1


def test_unhashable_keys_build_every_time_and_are_not_kept():
    plans = memo.Memo(3)
    key = ("grad", [4, 5])  # a list stands for symbolic sizes while tracing
    first, second = plans.get(key, list), plans.get(key, list)
    assert first is not second
    assert plans.plans == {}
