"""Redis's HyperLogLog, built outside Redis: a SET of these bytes holds what PFADD of the members would.

Loading a generation gives every row with many distinct values a HyperLogLog. A PFADD of its
members sends them all to Redis (10M member strings for 10M events): here the workers compute
the registers themselves, vectorized, and send one string per row. The registers are Redis's
exactly (``hyperloglog.c``: MurmurHash64A with seed 0xadc83b19 over the member's bytes; the low 14
bits pick one of 16,384 registers, the run of zeros above them counts), so PFCOUNT and PFMERGE
with sketches Redis made (the realtime segments') answer as if Redis had built them. The encoding
is Redis's too: sparse while the whole string fits ``SPARSE_MAX_BYTES`` (Redis's
``hll-sparse-max-bytes`` default) and every register is at most 32, dense otherwise (a VAL opcode
per register: Redis merges equal neighbours, so a sketch near the limit may be dense here where
Redis's would still be sparse; the registers are the same); the cached cardinality is marked
stale, so Redis computes it on first count, as after a PFADD.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REGISTERS = 1 << 14
#: Redis's ``hll-sparse-max-bytes`` default: above it, a sketch is dense.
SPARSE_MAX_BYTES = 3000
_SEED = 0xADC83B19
_M = np.uint64(0xC6A4A7935BD1E995)
_R = np.uint64(47)
_SPARSE_VALUE_MAX = 32
_ZERO_MAX = 64
#: "HYLL", encoding (0 dense, 1 sparse), 3 unused bytes, cached cardinality with its stale bit set.
_HEADER = {encoding: b"HYLL" + bytes([encoding, 0, 0, 0]) + bytes(7) + b"\x80" for encoding in (0, 1)}


def sketches(members: pa.ListArray | pa.LargeListArray) -> list[bytes | None]:
    """For each list of string members, the HyperLogLog Redis would hold after PFADD of all of them
    to an absent key (None for a null list; an empty list gives an empty sketch)."""
    values = pc.cast(members.flatten(), pa.binary())
    if values.null_count:
        raise ValueError("a list of members holds a null: PFADD has no null to add")
    lengths = pc.fill_null(pc.list_value_length(members), 0).to_numpy(zero_copy_only=False)
    index, count = _patterns(values)
    # Each row's registers: the largest count per (row, index), in index order.
    slot = np.repeat(np.arange(len(members), dtype=np.int64), lengths) * REGISTERS + index
    ranked = np.sort(slot * 64 + count)  # counts are at most 51: by slot, then count
    slot, count = ranked >> 6, ranked & 63
    last = np.ones(len(slot), dtype=bool)
    last[:-1] = slot[1:] != slot[:-1]
    slot, count = slot[last], count[last]
    row, index = slot // REGISTERS, slot % REGISTERS
    starts = np.searchsorted(row, np.arange(len(members) + 1))
    sparse, bounds = _sparse(row, index, count, starts)
    too_high = np.zeros(len(members), dtype=bool)
    too_high[row[count > _SPARSE_VALUE_MAX]] = True
    out: list[bytes | None] = []
    for r, valid in enumerate(members.is_valid().to_pylist()):
        lo, hi = bounds[r], bounds[r + 1]
        if not valid:
            out.append(None)
        elif len(_HEADER[1]) + hi - lo <= SPARSE_MAX_BYTES and not too_high[r]:
            out.append(_HEADER[1] + sparse[lo:hi].tobytes())
        else:
            out.append(_HEADER[0] + _dense(index[starts[r]:starts[r + 1]], count[starts[r]:starts[r + 1]]))
    return out


def _patterns(values: pa.BinaryArray) -> tuple[np.ndarray, np.ndarray]:
    """Each member's register index and count (``hllPatLen``)."""
    h = _murmur64a(values)
    index = (h & np.uint64(REGISTERS - 1)).astype(np.int64)
    rest = (h >> np.uint64(14)) | np.uint64(1 << 50)
    lowest = rest & (~rest + np.uint64(1))  # the lowest set bit: a power of two, exact as a double
    count = (np.log2(lowest.astype(np.float64)) + 1).astype(np.uint8)
    return index, count


