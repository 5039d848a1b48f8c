"""tests/conftest.py's order for `make test`'s two test processes (pytest-xdist, --dist loadfile):
the files with the most slow tests are handed out first."""

from __future__ import annotations

from .conftest import slow_files_first


def test_the_files_with_most_slow_tests_go_first_and_each_keeps_its_order():
    nodeids = ["tests/test_a.py::one", "tests/test_b.py::slow1", "tests/test_b.py::quick",
               "tests/test_c.py::slow1", "tests/test_c.py::slow2", "tests/test_a.py::two"]
    slow = {"tests/test_b.py::slow1", "tests/test_c.py::slow1", "tests/test_c.py::slow2"}

    assert slow_files_first(nodeids, slow) == [
        "tests/test_c.py::slow1", "tests/test_c.py::slow2", "tests/test_b.py::slow1", "tests/test_b.py::quick",
        "tests/test_a.py::one", "tests/test_a.py::two"]


def test_without_slow_tests_the_order_is_kept():
    nodeids = ["tests/test_b.py::x", "tests/test_a.py::y", "tests/test_b.py::z"]

    assert slow_files_first(nodeids, set()) == nodeids
