"""Section G2 of ``tox -e bench-e2e`` (benchmarks/_callgrind.py): instructions counted by callgrind between marks
the program sets itself, so that the scheduler hooks' cost reads the same whatever else the machine does."""

import shutil
import textwrap

import pytest

from benchmarks import _callgrind


def test_dumps_are_read_in_numeric_order_and_paired_with_the_marks_that_end_them(tmp_path):
    for part, total in ((1, 500), (2, 7), (10, 30), (9, 20), (3, 11)):
        (tmp_path / f"cg.out.{part}").write_text(f"# callgrind format\nevents: Ir\nsummary: {total}\n\nfn=x\n")
    (tmp_path / "cg.out").write_text("summary: 99999\n")  # the final dump at exit: after the last mark
    (tmp_path / "cg.out.other").write_text("summary: 1\n")
    totals = _callgrind.segment_totals(str(tmp_path), "cg.out")
    assert totals == [{"Ir": n} for n in (500, 7, 11, 20, 30)]
    assert _callgrind.by_label([None, "a", "b", "a", None], totals) == {"a": ({"Ir": 7 + 20}, 2), "b": ({"Ir": 11}, 1)}


def test_simulated_events_are_read_by_name_and_give_callgrinds_cycle_estimate(tmp_path):
    (tmp_path / "cg.out.1").write_text(
        "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim\nsummary: 1000 300 200 5 20 10 1 2 3 150 7 20 3\n"
    )
    (events,) = _callgrind.segment_totals(str(tmp_path), "cg.out")
    assert events["Ir"] == 1000 and events["Bim"] == 3
    assert _callgrind.estimated_cycles(events) == 1000 + 10 * (5 + 20 + 10 + 7 + 3) + 100 * (1 + 2 + 3)


def test_marks_without_their_dumps_are_an_error_that_names_the_symbol():
    with pytest.raises(ValueError, match="os_getppid"):
        _callgrind.by_label(["a", "b"], [1])


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_real_callgrind_run_counts_the_same_work_the_same(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(
        textwrap.dedent(
            f"""
            import importlib.util
            spec = importlib.util.spec_from_file_location("_callgrind", {_callgrind.__file__!r})
            _callgrind = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(_callgrind)

            def work(n):
                total = 0
                for i in range(n):
                    total = (total + i) & 1023  # small ints: the same work per iteration
                return total

            _callgrind.mark(None)
            for label, n in (("1000", 1000), ("3000", 3000), ("1000", 1000)):
                work(n)
                _callgrind.mark(label)
            _callgrind.save()
            """
        )
    )
    first, second = _callgrind.run([str(child)]), _callgrind.run([str(child)])
    assert first == second  # same code, same inputs, same count
    (once, segments), (thrice, _) = first["1000"], first["3000"]
    assert segments == 2
    assert (
        2.9 < thrice["Ir"] / (once["Ir"] / 2) < 3.1
    )  # the loop is the segment: three times the work, three times the count
