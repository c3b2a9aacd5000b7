"""Where A's time goes, in process (no HTTP server): each request path awaited sequentially and timed,
then A's ASGI path under cProfile, own time summed per package."""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from _harness import ROOT
from _query_apps import bare_app, what_if
from _query_data import VIEW


@asynccontextmanager
async def _lifespan(app: Any):
    """Drive the ASGI lifespan protocol (startup before, shutdown after)."""
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"].startswith("lifespan.startup"):
            if message["type"].endswith("failed"):
                raise RuntimeError(message.get("message"))
            started.set()
        elif message["type"].startswith("lifespan.shutdown"):
            stopped.set()

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, send))
    await inbox.put({"type": "lifespan.startup"})
    await started.wait()
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await stopped.wait()
        await task


def _asgi_caller(app: Any) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def call(path: str) -> int:
        status = 0
        body = bytearray()

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
                 "query_string": b"", "headers": [(b"host", b"127.0.0.1:8000")], "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8000), "state": {}}
        await app(scope, receive, send)
        if status != 200:
            raise RuntimeError(f"{path}: {status} {bytes(body)[:200]!r}")
        return status

    return call


async def _timed(fn: Any, keys: list[str], n: int, passes: int = 3) -> tuple[float, float]:
    """(wall, CPU) microseconds per call, the pass with the least CPU of ``passes`` (after a warm-up)."""
    for i in range(min(300, n)):
        await fn(keys[i % len(keys)])
    best = (float("inf"), float("inf"))
    for _ in range(passes):
        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            await fn(keys[i % len(keys)])
        wall, cpu = (time.perf_counter() - w0) / n * 1e6, (time.process_time() - c0) / n * 1e6
        if cpu < best[1]:
            best = (wall, cpu)
    return best


