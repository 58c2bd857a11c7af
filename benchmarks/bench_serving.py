"""How many actions/s does policy serving give over loopback HTTP, and at what latency?

Besides actions/s and p50/p99 it reports the server's CPU per action and how many rows
share a forward pass.

A PolicyServer (MLPPolicy on a 4-float observation, Discrete(2)) runs in its own process
with a thread sampling 256-step batches. One load-generator process drives N clients, each
an asyncio task on its own keep-alive connection running 20-step episodes. ``remote``:
every step is one ``get_action`` carrying the previous step's reward. ``local``: the
client chose its actions and ships each episode as one ``report``; its actions/s is what
the server recorded, p50/p99 the time of a report. The generator writes raw HTTP/1.1 and
reads answers with asyncio streams, so one process keeps 256 clients busy without being
the limit (its own CPU share of one core is printed).

Per row (N = 1, 16, 64, 256; a fresh server per run, ``--runs`` runs, medians and ranges):
actions/s over the measured window, p50/p99 of a request as the client sees it,
server process CPU time per action (all its threads: event loop, sampling, inference),
rows per forward pass (observations per sampling step), and a check that every episode's
rows were recorded exactly, in order: the server's batches hold one row per answered
``get_action``, and within each episode the step counter the client put in the
observation increases by one.

    python benchmarks/bench_serving.py [--quick] [--seconds 4] [--runs 3]
        [--clients 1 16 64 256] [--batch-wait-ms 2]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
from _common import machine

import rlconnect as rc
from rlconnect.errors import EnvError
from rlconnect.serve import PolicyServer
from rlconnect.serve.wire import decode, encode

OBS = gym.spaces.Box(-1e6, 1e6, (4,), np.float32)
ACT = gym.spaces.Discrete(2)
STEPS = 20


# -- the server process ---------------------------------------------------------------------
class Recorder:
    """Samples the server's runner in a thread; keeps the recorded rows and counts polls."""

    def __init__(self, server: PolicyServer) -> None:
        self.server = server
        self.obs: list[np.ndarray] = []
        self.polls = self.rows = 0
        hub = server.env.hub
        take = hub.take_batch

        def counted(*args: Any) -> tuple[list, list]:
            events, tasks = take(*args)
            if events:
                self.polls += 1
                self.rows += len(events)
            return events, tasks

        hub.take_batch = counted
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while True:
            try:
                batch = self.server.runner.sample()
            except EnvError:  # stopped
                return
            self.obs.append(np.asarray(batch["obs"]))


def exact_and_ordered(obs: np.ndarray) -> bool:
    """Within every (client, episode) the step counters are 0, 1, 2, ... in batch order."""
    if not len(obs):
        return True
    key = obs[:, 0].astype(np.int64) * 1_000_000 + obs[:, 1].astype(np.int64)
    order = np.argsort(key, kind="stable")
    k, t = key[order], obs[order, 2].astype(np.int64)
    first = np.r_[True, k[1:] != k[:-1]]
    expected = np.arange(len(t)) - np.maximum.accumulate(np.where(first, np.arange(len(t)), 0))
    return bool(np.array_equal(t, expected))


def server_main(conn: Any, batch_wait_s: float, max_concurrent: int) -> None:
    policy = rc.MLPPolicy(OBS, ACT, seed=0)
    config = rc.RunnerConfig(rollout_fragment_length=256)
    server = PolicyServer(
        policy,
        "127.0.0.1",
        0,
        config=config,
        max_concurrent=max_concurrent,
        max_episodes_per_client=max_concurrent,  # every load client shares one address
        batch_wait_s=batch_wait_s,
    )
    rec = Recorder(server)
    conn.send(server.port)
    while True:
        msg = conn.recv()
        if msg == "stats":
            conn.send((time.process_time(), rec.polls, rec.rows))
        elif msg == "check":
            rows = sum(len(o) for o in rec.obs)
            conn.send((rows, exact_and_ordered(np.concatenate(rec.obs) if rec.obs else OBS_0)))
        else:
            break
    server.stop()
    rec.thread.join(10)


OBS_0 = np.zeros((0, 4), np.float32)


