"""Sketches built outside Redis (``serving.store.hyperloglog``) hold the registers Redis's own PFADD makes.

The oracle is a real Redis: PFADD the same members to a key, GET its bytes, and decode both
sketches' registers here in plain Python (Redis's sparse and dense formats, from ``hyperloglog.c``);
then PFCOUNT and PFMERGE with Redis-made sketches answer alike.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
import redis

from serving.store import hyperloglog
from serving.store.hyperloglog import REGISTERS, SPARSE_MAX_BYTES, sketches


def _registers(sketch: bytes) -> list[int]:
    assert sketch[:4] == b"HYLL"
    body, registers = sketch[16:], []
    if sketch[4] == 0:  # dense: 6-bit registers, least significant bits first
        bits = int.from_bytes(body, "little")
        return [(bits >> (6 * i)) & 63 for i in range(REGISTERS)]
    i = 0
    while i < len(body):
        op = body[i]
        if op & 0xC0 == 0x00:  # ZERO
            registers += [0] * ((op & 0x3F) + 1)
        elif op & 0xC0 == 0x40:  # XZERO
            registers += [0] * ((((op & 0x3F) << 8) | body[i + 1]) + 1)
            i += 1
        else:  # VAL
            registers += [((op >> 2) & 0x1F) + 1] * ((op & 0x03) + 1)
        i += 1
    assert len(registers) == REGISTERS
    return registers


def _lists() -> list[list[str] | None]:
    random.seed(11)
    words = ["", "a", "ü", "😀", "merchant_17", "x" * 7, "y" * 8, "z" * 9, "w" * 64, "\x00\r\n"]
    return [
        [], None, ["one"], words, [f"merchant_{i}" for i in range(200)],
        [random.randbytes(random.randrange(0, 40)).hex() for _ in range(300)],
        [str(i) for i in range(5000)],  # past SPARSE_MAX_BYTES: dense, as Redis turns it
        ["dup", "dup", "dup"],
    ]


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.mark.parametrize("position", range(len(_lists())))
def test_a_sketch_has_the_registers_and_count_of_redis_pfadd(client: redis.Redis, position: int) -> None:
    lists = _lists()
    ours = sketches(pa.array(lists, type=pa.list_(pa.string())))[position]
    members = lists[position]
    if members is None:
        assert ours is None
        return
    assert ours is not None
    client.delete("theirs", "ours")
    if members:
        client.pfadd("theirs", *members)
    else:
        client.pfadd("theirs")
    client.set("ours", ours)
    assert _registers(ours) == _registers(client.get("theirs"))
    assert client.pfcount("ours") == client.pfcount("theirs")
    assert client.pfcount("ours", "theirs") == client.pfcount("theirs")  # merging the same registers changes nothing
    assert (ours[4] == 1) == (len(ours) <= SPARSE_MAX_BYTES)
    client.pfadd("ours", "one more")  # Redis takes it as its own: it can grow
    client.pfadd("theirs", "one more")
    assert _registers(client.get("ours")) == _registers(client.get("theirs"))


def test_a_register_above_32_makes_the_sketch_dense(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    # A member whose hash leaves 33+ zero bits above the index is one in 2^32: none can be found by
    # search, so the first member's count is raised where it is computed. Redis's sparse format holds
    # values up to 32 only; the sketch must come out dense, and Redis must read it.
    real = hyperloglog._patterns

    def raised(values: pa.BinaryArray) -> tuple[np.ndarray, np.ndarray]:
        index, count = real(values)
        count[0] = 40
        return index, count

    monkeypatch.setattr(hyperloglog, "_patterns", raised)
    members = ["first", "second", "third"]
    (ours,) = sketches(pa.array([members], type=pa.list_(pa.string())))
    assert ours is not None and ours[4] == 0  # dense
    client.set("high", ours)
    monkeypatch.undo()
    (plain,) = sketches(pa.array([members], type=pa.list_(pa.string())))
    assert plain is not None
    high, expected = _registers(ours), _registers(plain)
    changed = [i for i in range(REGISTERS) if high[i] != expected[i]]
    assert len(changed) == 1 and high[changed[0]] == 40  # the raised register, the rest as Redis's own
    client.pfadd("theirs-high", *members)
    assert client.pfcount("high") >= client.pfcount("theirs-high")  # Redis reads the dense sketch
