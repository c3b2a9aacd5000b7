"""A view row's key and window encode one-to-one into the names Redis keeps them under.

A row's batch part and realtime part meet only by name: both layers spell the key with
``encode_key`` (and the window with ``suffix``), the reader finds the parts by that name, and key
listings and exports give the key columns back with ``decode_key``. If two rows could share a
name, their parts would be combined into one answer; if decoding lost a value, a listed key would
not read back. So, for a view's fixed number of key columns: ``decode_key`` undoes ``encode_key``
for any strings (the separators '|', '\\' and '@', empty strings, NUL, U+2028, any unicode that
UTF-8 can carry: Redis gets the bytes, so a lone surrogate never reaches a key), and
``encode_field``, key and window start, is injective (shown by undoing it). Nothing is refused by
design; ``decode_key`` refuses a string that is no key of that many columns, saying so.
"""

from __future__ import annotations

import functools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.store.keys import KEY_SEPARATOR, WINDOW_SEPARATOR, decode_key, encode_field, encode_key, suffix

LAWS_SETTINGS = settings(max_examples=200, deadline=None, database=None)
#: Mostly the characters that could confuse the encoding, and any other.
VALUES = st.text(st.one_of(st.sampled_from("|\\@ a\x00\u2028\r\n:{}"), st.characters(codec="utf-8")), max_size=8)
WINDOWS = st.one_of(st.none(), st.integers(-(2**40), 2**40))


@functools.cache
def keys(columns: int) -> st.SearchStrategy[tuple[str, ...]]:
    return st.lists(VALUES, min_size=columns, max_size=columns).map(tuple)


def decode_field(field: str, columns: int, windowed: bool) -> tuple[tuple[str, ...], int | None]:
    """``encode_field`` undone: the window start follows the last '@' (an int's digits hold none)."""
    if not windowed:
        return decode_key(field, columns), None
    key, sep, start = field.rpartition(WINDOW_SEPARATOR)
    assert sep and suffix(int(start)) == sep + start
    return decode_key(key, columns), int(start)


@LAWS_SETTINGS
@given(st.integers(1, 4).flatmap(keys))
def test_decode_key_undoes_encode_key(key: tuple[str, ...]) -> None:
    assert decode_key(encode_key(key), len(key)) == key
    if len(key) == 1:  # a one-column key is stored as it is, whatever it holds
        assert encode_key(key) == encode_key(key[0]) == key[0]


@LAWS_SETTINGS
@given(data=st.data(), columns=st.integers(1, 4), window=WINDOWS)
def test_a_field_reads_back_as_its_key_and_window(data: st.DataObject, columns: int, window: int | None) -> None:
    key = data.draw(keys(columns))
    assert decode_field(encode_field(key, window), columns, window is not None) == (key, window)


@st.composite
def neighbours(draw: st.DrawFn) -> tuple[tuple[tuple[str, ...], int | None], tuple[tuple[str, ...], int | None]]:
    """Two rows of one view that come close to sharing a name: the same characters cut into key values at
    different places (a separator inside a value or between two), and often the same window."""
    text = draw(st.text("|\\@1-", max_size=6))
    columns, windowed = draw(st.integers(1, 3)), draw(st.booleans())

    def row() -> tuple[tuple[str, ...], int | None]:
        cuts = [0, *sorted(draw(st.lists(st.integers(0, len(text)), min_size=columns - 1, max_size=columns - 1))),
                len(text)]
        return tuple(text[i:j] for i, j in zip(cuts, cuts[1:])), draw(st.integers(-1, 1)) if windowed else None

    return row(), row()


@LAWS_SETTINGS
@given(neighbours())
def test_two_rows_of_a_view_never_share_a_field(rows: tuple) -> None:
    (key_a, ws_a), (key_b, ws_b) = rows
    if (key_a, ws_a) != (key_b, ws_b):
        assert encode_field(key_a, ws_a) != encode_field(key_b, ws_b)


@LAWS_SETTINGS
@given(WINDOWS)
def test_a_window_start_reads_back_from_its_suffix(window: int | None) -> None:
    sfx = suffix(window)  # what the reader parses back (serving.store.reader: removeprefix, int)
    assert (int(sfx.removeprefix(WINDOW_SEPARATOR)) if sfx else None) == window
    assert sfx == "" or (sfx.count(WINDOW_SEPARATOR) == 1 and sfx.startswith(WINDOW_SEPARATOR))


@LAWS_SETTINGS
@given(data=st.data(), columns=st.integers(2, 4), other=st.integers(2, 5))
def test_a_key_of_another_width_is_refused_by_name(data: st.DataObject, columns: int, other: int) -> None:
    key = encode_key(data.draw(keys(columns)))
    if other != columns:
        with pytest.raises(ValueError, match=f"is not an encoded key of {other} columns"):
            decode_key(key, other)


def test_the_separators_are_escaped_so_neighbouring_values_stay_apart() -> None:
    assert encode_key(("a|b", "c")) != encode_key(("a", "b|c"))
    assert encode_key(("a\\", "b")) != encode_key(("a", "\\b"))
    assert encode_key(("", "")) == KEY_SEPARATOR and decode_key(KEY_SEPARATOR, 2) == ("", "")
    dangling = "a\\"  # an escape with nothing to escape
    with pytest.raises(ValueError, match=re.escape(f"{dangling!r} is not an encoded key of 2 columns")):
        decode_key(dangling, 2)
