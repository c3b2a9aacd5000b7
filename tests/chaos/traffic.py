"""The chaos run's clients: writers that retry every request until it is acknowledged, and a reader
that checks every answer as it arrives.

Writer: JSON arrays of wordcount events, each request under its own Idempotency-Key, the same
bytes on every retry, retried (transport errors, 5xx, 408/429) until 202. Only a 4xx that says
the request itself is wrong, or ``give_up_seconds`` without an answer, stops the retries; both
are violations. Stopping the writer never abandons a request in flight.

Reader: key answers for a few words of ``word_counts`` and its top-N, in a loop. For each word
in an answer: the value must not exceed ``Ledger.bound`` read after the answer arrived (so an
answer above it counted some event twice), and neither ``version`` nor the value may be lower
than the highest ever served before for that word (a key that once had a value answering 404
counts as the value going back to 0). Every (version, word, value) is kept for the audit, which
checks that each answer is exact at the version it names.
"""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import datetime, timezone
from urllib.parse import quote

import httpx

from tests.chaos import report
from tests.chaos.ledger import IngestRequest, Ledger
from tests.chaos.report import Findings
from tests.support import web

#: Words the writers use; Zipf-weighted, so a few are frequent and many are rare.
VOCABULARY: tuple[str, ...] = ("the", "café", "日本語", "naïve", *(f"chaos{i:03d}" for i in range(196)))
#: Words whose key answers the reader polls (frequent, middling, rare, non-ASCII, and a sample word).
TRACKED: tuple[str, ...] = ("the", "chaos000", "chaos010", "chaos150", "café")
#: With ``line_separators``: words holding U+2028 / U+0085, also in the vocabulary.
SEPARATOR_WORDS: tuple[str, ...] = ("line\u2028sep", "next\u0085line")
_RETRY_STATUSES = {408, 425, 429}
_TRANSIENT = (httpx.TransportError,)


def client(base_url: str, api_key: str, timeout: float = 30.0) -> httpx.Client:
    return web.client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout)


class Writer(threading.Thread):
    """Posts requests of 1..``max_batch`` events at about ``rate`` events/s until ``stop`` is set."""

    def __init__(self, name: str, base_url: str, api_key: str, ledger: Ledger, findings: Findings, *,
                 seed: int, rate: float, max_batch: int, give_up_seconds: float, stop: threading.Event,
                 line_separators: bool = False) -> None:
        super().__init__(name=name, daemon=True)
        self.base_url, self.api_key, self.ledger, self.findings = base_url, api_key, ledger, findings
        self.rng = random.Random(seed)
        self.rate, self.max_batch, self.give_up_seconds, self.stop = rate, max_batch, give_up_seconds, stop
        self.vocabulary = VOCABULARY + (SEPARATOR_WORDS if line_separators else ())
        self.weights = [1 / (i + 1) for i in range(len(self.vocabulary))]
        self.sequence = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with client(self.base_url, self.api_key) as http:
                while not self.stop.is_set():
                    began = time.monotonic()
                    request = self._next_request()
                    self.ledger.begin(request)
                    self._deliver(http, request)
                    pause = len(request.events) / self.rate - (time.monotonic() - began)
                    if pause > 0:
                        self.stop.wait(pause)
        except BaseException as e:
            self.error = e

    def _next_request(self) -> IngestRequest:
        self.sequence += 1
        events = []
        for _ in range(self.rng.randint(1, self.max_batch)):
            words = self.rng.choices(self.vocabulary, weights=self.weights, k=self.rng.randint(1, 8))
            now = datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
            events.append({"text": " ".join(words), "event_time": now})
        return IngestRequest(key=f"{self.name}-{self.sequence:07d}-{self.rng.getrandbits(32):08x}", events=events)

    def _deliver(self, http: httpx.Client, request: IngestRequest) -> None:
        """Send until 202 (same bytes, same key every time), or give up (a violation either way)."""
        body = json.dumps(request.events, ensure_ascii=False).encode("utf-8")
        headers = {"Idempotency-Key": request.key, "Content-Type": "application/json"}
        deadline, delay, last = time.monotonic() + self.give_up_seconds, 0.1, ""
        while True:
            request.attempts += 1
            self.findings.count("write attempts")
            try:
                response = http.post("/v1/events", content=body, headers=headers)
            except _TRANSIENT as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if response.status_code == 202:
                    self._acknowledged(request, response)
                    return
                last = f"{response.status_code}: {response.text[:300]}"
                if 400 <= response.status_code < 500 and response.status_code not in _RETRY_STATUSES:
                    request.gave_up = last
                    self.findings.violation(report.REJECTED, f"key {request.key}: {last}")
                    return
            if time.monotonic() > deadline:
                request.gave_up = f"no 202 in {self.give_up_seconds:.0f}s and {request.attempts} attempts; last: {last}"
                self.findings.violation(report.NEVER_ACKNOWLEDGED, f"key {request.key}: {request.gave_up}")
                return
            time.sleep(delay)
            delay = min(2.0, delay * 2)

    def _acknowledged(self, request: IngestRequest, response: httpx.Response) -> None:
        answer = response.json()
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        if answer.get("accepted") != len(request.events):
            self.findings.violation(report.COMMIT_CONTENT,
                                    f"key {request.key}: 202 accepted {answer.get('accepted')} of {len(request.events)}")
        self.ledger.acknowledge(request, int(answer["version"]), replayed)
        self.findings.count("replayed", int(replayed))