def _murmur64a(values: pa.BinaryArray) -> np.ndarray:
    """MurmurHash64A (Redis's, little-endian) of each value's bytes, seed 0xadc83b19; vectorized."""
    _, offsets, data = values.buffers()
    start = np.frombuffer(offsets, dtype=np.int32, count=len(values) + 1 + values.offset)[values.offset:]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    raw = np.concatenate([raw, np.zeros(8, dtype=np.uint8)])  # so every 8-byte read stays inside
    words = np.ndarray((len(raw) - 7,), dtype="<u8", buffer=raw, strides=(1,))  # words[j]: the 8 bytes from j
    begin, length = start[:-1].astype(np.int64), np.diff(start).astype(np.int64)
    with np.errstate(over="ignore"):
        h = np.uint64(_SEED) ^ (length.astype(np.uint64) * _M)
        blocks = length // 8
        for block in range(int(blocks.max(initial=0))):
            has = slice(None) if block < blocks.min() else np.flatnonzero(blocks > block)  # all, or the longer ones
            k = words[begin[has] + 8 * block] * _M
            k ^= k >> _R
            k = k * _M
            h[has] = (h[has] ^ k) * _M
        tail = (length % 8).astype(np.uint64)
        # The last len % 8 bytes, little-endian: an 8-byte read (the buffer is padded) masked to them.
        h ^= words[begin + 8 * blocks] & ((np.uint64(1) << (tail * np.uint64(8))) - np.uint64(1))
        h = np.where(tail > 0, h * _M, h)
        h ^= h >> _R
        h = h * _M
        h ^= h >> _R
    return h


def _sparse(row: np.ndarray, index: np.ndarray, count: np.ndarray,
            starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every row's sparse opcodes, back to back, and where each row's begin (and the last ends).

    Redis's opcodes: runs of zeros (ZERO 00xxxxxx, 1-64 of them; XZERO 01xxxxxx yyyyyyyy, up to
    16,384) and values (VAL 1vvvvvxx: value v+1, run length x+1; one per register here, which Redis
    reads as it reads its own). Each row is its registers (``index`` ascending, with the zeros
    before each), then the zeros after its last register. Counts above 32 give garbage here: such
    rows are dense."""
    rows = len(starts) - 1
    # Items: a row's registers, then one trailer (the zeros after them): item of register i is at
    # i + its row (one trailer per row before it), row r's trailer at starts[r + 1] + r.
    at = np.arange(len(index)) + row
    trailer = starts[1:] + np.arange(rows)
    gap = np.empty(len(index) + rows, dtype=np.int64)
    value = np.zeros(len(index) + rows, dtype=np.int64)
    previous = np.full(len(index), -1, dtype=np.int64)
    follows = np.ones(len(index), dtype=bool)
    follows[starts[:-1][starts[:-1] < len(index)]] = False  # a row's first register follows nothing
    previous[1:][follows[1:]] = index[:-1][follows[1:]]
    gap[at] = index - previous - 1
    value[at] = count
    row_last = np.full(rows, -1, dtype=np.int64)
    filled = starts[1:] > starts[:-1]
    row_last[filled] = index[starts[1:][filled] - 1]
    gap[trailer] = REGISTERS - row_last - 1
    zero_bytes = np.where(gap == 0, 0, np.where(gap <= _ZERO_MAX, 1, 2))
    size = zero_bytes + (value > 0)
    offset = np.cumsum(size) - size
    out = np.zeros(int(size.sum()), dtype=np.uint8)
    short, long = (gap > 0) & (gap <= _ZERO_MAX), gap > _ZERO_MAX
    out[offset[short]] = gap[short] - 1
    out[offset[long]] = 0x40 | ((gap[long] - 1) >> 8)
    out[offset[long] + 1] = (gap[long] - 1) & 0xFF
    val = value > 0
    out[offset[val] + zero_bytes[val]] = (0x80 | ((value[val] - 1) << 2)) & 0xFF
    bounds = np.append(offset[starts[:-1] + np.arange(rows)], offset[-1] + size[-1] if len(size) else 0)
    return out, bounds


def _dense(index: np.ndarray, count: np.ndarray) -> bytes:
    """16,384 six-bit registers, register i at bit 6i, least significant bits first."""
    registers = np.zeros(REGISTERS, dtype=np.uint32)
    registers[index] = count
    quads = registers.reshape(-1, 4)
    packed = quads[:, 0] | (quads[:, 1] << 6) | (quads[:, 2] << 12) | (quads[:, 3] << 18)
    return np.stack([packed & 0xFF, (packed >> 8) & 0xFF, packed >> 16], axis=1).astype(np.uint8).tobytes()
