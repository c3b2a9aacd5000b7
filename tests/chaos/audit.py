"""The end-of-run audit: the Delta log and the master table against what was sent, and the stated versions.

Nothing here asks the platform: the master's Delta log is parsed as JSON lines (split on
``\\n`` only: JSON escapes it inside strings, while U+2028 and U+0085 may stand raw), each
commit's added files are read with pyarrow, and the whole table with delta-rs (``tests.oracle``).

* **Keys**: every acknowledged Idempotency-Key's application transaction is in exactly one
  commit, the one its 202 named; a key never acknowledged is in at most one.
* **Commits**: each commit after the baseline holds exactly the events of the requests whose keys
  it records, no more, no fewer; a commit with events but no key of ours is events nobody sent.
* **Master**: the oracle's views over the master table equal its views over the baseline plus
  every request committed (acknowledged, or given up on but found in the log).
* **Stated versions**: each answer the reader checked equals the exact count of its word over
  the commits up to the version the answer named.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow.parquet as pq

from tests import oracle
from tests.chaos import report
from tests.chaos.ledger import IngestRequest, Ledger
from tests.chaos.report import Findings

_SERVER_TXN = "ingest:server:"


@dataclass
class Commit:
    """One commit of the master's Delta log: its application transactions and data files added."""

    version: int
    app_ids: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def read_log(master: Path) -> list[Commit]:
    """Every commit of the table at ``master``, in version order (JSON commit files)."""
    commits = []
    for path in sorted((master / "_delta_log").glob("*.json")):
        commit = Commit(int(path.stem))
        for line in path.read_text(encoding="utf-8").split("\n"):
            if not line.strip():
                continue
            action = json.loads(line)
            if "txn" in action:
                commit.app_ids.append(action["txn"]["appId"])
            elif "add" in action and action["add"].get("dataChange", True):
                commit.files.append(unquote(action["add"]["path"]))
            elif "commitInfo" in action:
                commit.info = action["commitInfo"]
        commits.append(commit)
    return commits


def commit_events(master: Path, commit: Commit) -> list[tuple[str, Any]]:
    """(text, event_time in UTC) of the event rows ``commit`` added."""
    rows: list[tuple[str, Any]] = []
    for name in commit.files:
        table = pq.read_table(master / name, columns=["text", "event_time", "_kind"])
        for row in table.to_pylist():
            if row["_kind"] == "event":
                t = row["event_time"]
                rows.append((row["text"], None if t is None else oracle.as_utc(t)))
    return rows


def _request_rows(request: IngestRequest) -> Counter[tuple[str, Any]]:
    return Counter((e["text"], oracle.as_utc(e["event_time"])) for e in request.oracle_events())


@dataclass
class LogAudit:
    """What the log audit found, for the summary and the stated-version check."""

    keys_in_log: int = 0
    events_after_baseline: int = 0
    committed: list[IngestRequest] = field(default_factory=list)
    #: Per commit version (ascending), the words it added.
    words_by_version: list[tuple[int, Counter[str]]] = field(default_factory=list)