async def _interleaved(call_a: Any, call_b: Any, keys: list[str], bursts: int = 60, size: int = 256,
                       in_flight: int = 32) -> tuple[float, float, float]:
    """(A's, B's CPU microseconds per call, the median of the bursts' B/A ratios): bursts of ``size`` calls,
    ``in_flight`` at a time, A then B in turn, so the machine's drift (a shared host's speed changes
    within seconds) weighs on both alike."""
    async def burst(call: Any, n: int) -> float:
        async def worker(j: int) -> None:
            for i in range(j, n, in_flight):
                await call(keys[i % len(keys)])
        started = time.process_time()
        await asyncio.gather(*(worker(j) for j in range(in_flight)))
        return time.process_time() - started

    await burst(call_a, 2000)
    await burst(call_b, 2000)
    pairs = [(await burst(call_a, size), await burst(call_b, size)) for _ in range(bursts)]
    ratios = sorted(b / a for a, b in pairs)
    calls = bursts * size
    return sum(a for a, _ in pairs) / calls * 1e6, sum(b for _, b in pairs) / calls * 1e6, ratios[len(ratios) // 2]


def _package(filename: str) -> str:
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins (C calls)"
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts:
        i = parts.index("site-packages")
        return parts[i + 1].split(".")[0] if i + 1 < len(parts) else "site-packages"
    try:
        rel = path.resolve().relative_to(ROOT)
        return f"project: {rel.parts[0]}" if len(rel.parts) > 1 else f"project: {rel}"
    except ValueError:
        pass
    if "python3" in filename or "lib/python" in filename:
        i = max(k for k, p in enumerate(parts) if p.startswith("python3"))
        return f"stdlib: {Path(parts[i + 1]).stem}" if i + 1 < len(parts) else "stdlib"
    return filename


async def breakdown(settings: Any, redis_url: str, keys: list[str], n: int, profile_n: int) -> None:
    import cProfile
    import io
    import pstats

    from serving.api import queries
    from serving.api.app import create_app

    platform, bare, whatif = create_app(settings, redis_url=redis_url), bare_app(redis_url), \
        create_app(settings, redis_url=redis_url)
    swapped = what_if(whatif)
    call_a, call_b, call_w = _asgi_caller(platform), _asgi_caller(bare), _asgi_caller(whatif)
    async with _lifespan(platform), _lifespan(bare), _lifespan(whatif):
        store = platform.state.store
        view = platform.state.pipeline.view(VIEW)
        generation = int(await store.client.get(store.keys.current))
        rows_key = store.keys.rows(generation, VIEW)
        a_path = f"/v1/views/{VIEW}/keys/"
        steps = [
            ("zscore", "B's read: redis-py HGET of the row (one round trip)", lambda k: store.client.hget(rows_key, k)),
            ("read", "A's read: ServingStore.read (EVALSHA of the Lua read)",
             lambda k: store.read(VIEW, [(k, None)], ["count"], [])),
            ("answer", "A's answer: queries.key_answer (read + merge + KeyAnswer)",
             lambda k: queries.key_answer(store, view, k)),
            ("B", "B: bare app, whole ASGI call", lambda k: call_b(f"/bare/{k}")),
            ("A", "A: platform app, whole ASGI call", lambda k: call_a(a_path + k)),
            ("A async deps", f"what-if: A with get_store/get_pipeline async ({swapped} swapped)",
             lambda k: call_w(a_path + k)),
            ("A starlette", "what-if: A's answer on a plain Starlette Route, same app",
             lambda k: call_w(f"/fast/{VIEW}/keys/{k}")),
        ]
        print(f"\n  In this process (uvloop, no HTTP server, servers stopped), {n} sequential "
              "calls per row, best of 3 passes; wall includes the Redis round trip, CPU is this process only")
        cpu: dict[str, float] = {}
        for tag, name, fn in steps:
            wall, cpu[tag] = await _timed(fn, keys, n)
            print(f"  {name:<66} {wall:7.1f} us wall  {cpu[tag]:7.1f} us CPU")
        print(f"  A - B, whole ASGI call: {cpu['A'] - cpu['B']:+.1f} us CPU per request, of which")
        print(f"    Lua read instead of HGET (client side):              {cpu['read'] - cpu['zscore']:+7.1f} us")
        print(f"    merge + KeyAnswer model:                             {cpu['answer'] - cpu['read']:+7.1f} us")
        print(f"    FastAPI layer beyond B's (deps, params, auth, response model, metrics middleware): "
              f"{(cpu['A'] - cpu['answer']) - (cpu['B'] - cpu['zscore']):+7.1f} us")
        print(f"      of which sync dependencies run in the thread pool (what-if async): {cpu['A'] - cpu['A async deps']:+7.1f} us")
        print(f"  in-process CPU ratio B/A: as is {cpu['B'] / cpu['A']:.2f}; with async deps {cpu['B'] / cpu['A async deps']:.2f}; "
              f"on a plain Starlette route {cpu['B'] / cpu['A starlette']:.2f} (uvicorn's own per-request cost, the same "
              "for both, is not in these)")

        a_cpu, b_cpu, median = await _interleaved(lambda k: call_a(a_path + k), lambda k: call_b(f"/bare/{k}"), keys)
        print(f"  interleaved, 32 in flight (60 bursts of 256 calls, A then B in turn): A {a_cpu:.1f} us CPU, B {b_cpu:.1f} us "
              f"CPU per call; B/A {b_cpu / a_cpu:.2f}, median of the bursts' B/A {median:.2f} (the steadiest in-process "
              "figure on a noisy machine)")

        profiler = cProfile.Profile()
        for i in range(300):
            await call_a(f"/v1/views/{VIEW}/keys/{keys[i % len(keys)]}")
        profiler.enable()
        for i in range(profile_n):
            await call_a(f"/v1/views/{VIEW}/keys/{keys[i % len(keys)]}")
        profiler.disable()
    stats = pstats.Stats(profiler)
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    by_package: collections.Counter[str] = collections.Counter()
    for (filename, _, _), (_, _, tt, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_package[_package(filename)] += tt
    print(f"\n  cProfile of A's ASGI path as is ({profile_n} requests; cProfile inflates Python-heavy code: read shares, "
          f"not absolute times; ncalls of a coroutine counts its resumptions): own time by package, "
          f"{total / profile_n * 1e6:.0f} us/req profiled in all")
    for package, tt in by_package.most_common(14):
        print(f"  {package:<40} {tt / total * 100:5.1f} %  {tt / profile_n * 1e6:6.1f} us/req")
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(22)
    lines = buf.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("ncalls")), 0)
    print("\n  top functions by own time:")
    for line in lines[start:]:
        if line.strip():
            print("  " + line.replace(str(ROOT) + "/", "").replace(sys.prefix, "<venv>")[:200])
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(r"(serving|fastapi|starlette|pydantic|redis)", 30)
    lines = buf.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("ncalls")), 0)
    print("\n  top functions by cumulative time (serving, fastapi, starlette, pydantic, redis):")
    for line in lines[start:]:
        if line.strip():
            print("  " + line.replace(str(ROOT) + "/", "").replace(sys.prefix, "<venv>")[:200])