# -- the load generator ---------------------------------------------------------------------
class Conn:
    """One keep-alive HTTP/1.1 connection speaking the server's msgpack POSTs."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, name: str, body: dict) -> Any:
        data = encode(body)
        self.writer.write(
            b"POST /v1/%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-msgpack\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (name.encode(), len(data), data)
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        out = decode(await self.reader.readexactly(length))
        if status == 503:
            raise Busy(out)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {out}")
        return out


class Busy(Exception):
    """HTTP 503: the server asks the client to retry later."""


async def client(port: int, cid: int, stop: asyncio.Event, lat: list[float], go: Any) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = Conn(reader, writer)
    rng = np.random.default_rng(cid)
    episodes = 0
    actions = 0
    while not stop.is_set():
        eid = (await conn.post("start_episode", {}))["episode_id"]
        reward = None
        for t in range(STEPS):
            obs = np.array([cid, episodes, t, rng.uniform()], np.float32)
            body: dict[str, Any] = {"episode_id": eid, "obs": obs}
            if reward is not None:
                body["reward"] = reward
            t0 = time.perf_counter()
            await conn.post("get_action", body)
            if go():
                lat.append(time.perf_counter() - t0)
            actions += 1
            reward = 1.0
        await conn.post("end_episode", {"episode_id": eid, "obs": np.zeros(4, np.float32)})
        episodes += 1
    writer.close()
    return actions


async def reporter(port: int, cid: int, stop: asyncio.Event, lat: list[float], go: Any) -> int:
    """A local-inference client: it chose its actions itself and ships each episode as one
    ``report`` (start, 20 logged actions with rewards, end), retrying when told to (503)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = Conn(reader, writer)
    rng = np.random.default_rng(cid)
    episodes = actions = 0
    while not stop.is_set():
        eid = f"{cid}-{episodes}"
        commands: list[list[Any]] = [["start_episode", {"episode_id": eid}]]
        for t in range(STEPS):
            obs = np.array([cid, episodes, t, rng.uniform()], np.float32)
            commands.append(["log_action", {"episode_id": eid, "obs": obs, "action": t % 2}])
            commands.append(["log_returns", {"episode_id": eid, "reward": 1.0}])
        commands.append(["end_episode", {"episode_id": eid, "obs": np.zeros(4, np.float32)}])
        t0 = time.perf_counter()
        while True:
            try:
                await conn.post("report", {"commands": commands})
                break
            except Busy:
                await asyncio.sleep(0.05)
        if go():
            lat.append(time.perf_counter() - t0)
        actions += STEPS
        episodes += 1
    writer.close()
    return actions


async def drive(
    port: int, mode: str, clients: int, warmup: float, seconds: float, pipe: Any
) -> dict:
    stop = asyncio.Event()
    lat: list[float] = []
    window = {"on": False}
    run = client if mode == "remote" else reporter
    tasks = [
        asyncio.create_task(run(port, c, stop, lat, lambda: window["on"])) for c in range(clients)
    ]
    await asyncio.sleep(warmup)
    pipe.send("stats")
    cpu0, polls0, rows0 = pipe.recv()
    gen0, t0 = time.process_time(), time.perf_counter()
    window["on"] = True
    await asyncio.sleep(seconds)
    window["on"] = False
    pipe.send("stats")
    cpu1, polls1, rows1 = pipe.recv()
    wall, gen = time.perf_counter() - t0, time.process_time() - gen0
    stop.set()
    sent = sum(await asyncio.gather(*tasks))
    recorded = rows1 - rows0  # what the server took in the window, not what clients sent
    return {
        "actions_s": (len(lat) if mode == "remote" else recorded) / wall,
        "p50_ms": 1e3 * float(np.percentile(lat, 50)),
        "p99_ms": 1e3 * float(np.percentile(lat, 99)),
        "cpu_ms": 1e3 * (cpu1 - cpu0) / max(rows1 - rows0, 1),
        "rows_per_pass": (rows1 - rows0) / max(polls1 - polls0, 1),
        "generator_cpu": gen / wall,
        "sent": sent,
    }


def run_once(mode: str, clients: int, seconds: float, batch_wait_s: float) -> dict:
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=server_main, args=(theirs, batch_wait_s, max(2 * clients, 64)))
    proc.start()
    port = mine.recv()
    out = asyncio.run(drive(port, mode, clients, min(1.0, seconds / 2), seconds, mine))
    deadline = time.monotonic() + 30
    while True:  # every answered action must reach a batch
        mine.send("check")
        rows, ordered = mine.recv()
        if rows >= out["sent"] - 256 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    out["recorded_ok"] = ordered and out["sent"] - 256 <= rows <= out["sent"]
    mine.send("stop")
    proc.join(30)
    return out


def summary(values: list[float], fmt: str) -> str:
    med = float(np.median(values))
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a row per mode, 1 run of 0.5 s each")
    ap.add_argument("--seconds", type=float, default=4.0, help="measured time per run")
    ap.add_argument("--runs", type=int, default=3, help="fresh servers per row")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--local", type=int, nargs="*", default=[16], help="clients, local rows")
    ap.add_argument("--batch-wait-ms", type=float, default=2.0)
    args = ap.parse_args()
    rows = [("remote", n) for n in args.clients] + [("local", n) for n in args.local]
    if args.quick:  # one row per mode (a fresh server process each), 1 run of 0.5 s
        rows = [("remote", 4), ("local", 4)]
    runs, seconds = (1, 0.5) if args.quick else (args.runs, args.seconds)
    print(machine())
    print(
        f"{'mode':6}  {'clients':>7}  {'actions/s':>18}  {'p50 ms':>16}  {'p99 ms':>16}  "
        f"{'server CPU ms/action':>20}  {'rows/pass':>16}  {'gen CPU':>7}  exact"
    )
    for mode, n in rows:
        res = [run_once(mode, n, seconds, args.batch_wait_ms / 1e3) for _ in range(runs)]
        col = {k: [r[k] for r in res] for k in res[0]}
        print(
            f"{mode:6}  {n:>7}  {summary(col['actions_s'], '.0f'):>18}  "
            f"{summary(col['p50_ms'], '.1f'):>16}"
            f"  {summary(col['p99_ms'], '.1f'):>16}  {summary(col['cpu_ms'], '.2f'):>20}  "
            f"{summary(col['rows_per_pass'], '.1f'):>16}  "
            f"{float(np.median(col['generator_cpu'])):>7.0%}  {all(col['recorded_ok'])}",
            flush=True,
        )


if __name__ == "__main__":
    main()
