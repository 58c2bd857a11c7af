"""A PolicyClient in its own process, for the serving tests: ``python client_proc.py JSON``.

Scenarios (``args["scenario"]``) drive episodes against the server and print one JSON line
with what they sent, so the test can check the runner's batches row by row. Episode ``k``'s
observations are ``[k, t, last_action]``; odd steps are logged off-policy with action 2.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time

import numpy as np

from rlconnect.envs import TooManyEpisodesError, UnknownEpisodeError
from rlconnect.serve import PolicyClient


def episode(client: PolicyClient, k: int, length: int, off_policy: bool = True) -> dict:
    eid = client.start_episode()
    obs, steps = [k, 0, -1], []
    for t in range(length):
        if off_policy and t % 2:
            a = 2
            client.log_action(eid, np.asarray(obs, np.float32), a)
        else:
            a = int(client.get_action(eid, np.asarray(obs, np.float32)))
        client.log_returns(eid, 1.0 + a)
        steps.append([obs, a, 1.0 + a])
        obs = [k, t + 1, a]
    client.end_episode(eid, np.asarray(obs, np.float32))
    return {"k": k, "steps": steps, "final": obs}


def raw_post(url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    from rlconnect.serve.wire import decode

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", path, body, {"Content-Type": "application/x-msgpack"} | (headers or {}))
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    try:
        return resp.status, decode(payload)
    except Exception:
        return resp.status, {"raw": payload.decode(errors="replace")}


def scenario_episodes(args: dict) -> dict:
    client = PolicyClient(args["url"], args.get("mode", "remote"), args.get("update", 0.2))
    n, threads, out = args["episodes"], args.get("threads", 1), []
    lock = threading.Lock()

    def work(j: int) -> None:
        for k in range(j, n, threads):
            rec = episode(client, k, args.get("length", 5))
            with lock:
                out.append(rec)

    ths = [threading.Thread(target=work, args=(j,)) for j in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    client.close()
    return {"episodes": out}


def scenario_vanish(args: dict) -> dict:
    client = PolicyClient(args["url"])
    eid = client.start_episode("vanishing")
    for t in range(3):
        client.get_action(eid, np.asarray([99, t, -1], np.float32))
        client.log_returns(eid, 1.0)
    print(json.dumps({"started": eid}), flush=True)
    os._exit(0)  # gone without end_episode


def scenario_bad(args: dict) -> dict:
    from rlconnect.serve.wire import encode

    url, res = args["url"], {}
    res["garbage"] = raw_post(url, "/v1/get_action", b"\xc1\xc1 not msgpack")
    res["not_a_map"] = raw_post(url, "/v1/get_action", encode([1, 2]))
    res["missing"] = raw_post(url, "/v1/get_action", encode({"obs": [1.0, 2.0, 3.0]}))
    res["no_endpoint"] = raw_post(url, "/v1/launch_missiles", encode({}))
    res["unknown_eid"] = raw_post(
        url, "/v1/get_action", encode({"episode_id": "nope", "obs": np.zeros(3, np.float32)})
    )
    client = PolicyClient(url)
    eid = client.start_episode()
    res["bad_shape"] = raw_post(
        url, "/v1/get_action", encode({"episode_id": eid, "obs": np.zeros(5, np.float32)})
    )
    res["bad_reward"] = raw_post(
        url, "/v1/log_returns", encode({"episode_id": eid, "reward": "lots"})
    )
    res["duplicate"] = raw_post(url, "/v1/start_episode", encode({"episode_id": eid}))
    client.end_episode(eid, np.zeros(3, np.float32))
    res["after"] = episode(client, 7, 3)  # the server keeps serving
    return {k: list(v) if isinstance(v, tuple) else v for k, v in res.items()}


def scenario_too_many(args: dict) -> dict:
    client = PolicyClient(args["url"])
    ids = [client.start_episode() for _ in range(args["max_concurrent"])]
    try:
        client.start_episode()
        err = None
    except TooManyEpisodesError as exc:
        err = str(exc)
    client.end_episode(ids[0], np.zeros(3, np.float32))
    client.start_episode()  # room again
    return {"error": err}


def scenario_restart(args: dict) -> dict:
    client = PolicyClient(args["url"], retry_timeout_s=20)
    done, lost, deadline = [], 0, time.monotonic() + 25

    def report_first_retry() -> None:  # tells the test when the server is missed
        while client.retries == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        print(json.dumps({"retrying": client.retries}), flush=True)

    threading.Thread(target=report_first_retry, daemon=True).start()
    k = 0
    while len(done) < args["episodes"] and time.monotonic() < deadline:
        try:
            started = time.time()
            done.append({**episode(client, k, 4), "started": started})
            print(json.dumps({"done": k}), flush=True)
        except UnknownEpisodeError:  # the restarted server does not know it: start anew
            lost += 1
        k += 1
        time.sleep(0.05)
    return {"episodes": done, "lost": lost, "retries": client.retries}


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    print(json.dumps(globals()[f"scenario_{a['scenario']}"](a)), flush=True)
