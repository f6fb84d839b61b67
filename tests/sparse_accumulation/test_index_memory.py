"""The memory of prepared indices (``sparse_accumulation.indices``): views taken afresh find what the first call
made, entries go with their tensors, and an edit in place or another view is never taken for the same values."""
import gc
import threading

import torch

import sparse_accumulation as sa
from sparse_accumulation import indices


def _summaries(monkeypatch):
    """Count the reads of index values (``indices._summary``, one host transfer each on a GPU)."""
    calls = []
    real = indices._summary
    monkeypatch.setattr(indices, "_summary", lambda t: calls.append(t.shape[0]) or real(t))
    return calls


def test_views_taken_afresh_read_the_values_once(monkeypatch, generator):
    calls = _summaries(monkeypatch)
    edge_index = torch.randint(0, 7, (2, 30), generator=generator)
    first = indices.prepared_index("senders", edge_index[0], 7)
    again = indices.prepared_index("senders", edge_index[0], 7)  # a new view object of the same row
    assert calls == [30]
    assert torch.equal(again.tensor, edge_index[0]) and again.sorted == first.sorted
    assert again.segments() is first.segments()  # made once, shared
    receivers = indices.prepared_index("receivers", edge_index[1], 7)  # the other row: other values
    assert calls == [30, 30] and torch.equal(receivers.tensor, edge_index[1])
    edge_index[1, 0] = (edge_index[1, 0] + 1) % 7  # an edit in place: read again
    indices.prepared_index("receivers", edge_index[1], 7)
    assert calls == [30, 30, 30]


def test_an_out_of_range_view_is_refused_on_every_call(generator):
    edge_index = torch.randint(0, 5, (2, 12), generator=generator)
    edge_index[1, 3] = 5
    for _ in range(2):
        try:
            indices.prepared_index("indices_out", edge_index[1], 5)
        except IndexError as error:
            assert "indices_out contains row 5" in str(error)
        else:
            raise AssertionError("an index out of range was accepted")


def test_entries_go_with_their_tensors():
    memory = indices._prepared_indices
    before = len(memory)
    edge_index = torch.randint(0, 9, (2, 40))
    indices.prepared_index("senders", edge_index[0], 9).segments()
    indices.prepared_index("receivers", edge_index[1], 9).segments()
    assert len(memory) == before + 2
    del edge_index
    gc.collect()
    assert len(memory) == before


def test_evicting_entries_whose_tensors_die_does_not_deadlock():
    """Eviction frees a value that holds the last reference to its own tensor (as a Rule or Elements may); the
    tensor's weak-reference callback then runs inside the memory's lock and takes it again."""
    memory = indices.Memory(1)

    def fill():
        for _ in range(5):
            t = torch.arange(4)
            memory.get((t,), (), lambda t=t: [t])
            del t  # only the entry's value holds it now: the next eviction frees it

    worker = threading.Thread(target=fill, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the memory deadlocked"
    assert len(memory) <= 1


def test_graph_calls_on_fresh_views_equal_the_reference(generator):
    """Message passing called twice with ``edge_index[0]`` / ``edge_index[1]`` taken afresh each time (as MACE's
    blocks do) gives the same values as the first call and as a brute-force sum."""
    nodes, edges = 6, 25
    m1, m2, mu, C = sa.get_cg_transformation_rule(1, 1, 1, dtype=torch.float64)
    rule = sa.Rule(m1, m2, mu, 3)
    edge_index = torch.randint(0, nodes, (2, edges), generator=generator)
    x = torch.randn(nodes, 2, 3, generator=generator, dtype=torch.float64)
    y = torch.randn(edges, 2, 3, generator=generator, dtype=torch.float64)
    expected = torch.zeros(nodes, 2, 3, dtype=torch.float64)
    for e in range(edges):
        for k in range(len(C)):
            expected[edge_index[1, e], :, mu[k]] += x[edge_index[0, e], :, m1[k]] * y[e, :, m2[k]] * C[k]
    for _ in range(2):
        got = sa.accumulate_rule(x, y, rule, C, indices_1=edge_index[0], indices_out=edge_index[1], size_out=nodes)
        assert torch.allclose(got, expected, rtol=0, atol=1e-12)


def _sorts(monkeypatch):
    """Simulate a CUDA graph capture of every tensor (``indices.capturing``) and count the edge sorts."""
    calls = []
    real = indices.segments
    monkeypatch.setattr(indices, "capturing", lambda t: True)
    monkeypatch.setattr(indices, "segments", lambda t, size: calls.append(t.shape[0]) or real(t, size))
    return calls


def test_a_capture_scope_shares_what_one_capture_makes_and_nothing_outlives_it(monkeypatch, generator):
    sorts = _sorts(monkeypatch)
    edge_index = torch.randint(0, 7, (2, 40), generator=generator)
    kept_before = set(indices._prepared_indices._entries)  # (what earlier tests left, their tensors still alive)

    def prepared(row=1):
        found = indices.prepared_index("edge_index", edge_index[row], 7)
        found.segments()
        return found

    assert prepared() is not prepared() and len(sorts) == 2  # a capture outside a scope: made on every use
    with indices.capture_scope():
        first = prepared()
        assert prepared() is first and len(sorts) == 3  # views taken afresh find it within the scope
        assert prepared(0) is not first and len(sorts) == 4
        with indices.unremembered():  # op bodies that compiled graphs call remember nothing
            assert prepared() is not first and len(sorts) == 5
        edge_index[1, 0] = (edge_index[1, 0] + 1) % 7  # a change in place makes a new entry
        changed = prepared()
        assert changed is not first and len(sorts) == 6
        offsets, order = changed.segments()
        values = edge_index[1][order]
        assert torch.equal(offsets, torch.searchsorted(values, torch.arange(8)))  # the changed values, sorted
    with indices.capture_scope():  # a later capture records its own work
        assert prepared() is not changed and len(sorts) == 7
    assert set(indices._prepared_indices._entries) <= kept_before  # nothing went into the memory of eager calls


def test_segments_sort_every_row_stably_and_leave_values_out_of_range_in_no_row(generator):
    """Keys sorted as int32 (clamped first): values below 0, at or above the size, and beyond int32's range lie
    in no row; every row's edges in their original order (a loop over the values)."""
    size = 11
    index = torch.randint(-3, size + 3, (300,), generator=generator)
    index[::37] = 2**40 + 5  # would wrap into a row if cast without the clamp
    index[5::41] = -(2**40)
    offsets, order = indices.segments(index, size)
    assert offsets.dtype == order.dtype == torch.int64
    for row in range(size):
        expected = [e for e in range(index.shape[0]) if index[e] == row]
        assert order[offsets[row]:offsets[row + 1]].tolist() == expected
    elements = torch.randint(0, 5, (40,), generator=generator)
    element_order, starts = indices.element_segments(elements, 5)
    for e in range(5):
        assert element_order[starts[e]:starts[e + 1]].tolist() == (elements == e).nonzero().flatten().tolist()
