"""Packed commands frame their arguments one-to-one, whatever the bytes and however they are cut.

A generation is loaded by writing RESP bytes straight to Redis (``serving.store.packed``): Spark
spells each argument as a bulk string, a worker prefixes a ``header`` and sends a ``span`` of those
bulks. Its rows are exact in Redis only if (1) header plus bulks read back, as Redis reads them,
as exactly the arguments (any bytes: CR LF, NUL, multi-byte UTF-8, empty), the same bytes hiredis
packs; (2) ``span`` is a homomorphism from slices of an Arrow array to byte strings: the span of
``[i, k)`` is the span of ``[i, j)`` then of ``[j, k)``, for arrays with an offset and large ones
too, so cutting a batch of rows anywhere sends every row once; and (3) commands written back to
back read back one by one, in order (one write per flush, a reply per command). ``_bulk`` stands
for Spark's ``bulk`` here (``test_packed`` checks the two spell the same bytes).
"""

from __future__ import annotations

import hiredis
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.store.packed import _bulk, command, header, span

LAWS_SETTINGS = settings(max_examples=100, deadline=None, database=None)
#: What Spark's arguments hold: any text; the tricky bytes are common.
TEXT = st.text(st.one_of(st.sampled_from("\r\n\x00$*:ü😀"), st.characters(codec="utf-8")), max_size=10)
NAMES = st.lists(TEXT, min_size=1, max_size=3)  # a command's own arguments: its name, a key, ...


def read_all(data: bytes) -> list[object]:
    """The commands in ``data`` as Redis reads them (RESP arrays of bulk strings), all of it consumed."""
    reader, out = hiredis.Reader(), []
    reader.feed(data)
    while (item := reader.gets()) is not False:
        out.append(item)
    assert not reader.has_data(), "bytes left over: a length does not match its bulk"
    return out


@LAWS_SETTINGS
@given(args=NAMES, members=st.lists(TEXT, max_size=6))
def test_a_header_and_bulks_read_back_as_exactly_the_arguments(args: list[str], members: list[str]) -> None:
    packed = header(args, len(members)) + b"".join(_bulk(m.encode()) for m in members)
    assert packed == command(*args, *members)
    assert read_all(packed) == [[a.encode() for a in (*args, *members)]]


@LAWS_SETTINGS
@given(values=st.lists(TEXT, max_size=12), cuts=st.lists(st.integers(0, 12), min_size=3, max_size=3),
       kind=st.sampled_from([pa.string(), pa.large_string(), pa.binary()]), offset=st.integers(0, 3))
def test_span_is_a_homomorphism_from_slices_to_bytes(values: list[str], cuts: list[int], kind: pa.DataType,
                                                    offset: int) -> None:
    bulks = [_bulk(v.encode()) for v in values]
    array = pa.array([b"x"] * offset + bulks, type=pa.binary()).cast(kind).slice(offset)  # an offset into buffers
    i, j, k = sorted(min(c, len(values)) for c in cuts)
    assert bytes(span(array, i, j)) + bytes(span(array, j, k)) == bytes(span(array, i, k)) == b"".join(bulks[i:k])


@LAWS_SETTINGS
@given(st.lists(st.tuples(NAMES, st.lists(TEXT, max_size=3)), max_size=5))
def test_commands_written_back_to_back_read_back_one_by_one(commands: list[tuple[list[str], list[str]]]) -> None:
    stream = b"".join(header(args, len(ms)) + b"".join(_bulk(m.encode()) for m in ms) for args, ms in commands)
    assert read_all(stream) == [[a.encode() for a in (*args, *ms)] for args, ms in commands]
