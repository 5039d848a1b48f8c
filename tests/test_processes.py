"""The process table (flows.common.processes): finding a command's processes by an inherited environment
entry, and stopping those it left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from flows.common.processes import command_line, group_members, live_processes, processes_with_environment, stop_left_behind


def started(token: str, seconds: float, new_session: bool = False) -> subprocess.Popen:
    """A Python child that sleeps `seconds`, with `token` in its environment (in a session of its own)."""
    name, value = token.split("=", 1)
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], env={**os.environ, name: value},
                            start_new_session=new_session)


def test_a_child_is_found_by_its_environment_entry_and_by_its_parent():
    token = f"FEDCME_TEST_PROCESSES={os.getpid()}-found"
    child = started(token, 30)
    try:
        # /proc shows the child's new environment once its exec is through: on a loaded machine, poll.
        deadline = time.monotonic() + 10
        while processes_with_environment(token) != [child.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with_environment(token) == [child.pid]
        assert (child.pid, os.getpid()) in [(pid, parent) for pid, parent, _ in live_processes()]
        assert processes_with_environment(token + "-other") == []
    finally:
        child.kill()
        child.wait()


def test_what_ends_in_time_is_not_left_behind_and_what_does_not_is_killed():
    ending, staying = f"FEDCME_TEST_PROCESSES={os.getpid()}-ending", f"FEDCME_TEST_PROCESSES={os.getpid()}-staying"
    quick, slow = started(ending, 0.3), started(staying, 60)
    try:
        assert stop_left_behind(ending, timeout=20) == []
        assert stop_left_behind(staying, timeout=0.5) == [slow.pid]
        assert slow.wait(timeout=10) == -9  # SIGKILL
        assert processes_with_environment(staying) == []
    finally:
        for child in (quick, slow):
            child.kill()
            child.wait()


def test_a_child_in_a_session_of_its_own_is_its_groups_one_member_named_by_its_command_line():
    child = started(f"FEDCME_TEST_PROCESSES={os.getpid()}-group", 30, new_session=True)
    try:
        assert group_members(child.pid) == [child.pid]
        assert child.pid not in group_members(os.getpgid(0))
        assert command_line(child.pid) == f"{sys.executable} -c import time; time.sleep(30)"
    finally:
        child.kill()
        child.wait()
    assert group_members(child.pid) == [] and command_line(child.pid) == ""
