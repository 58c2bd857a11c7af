"""The serving half of ``soak.py``: faulty client processes against a PolicyServer.

Run it through ``python benchmarks/soak.py --only serving`` (see that script's doc). Each
client process drives remote-inference episodes and, at seeded random points, abandons one
(``FAULTS``) or exits abruptly; the server side probes RSS, fds, threads, the episode hub's
maps and the connector states held, and checks the server still answers at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import struct
import threading
import time
from collections import Counter
from typing import Any

import gymnasium as gym
import numpy as np
from soak import Tracer, growth, probe

import rlconnect as rc

OBS = gym.spaces.Box(-10, 10, (4,), np.float32)
ACT = gym.spaces.Discrete(2)
FAULTS = ("abandon", "close", "cut", "inflight")


# -- serving soak: the client processes -------------------------------------------------------
def _raw(url: str, name: str, body: dict, half: bool) -> None:
    """POST ``body`` on a new socket and reset it (RST) at once; ``half`` sends half the body."""
    from rlconnect.serve.wire import encode

    host, port = url.removeprefix("http://").split(":")
    data = encode(body)
    head = (
        f"POST /v1/{name} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-msgpack\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + (data[: len(data) // 2] if half else data))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def client_main(url: str, seed: list[int], quota: int, opts: dict, pipe: Any) -> None:
    """Send ``quota`` requests (episodes with faults); report counts through ``pipe``."""
    from rlconnect.envs import TooManyEpisodesError
    from rlconnect.serve import PolicyClient

    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"sent": 0, "errors": Counter(), "faults": Counter(), "eps": Counter()}
    out["t0"] = time.time()
    client = PolicyClient(url, timeout_s=30.0, retry_timeout_s=30.0)

    def req(fn: Any, *a: Any) -> Any:
        out["sent"] += 1
        return fn(*a)

    while out["sent"] < quota:
        try:
            eid = req(client.start_episode, None, bool(rng.random() >= opts["untrained"]))
        except TooManyEpisodesError:
            out["errors"]["TooManyEpisodesError"] += 1
            time.sleep(0.05)
            continue
        out["eps"]["started"] += 1
        try:
            for _ in range(int(rng.integers(5, 50))):
                obs = rng.uniform(-1, 1, 4).astype(np.float32)
                if opts["kill_at"] is not None and out["sent"] >= opts["kill_at"]:
                    out["faults"]["kill"] += 1
                    out["eps"]["abandoned"] += 1
                    out["t1"] = time.time()
                    pipe.send(out)
                    os._exit(0)  # mid-episode, connection open: the kernel closes it
                if rng.random() < 1.0 / opts["fault_every"]:
                    kind = FAULTS[int(rng.integers(len(FAULTS)))]
                    out["faults"][kind] += 1
                    out["eps"]["abandoned"] += 1
                    if kind == "close":
                        client.close()
                    elif kind != "abandon":
                        out["sent"] += 1
                        _raw(url, "get_action", {"episode_id": eid, "obs": obs}, kind == "cut")
                    break
                req(client.get_action, eid, obs)
                req(client.log_returns, eid, 1.0)
            else:
                req(client.end_episode, eid, np.zeros(4, np.float32))
                out["eps"]["ended"] += 1
        except Exception as exc:  # counted by kind; the episode is lost, start another
            out["errors"][type(exc).__name__] += 1
            out["eps"]["lost"] += 1
    client.close()
    out["t1"] = time.time()
    pipe.send(out)


# -- serving soak: the server side -------------------------------------------------------------
def _held_states(runner: Any) -> int:
    """Inference env ids (< 0: episodes served without training) still holding connector
    state; peeks at the stateful connectors' slot tables. Lanes (>= 0) are bounded anyway."""
    held = 0
    for pid in runner.policies:
        for pipe in (runner.agent_pipeline(pid), runner.action_pipeline(pid)):
            for conn in pipe:
                table = getattr(conn, "_slots", None) or getattr(conn, "_table", None)
                held += sum(env_id < 0 for env_id in getattr(table, "_keys_of_env", ()))
    return held


def _hub_sizes(server: Any) -> dict[str, int]:
    return server.env.hub.counts()


