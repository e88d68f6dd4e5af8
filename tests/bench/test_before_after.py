"""benchmarks/before_after.py reads the markdown tables both checkouts' benchmarks print: each numeric cell by its
table, row and column, the leading number of a cell like "7.1 (-34.9 … 17.0)", a repeated column name told apart by its count."""

from __future__ import annotations

from benchmarks.before_after import tables

PRINTOUT = """# header

### A. Per hooked call (ns)

| case | median ns | min–max ns |
|---|---:|---:|
| bare call | 59 | 58–61 |
| ours: sync timer | 541 | 528–560 |

Added cost: 482 ns.

### G. EngineCore step, µs per step

| batch | uninstrumented | added (95 % interval) | default set | added (95 % interval) |
|---:|---:|---:|---:|---:|
| 64 | 682.1 (656.4–965.8) | 38.3 (9.1 … 71.0) | 685.8 (668.9–968.2) | -7.1 (-34.9 … 17.0) |
"""


def test_every_numeric_cell_by_table_row_and_column():
    assert tables(PRINTOUT) == {
        ("A. Per hooked call (ns)", "bare call", "median ns"): 59.0,
        ("A. Per hooked call (ns)", "bare call", "min–max ns"): 58.0,
        ("A. Per hooked call (ns)", "ours: sync timer", "median ns"): 541.0,
        ("A. Per hooked call (ns)", "ours: sync timer", "min–max ns"): 528.0,
        ("G. EngineCore step, µs per step", "64", "uninstrumented"): 682.1,
        ("G. EngineCore step, µs per step", "64", "added (95 % interval)"): 38.3,
        ("G. EngineCore step, µs per step", "64", "default set"): 685.8,
        ("G. EngineCore step, µs per step", "64", "added (95 % interval) (2)"): -7.1,
    }
