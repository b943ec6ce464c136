"""wafer.artifact_writer: artifacts written on a thread once a step is dispatched, in the
order they were queued, with a writer's failure raised once by the next wait."""
import threading

import pytest

from wafer import artifact_writer


def test_writers_run_on_a_thread_in_order_and_wait_joins_them():
    done, threads = [], []

    def writer(k):
        def write():
            threads.append(threading.current_thread())
            done.append(k)
        return write
    for k in range(3):
        artifact_writer.defer(writer(k), f"file {k}")
    assert done == []   # nothing runs before a step is dispatched
    artifact_writer.start()
    artifact_writer.wait()
    assert done == [0, 1, 2]   # a later candidate's files go over an earlier one's
    assert all(t is not threading.main_thread() for t in threads)


def test_wait_writes_what_was_never_dispatched():
    done = []
    artifact_writer.defer(lambda: done.append(1), "a compile-only step's files")
    artifact_writer.wait()
    assert done == [1]


def test_a_writer_that_reads_a_host_value_does_not_wait_for_itself():
    done = []

    def write():
        artifact_writer.wait()   # what a host read inside a writer does
        done.append(1)
    artifact_writer.defer(write, "a graph printing a value")
    artifact_writer.start()
    artifact_writer.wait()
    assert done == [1]


def test_a_failed_writer_is_raised_once_and_the_others_still_write():
    done = []

    def fail():
        raise PermissionError("read-only file system")
    artifact_writer.defer(fail, "the jaxpr of step in /ro")
    artifact_writer.defer(lambda: done.append(1), "the graph of step in /tmp")
    artifact_writer.start()
    with pytest.raises(OSError, match=r"could not write the jaxpr of step in /ro: "
                                      r"PermissionError: read-only file system"):
        artifact_writer.wait()
    assert done == [1]
    artifact_writer.wait()   # reported once