def serving_soak(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Serve ``args.requests`` requests from ``args.clients`` faulty clients."""
    from rlconnect.errors import EnvError
    from rlconnect.serve import PolicyClient, PolicyServer

    stacked = gym.spaces.Box(-10, 10, (2, 4), np.float32)
    config = rc.RunnerConfig(framestack=2, rollout_fragment_length=200, seed=args.seed)
    server = PolicyServer(
        rc.MLPPolicy(stacked, ACT, seed=args.seed),
        "127.0.0.1",
        0,
        config=config,
        observation_space=OBS,
        max_concurrent=128,
        client_key="token",  # the client processes share one address
        episode_timeout_s=args.episode_timeout,
        get_action_timeout_s=20.0,
    )
    sampled: Counter[str] = Counter()

    def sample() -> None:
        while True:
            try:
                sampled["steps"] += server.runner.sample().count
                sampled["episodes"] += len(server.runner.get_metrics())
            except EnvError:
                return

    sampler = threading.Thread(target=sample, daemon=True, name="soak-sampler")
    sampler.start()
    ctx = mp.get_context("spawn")
    results: list[dict] = []
    quotas = [
        args.requests // args.clients + (i < args.requests % args.clients)
        for i in range(args.clients)
    ]

    def drive(i: int) -> None:
        left, life = quotas[i], 0
        rng = np.random.default_rng([args.seed, i])
        kill = int(rng.integers(quotas[i] // 4, quotas[i] // 2 + 1)) if i < args.kills else None
        while left > 0:
            opts = {"untrained": 0.1, "fault_every": args.fault_every, "kill_at": kill}
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=client_main, args=(server.url, [args.seed, i, life], left, opts, send)
            )
            proc.start()
            send.close()
            try:
                res = recv.recv()
            except EOFError:  # the process died without reporting: count it, stop the slot
                res = {"sent": left, "errors": {"ClientDied": 1}, "faults": {}, "eps": {}}
                res["t0"] = res["t1"] = time.time()
            proc.join(30)
            results.append(res)
            left, life, kill = left - res["sent"], life + 1, None

    drivers = [threading.Thread(target=drive, args=(i,)) for i in range(args.clients)]
    for d in drivers:
        d.start()
    series = [probe(requests=0, **_hub_sizes(server), held_states=0)]
    print(
        f"{'requests':>9} {'RSS MB':>8} {'fds':>5} {'threads':>7} {'open eps':>8} "
        f"{'timed out':>9} {'held':>5}",
        flush=True,
    )
    next_row, tracer = 0.0, Tracer(args.tracemalloc)
    while any(d.is_alive() for d in drivers) or not series[-1].get("final"):
        final = not any(d.is_alive() for d in drivers)
        if final:  # let every abandoned episode time out, then look once more
            time.sleep(args.episode_timeout + 2.0)
        else:
            time.sleep(args.interval)
        point = probe(
            requests=server.requests,
            **_hub_sizes(server),
            held_states=_held_states(server.runner),
            final=final,
        )
        series.append(point)
        if point["requests"] >= args.warmup * args.requests:
            tracer.warm()
        if point["requests"] >= next_row or final:
            next_row = point["requests"] + args.requests / 20
            print(
                f"{point['requests']:>9} {point['rss_mb']:>8.1f} {point['fds']:>5} "
                f"{point['threads']:>7} {point['open_episodes']:>8} "
                f"{point['timed_out_ids']:>9} {point['held_states']:>5}",
                flush=True,
            )
    for d in drivers:
        d.join()
    tracer.report()
    # still answering: a fresh client runs one whole episode
    with PolicyClient(server.url, retry_timeout_s=5.0) as client:
        eid = client.start_episode()
        for _ in range(5):
            client.get_action(eid, np.zeros(4, np.float32))
        client.end_episode(eid, np.zeros(4, np.float32))
        answering = bool(client.health()["ok"])
    total: dict[str, Any] = {k: Counter() for k in ("errors", "faults", "eps")}
    for res in results:
        for k in total:
            total[k].update(res[k])
    wall = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    sent = sum(r["sent"] for r in results)
    end = series[-1]
    summary = {
        "requests": sent,
        "server_requests": server.requests,
        "clients": args.clients,
        "processes": len(results),
        "wall_s": round(wall, 1),
        "requests_per_s": round(sent / wall),
        "faults": dict(total["faults"]),
        "client_errors": dict(total["errors"]),
        "server_error_answers": server.errors,
        "episodes": dict(total["eps"]),
        "timed_out_by_server": end["timed_out_ids"],
        "open_episodes_end": end["open_episodes"],
        "max_open_episodes": max(p["open_episodes"] for p in series),
        "max_queued": max(p["queued"] for p in series),
        "queued_end": end["queued"],
        "finished_ids_end": end["finished_ids"],
        "held_states_end": end["held_states"],
        "sampled_steps": sampled["steps"],
        "server_disconnects": server.disconnects,
        "answering": answering,
        **growth(series, "requests", args.warmup, 1e5),
        "fds": [series[1]["fds"], max(p["fds"] for p in series), end["fds"]],
        "threads": [series[1]["threads"], max(p["threads"] for p in series), end["threads"]],
    }
    server.stop()
    sampler.join(10)
    return series, summary