def audit_log(master: Path, ledger: Ledger, baseline_version: int, findings: Findings) -> LogAudit:
    """Keys and commits against the ledger (see the module docstring); violations go to ``findings``."""
    commits = read_log(master)
    requests = {r.app_id: r for r in ledger.snapshot()}
    where: dict[str, list[int]] = {}
    result = LogAudit()
    for commit in commits:
        for app in commit.app_ids:
            if app.startswith("ingest:") and not app.startswith(_SERVER_TXN):
                where.setdefault(app, []).append(commit.version)
    result.keys_in_log = len(where)
    for app, request in requests.items():
        versions = where.get(app, [])
        if len(versions) > 1:
            findings.violation(report.KEY_DUPLICATED, f"key {request.key} in commits {versions}")
        if request.acknowledged and not versions:
            findings.violation(report.KEY_LOST, f"key {request.key} acknowledged at version {request.version}")
        elif request.acknowledged and versions[0] != request.version:
            findings.violation(report.RECEIPT_VERSION, f"key {request.key}: 202 said {request.version}, "
                                                       f"commit {versions[0]}")
        if versions:
            result.committed.append(request)
    for commit in commits:
        rows = commit_events(master, commit) if commit.files else []
        result.words_by_version.append((commit.version, Counter(w for text, _ in rows for w in oracle.words(text))))
        if commit.version <= baseline_version:
            continue
        result.events_after_baseline += len(rows)
        ours = [requests[a] for a in commit.app_ids if a in requests]
        if rows and not ours:
            findings.violation(report.UNKNOWN_EVENTS, f"commit {commit.version}: {len(rows)} events, "
                                                      f"no key of ours ({commit.info.get('operation')})")
            continue
        want = sum((_request_rows(r) for r in ours), Counter())
        if Counter(rows) != want:
            missing, extra = want - Counter(rows), Counter(rows) - want
            findings.violation(report.COMMIT_CONTENT, f"commit {commit.version} ({len(ours)} keys): "
                                                      f"{sum(missing.values())} missing, {sum(extra.values())} extra")
    return result


def audit_master(master: Path, ledger_committed: list[IngestRequest], baseline_version: int,
                 findings: Findings) -> dict[str, oracle.ViewTable]:
    """The oracle's views over the master table, checked against baseline + committed requests; returned."""
    stored = oracle.views("wordcount", oracle.read_events(master))
    sent = oracle.read_events(master, baseline_version)
    for request in ledger_committed:
        sent.extend(request.oracle_events())
    expected = oracle.views("wordcount", sent)
    for view in expected:
        differ = [row for row in expected[view].keys() | stored[view].keys()
                  if expected[view].get(row) != stored[view].get(row)]
        if differ:
            row = differ[0]
            findings.violation(report.MASTER_DIFFERS, f"{view}: {len(differ)} rows, e.g. {row}: sent "
                                                      f"{expected[view].get(row)}, master {stored[view].get(row)}",
                               n=len(differ))
    return stored


def check_stated_versions(words_by_version: list[tuple[int, Counter[str]]],
                          samples: list[tuple[int, str, int, str]], findings: Findings) -> None:
    """Each reader answer (version, word, value) against the exact count of the word at that version.

    An answer above it is told apart by whether its value is the exact count at some later version
    (its content is whole, its label too old) or at none (part of a commit's events applied).
    """
    versions = [v for v, _ in words_by_version]
    series: dict[str, list[int]] = {}  # word -> exact count after each commit (index as in ``versions``)

    def counts(word: str) -> list[int]:
        if word not in series:
            total, running = 0, []
            for _, words in words_by_version:
                total += words[word]
                running.append(total)
            series[word] = running
        return series[word]

    for version, word, value, where in samples:
        findings.count("answers checked at version")
        running = counts(word)
        at = bisect.bisect_right(versions, version) - 1
        exact = running[at] if at >= 0 else 0
        if value == exact:
            continue
        what = f"{where} {word!r} = {value} at version {version}, exact {exact} ({value - exact:+d})"
        if value < exact:
            findings.violation(report.NOT_EXACT_BELOW, what)
            continue
        findings.maximum("largest excess at a stated version", value - exact)
        first = bisect.bisect_left(running, value)
        if first < len(running) and running[first] == value:
            findings.maximum("largest label lag (versions)", versions[first] - version)
            findings.violation(report.NOT_EXACT_STALE_LABEL, f"{what}; exact at version {versions[first]}")
        elif first == len(running):
            findings.violation(report.NOT_EXACT_PARTIAL, f"{what}; above the count at every version")
        else:
            findings.violation(report.NOT_EXACT_PARTIAL, f"{what}; between versions {versions[first - 1]} "
                                                         f"and {versions[first]}")
