"""CoefficientTable: build, save/load round trip, corrupt files, shipped tables."""
import zipfile

import numpy as np
import pytest

import cg
from cg.tables import DATA_DIR, FORMAT_VERSION
from cg_test_helpers import fresh_rng


def assert_tables_equal(a, b):
    assert a.basis == b.basis and a.lmax == b.lmax and len(a) == len(b)
    assert list(a) == list(b)
    for key in a:
        for x, y in zip(a.rule(*key), b.rule(*key)):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


def test_build_contents_and_mapping_protocol():
    calls = []
    table = cg.CoefficientTable.build(3, basis="complex", progress=lambda d, t: calls.append((d, t)))
    expected = [(a, b, L) for a in range(4) for b in range(4) for L in range(abs(a - b), min(a + b, 3) + 1)]
    assert list(table) == expected and len(table) == len(expected) == 34
    assert table.lmax == 3 and table.basis == "complex"
    assert (1, 1, 2) in table and (2, 2, 4) not in table and (1, 1, 3) not in table
    assert "x" not in table and (1, 1) not in table and "112" not in table and (1.0, 1, 2) not in table
    assert (np.int64(1), 1, np.int32(2)) in table
    assert calls[0] == (0, 34) and calls[-1] == (34, 34) and len(calls) == 35
    for key in table:
        for got, ref in zip(table.rule(*key), cg.transformation_rule(*key, basis="complex")):
            np.testing.assert_array_equal(got, ref)
    with pytest.raises(ValueError):  # read-only arrays
        table.rule(1, 1, 1)[3][0] = 1.0


@pytest.mark.parametrize("basis", ["real", "complex", "e3nn"])
def test_save_load_round_trip(tmp_path, basis):
    table = cg.CoefficientTable.build(4, basis=basis)
    path = tmp_path / "t.npz"
    table.save(path)
    assert_tables_equal(cg.CoefficientTable.load(path), table)
    assert_tables_equal(cg.CoefficientTable.load(str(path), basis=basis), table)


def test_save_appends_npz_suffix_like_numpy(tmp_path):
    table = cg.CoefficientTable.build(1)
    table.save(tmp_path / "plain")
    assert_tables_equal(cg.CoefficientTable.load(tmp_path / "plain.npz"), table)


def test_load_wrong_basis(tmp_path):
    path = tmp_path / "t.npz"
    cg.CoefficientTable.build(2, basis="e3nn").save(path)
    with pytest.raises(ValueError, match=r"holds a 'e3nn' table, but basis='real' was requested"):
        cg.CoefficientTable.load(path, basis="real")


def _rewrite(src, dst, **changes):
    with np.load(src) as data:
        arrays = {k: data[k] for k in data.files}
    for k, v in changes.items():
        if v is None:
            del arrays[k]
        else:
            arrays[k] = v
    np.savez(dst, **arrays)


def test_load_wrong_version(tmp_path):
    good = tmp_path / "good.npz"
    cg.CoefficientTable.build(2).save(good)
    bad = tmp_path / "bad.npz"
    _rewrite(good, bad, format_version=np.array(FORMAT_VERSION + 1))
    with pytest.raises(ValueError, match=f"format version {FORMAT_VERSION + 1}"):
        cg.CoefficientTable.load(bad)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"C": None}, "missing entries C"),
        ({"keys": None, "offsets": None}, "missing entries keys, offsets"),
        ({"basis": np.array("polar")}, "unknown basis"),
        ({"lmax": np.array(3)}, "keys do not match lmax"),
        ({"offsets": np.zeros(3, dtype=np.int64)}, "inconsistent rule arrays"),
        ({"m1": np.full(1, 7, dtype=np.int16)}, "inconsistent rule arrays"),
    ],
)
def test_load_malformed_npz(tmp_path, change, match):
    good = tmp_path / "good.npz"
    cg.CoefficientTable.build(2).save(good)
    bad = tmp_path / "bad.npz"
    _rewrite(good, bad, **change)
    with pytest.raises(ValueError, match=match):
        cg.CoefficientTable.load(bad)


def test_load_out_of_range_index(tmp_path):
    good = tmp_path / "good.npz"
    cg.CoefficientTable.build(2).save(good)
    with np.load(good) as data:
        mu = data["mu"].copy()
    mu[0] = 99
    bad = tmp_path / "bad.npz"
    _rewrite(good, bad, mu=mu)
    with pytest.raises(ValueError, match="index out of range"):
        cg.CoefficientTable.load(bad)


def test_load_random_bytes_and_other_files(tmp_path):
    rng, seed = fresh_rng()
    junk = tmp_path / "junk.npz"
    junk.write_bytes(rng.bytes(4096))
    with pytest.raises(ValueError, match="not a valid coefficient table"):
        cg.CoefficientTable.load(junk)
    truncated = tmp_path / "trunc.npz"
    cg.CoefficientTable.build(2).save(tmp_path / "full.npz")
    truncated.write_bytes((tmp_path / "full.npz").read_bytes()[:300])
    with pytest.raises(ValueError, match="not a valid coefficient table"):
        cg.CoefficientTable.load(truncated)
    npy = tmp_path / "single.npy"
    np.save(npy, np.arange(3))
    with pytest.raises(ValueError, match="not an .npz archive"):
        cg.CoefficientTable.load(npy)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, basis=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="not a valid coefficient table"):
        cg.CoefficientTable.load(pickled)
    empty_zip = tmp_path / "empty.npz"
    zipfile.ZipFile(empty_zip, "w").close()
    with pytest.raises(ValueError, match="missing entries"):
        cg.CoefficientTable.load(empty_zip)
    with pytest.raises(FileNotFoundError):
        cg.CoefficientTable.load(tmp_path / "nope.npz")


@pytest.mark.parametrize("basis", ["real", "complex", "e3nn"])
def test_shipped_tables_equal_fresh(basis):
    path = DATA_DIR / f"{basis}_lmax8.npz"
    assert path.exists() and path.stat().st_size < 2 * 1024 * 1024
    stored = cg.CoefficientTable.load(path, basis=basis)
    assert stored.lmax == 8
    assert_tables_equal(stored, cg.CoefficientTable.build(8, basis=basis))
    assert_tables_equal(cg.load_precomputed(basis, 8), stored)


def test_load_precomputed_truncates_and_builds():
    small = cg.load_precomputed("real", 3)
    assert_tables_equal(small, cg.CoefficientTable.build(3, basis="real"))
    default = cg.load_precomputed()
    assert default.lmax == 8 and default.basis == "real"
    big = cg.load_precomputed("complex", 9)
    assert big.lmax == 9 and (9, 9, 0) in big
    np.testing.assert_array_equal(big.rule(9, 8, 2)[3], cg.transformation_rule(9, 8, 2, basis="complex")[3])
