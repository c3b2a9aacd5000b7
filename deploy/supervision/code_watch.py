"""Long-running processes follow their pipelines' code: a module changed on disk ends the process.

A process runs the pipeline code it imported at start, and its logic fingerprint is taken then
(``shared_logic.logic``). Were a module edited while the platform runs and only one process
restarted (a crash, a restart by hand), two logics would run side by side. Answers would stay
unmixed (``serving.store.logic``), but the old logic's speed layer would hold the segment of the
new logic's next generation, so that generation could not be served until it restarted too.

So the speed layer, the scheduler and the API watch the files of their pipelines' modules (the API
answers with the views and the logic it imported: a new view, which logic is pending). When one
changes, ``CodeWatch`` sets the process's stop event: the process finishes the step in hand (a
micro-batch, a recompute, the requests in flight) and exits with ``EXIT_CODE_CHANGED``; under `up`
the supervisor starts it again on the new code, and every process converges on one logic, which the scheduler then
recomputes. Run by hand, the exit message says to start it again.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared_logic.pipeline import Pipeline

log = logging.getLogger(__name__)

#: The exit status of a process stopped because its pipeline code changed (the supervisor restarts it, and does not
#: count it as a failure). BSD's EX_TEMPFAIL ("try again"): not 3, which uvicorn exits with when it cannot start
#: (its port in use), a failure the supervisor must count.
EXIT_CODE_CHANGED = 75
#: Seconds between looks at the files (one stat and, when it moved, one read per module).
POLL_SECONDS = 2.0


class CodeWatch:
    """Watches the module file of each pipeline; ``changed`` names the first that changed, if any."""

    def __init__(self, pipelines: Iterable[Pipeline], stop: threading.Event, *, poll: float = POLL_SECONDS) -> None:
        files = {_module_file(pipeline) for pipeline in pipelines}
        self._digests = {path: _digest(path) for path in files if path is not None}
        self._stop, self._poll = stop, poll
        self.changed: Path | None = None
        self._thread = threading.Thread(target=self._run, name="code-watch", daemon=True)

    def start(self) -> CodeWatch:
        if self._digests:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            for path, digest in self._digests.items():
                if _digest(path) != digest:
                    self.changed = path
                    log.warning("the pipeline module %s changed on disk: stopping after the step in hand, to run "
                                "the new code (its logic is recomputed once every process runs it)", path)
                    self._stop.set()
                    return


def _module_file(pipeline: Pipeline) -> Path | None:
    module = sys.modules.get(type(pipeline).__module__)
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:  # moved or being rewritten: a change as well, unless it comes back the same
        return None
