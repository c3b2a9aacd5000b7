"""Payment events for the exactness scenarios: appended to the master dataset in small commits while the
speed layer runs, and what the readers ask for meanwhile."""

from __future__ import annotations

import random
from datetime import datetime, timezone

from batch_layer.master.dataset import MasterDataset
from tests import oracle

START = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc)

#: What the readers ask for while things happen: every user, all time and in one hourly window.
READ_ITEMS = [(view, user, window) for user in oracle.PAYMENT_USERS
              for view, window in (("spend_by_user", None), ("spend_by_user_hourly", int(START.timestamp()) + 3600))]


def ingest_some(master: MasterDataset, rng: random.Random, n: int) -> None:
    """Append ``n`` random payment events (over five hours from ``START``) in one commit."""
    events = oracle.payments_events(rng, n, START, seconds=5 * 3600)
    master.append(master.pipeline.schema.validate(events))
