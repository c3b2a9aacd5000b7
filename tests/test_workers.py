"""How the suite is spread over its two xdist workers (``make test``: ``-n 2 --dist loadgroup``).

A group (``xdist_group``, set in ``tests/conftest.py`` from the fixtures a test takes) must run on one worker:
a module's shared data is then built once, and the session's Kafka broker is one JVM, not one per worker. The
grouping fails silently when pytest and pytest-xdist disagree (pytest 9.2's structured node ids drop the group
suffix pytest-xdist 3.8 writes: pytest-dev/pytest-xdist#1386), so this test says so instead.
"""

from __future__ import annotations

import pytest


def test_grouped_tests_are_sent_to_one_worker_as_one_unit(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run under --dist loadgroup")
    grouped = [item for item in request.session.items if item.get_closest_marker("xdist_group")]
    lost = [item.nodeid for item in grouped if "@" not in item.nodeid.rpartition("]")[2]]
    assert not lost, (
        f"--dist loadgroup does not group {lost[0]} (and {len(lost) - 1} more): pytest {pytest.__version__} with "
        f"this pytest-xdist drops the groups; install the versions pyproject.toml pins (make install)")