class Reader(threading.Thread):
    """Polls key answers of ``words`` and the top ``top_n`` every ``interval`` seconds until ``stop``."""

    def __init__(self, base_url: str, api_key: str, ledger: Ledger, findings: Findings, *,
                 words: tuple[str, ...], stop: threading.Event, interval: float = 0.25, top_n: int = 20) -> None:
        super().__init__(name="chaos-reader", daemon=True)
        self.base_url, self.api_key, self.ledger, self.findings = base_url, api_key, ledger, findings
        self.words, self.stop, self.interval, self.top_n = words, stop, interval, top_n
        #: Per word: the highest version and the highest value served so far.
        self.highest: dict[str, tuple[int, int]] = {}
        #: Every answer checked: (stated version, word, value, where).
        self.samples: list[tuple[int, str, int, str]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with client(self.base_url, self.api_key, timeout=15) as http:
                while not self.stop.is_set():
                    for word in self.words:
                        self._key(http, word)
                    self._top(http)
                    self.stop.wait(self.interval)
        except BaseException as e:
            self.error = e

    def _get(self, http: httpx.Client, path: str, **params: object) -> httpx.Response | None:
        try:
            response = http.get(path, params=params)
        except _TRANSIENT:
            self.findings.count("answers unreachable")
            return None
        if response.status_code == 503:
            self.findings.count("answers 503")
            return None
        return response

    def _key(self, http: httpx.Client, word: str) -> None:
        response = self._get(http, f"/v1/views/word_counts/keys/{quote(word, safe='')}")
        if response is None:
            return
        if response.status_code == 200:
            body = response.json()
            self._check(word, body["version"], body["value"]["count"], "key")
        elif response.status_code == 404:
            seen = self.highest.get(word)
            if seen is not None and seen[1] > 0:
                self.findings.violation(report.VALUE_BACKWARDS,
                                        f"key {word!r}: 404 after {seen[1]} at version {seen[0]}: {response.text[:200]}")
        else:
            self.findings.count(f"answers {response.status_code}")

    def _top(self, http: httpx.Client) -> None:
        response = self._get(http, "/v1/views/word_counts/top", n=self.top_n)
        if response is None or response.status_code != 200:
            return
        body = response.json()
        for entry in body["top"]:
            self._check(entry["key"], body["version"], entry["value"], "top")

    def _check(self, word: str, version: int, value: int, where: str) -> None:
        self.findings.count("answers checked")
        bound = self.ledger.bound(word)  # read after the answer arrived: covers everything it can hold
        if value > bound:
            self.findings.violation(report.ABOVE_ACKNOWLEDGED,
                                    f"{where} {word!r} = {value} at version {version}; at most {bound} sent "
                                    f"(+{value - bound})")
        seen = self.highest.get(word)
        if seen is not None:
            if version < seen[0]:
                self.findings.violation(report.VERSION_BACKWARDS,
                                        f"{where} {word!r}: version {version} after {seen[0]} (value {value})")
            if value < seen[1]:
                self.findings.violation(report.VALUE_BACKWARDS,
                                        f"{where} {word!r}: {value} at version {version} after {seen[1]} was served "
                                        f"(-{seen[1] - value}; highest version served {seen[0]})")
            self.highest[word] = (max(version, seen[0]), max(value, seen[1]))
        else:
            self.highest[word] = (version, value)
        self.samples.append((version, word, value, where))
