"""A process's death at an injected fault point, in process: ``with injected(point, die): ...``.

``Died`` is a BaseException, so no ``except Exception`` on the way sees it, as none sees a SIGKILL: the
state a run leaves behind is the one a kill -9 at that point leaves (``batch_layer.faults``).
"""

from __future__ import annotations


class Died(BaseException):
    """The death of the code under test at a fault point."""


def die() -> None:
    raise Died
