"""What every answer of the serving store passes before it is given.

A read's reply names the generation it met (its pointer, the segment's ``processed`` version and the
generation's metadata header). The answer is given only when that generation holds the view as this
API's code defines it (else ``not_in_generation`` / ``definition_changed``: a generation computed by
other code is never read through this one) and its version is not older than one this process already
answered at (else ``StoreUnavailableError``, 503: versions never go back within a server's life).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from serving.store.errors import StoreUnavailableError
from serving.store.generation_meta import MetaHeader
from serving.store.reads import Generation, definition_changed, not_in_generation
from serving.store.replies import text

#: Checked reply parts remembered at most (``AnswerChecks.served``); one per generation and realtime version.
_CHECKED_REPLIES = 64


class AnswerChecks:
    """The checks of one pipeline's answers in one API process, and the highest version it answered at."""

    def __init__(self, pipeline: str, definitions: Mapping[str, str] | None) -> None:
        self.pipeline = pipeline
        #: Each view's definition (``repr``) in the code this API runs: a generation that recorded another one for
        #: a view is not read through this code (its windows or keys would be taken for others'). None: no check.
        self.definitions = definitions
        #: The highest version this process has answered at.
        self._answered = -1
        #: Reply parts a read met, and the generation they name, once they passed the view check.
        self._checked: dict[tuple, Generation] = {}

    def served(self, view: str, generation: bytes | str, processed: bytes | str, meta: Sequence) -> Generation:
        """The generation a read of ``view`` met, checked. Replies that passed the view check are remembered: the
        same parts give the same generation and the same verdict (a generation's metadata never changes, and every
        part, and this API's definition of the view, is in the cache key), so a read of a known generation skips
        it; the version check is made every time."""
        seen = (view, None if self.definitions is None else self.definitions.get(view), generation, processed, *meta)
        served = self._checked.get(seen)
        if served is None:
            header = MetaHeader(*meta)
            self._check_view(view, generation, processed, header)
            served = Generation.from_header(generation, processed, header)
            if len(self._checked) >= _CHECKED_REPLIES:
                self._checked.clear()
            self._checked[seen] = served
        return self._not_older(served)

    def _check_view(self, view: str, generation: bytes | str, processed: bytes | str, header: MetaHeader) -> None:
        """Refused unless the generation a read met holds ``view`` as this API's code defines it."""
        if header.layout is None:
            raise not_in_generation(view, Generation.from_header(generation, processed, header))
        recorded = header.definition
        if recorded is not None and self.definitions is not None and text(recorded) != self.definitions.get(view):
            raise definition_changed(view, Generation.from_header(generation, processed, header))

    def _not_older(self, served: Generation) -> Generation:
        """``served``, unless it is older than a version already answered at: then refused, saying why."""
        if served.version < self._answered:
            raise StoreUnavailableError(
                f"the serving store of pipeline {self.pipeline!r} holds master version {served.version}, older "
                f"than version {self._answered} already answered at (Redis lost data, or the speed layer is "
                "rebuilding its segments): answers resume once it is as new again; retry shortly",
                retry_after=2,
            )
        self._answered = served.version
        return served
