"""Plain per-trajectory Python references for the built-in learner connectors."""

from __future__ import annotations

import math

import numpy as np

import rlconnect as rc


def trajectories(batch: rc.SampleBatch) -> list[list[int]]:
    """Row indices of each trajectory, grouped by (eps_id, agent_index) in a Python loop."""
    groups: dict[tuple, list[int]] = {}
    agent = batch.get("agent_index")
    for i, e in enumerate(batch["eps_id"].tolist()):
        key = (e, None if agent is None else int(agent[i]))
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def value(batch: rc.SampleBatch, row: int, after: bool, recurrent: bool) -> float:
    """ValuePolicy's value of a row's obs (state_in) or new_obs (state_out)."""
    obs = batch["new_obs" if after else "obs"][row]
    v = float(obs[0]) + 0.5 * float(obs[1])
    if recurrent:
        v += float(batch["state_out_0" if after else "state_in_0"][row][0])
    return v


def bootstrap(batch: rc.SampleBatch, rows: list[int], recurrent: bool) -> float:
    last = rows[-1]
    return 0.0 if batch["terminateds"][last] else value(batch, last, True, recurrent)


def gae(batch, gamma, lam, recurrent=False, values=None):
    adv = np.zeros(len(batch))
    for rows in trajectories(batch):
        vals = [
            value(batch, r, False, recurrent) if values is None else float(values[r]) for r in rows
        ]
        nxt = [*vals[1:], bootstrap(batch, rows, recurrent)]
        running = 0.0
        for j in reversed(range(len(rows))):
            delta = float(batch["rewards"][rows[j]]) + gamma * nxt[j] - vals[j]
            running = delta + gamma * lam * running
            adv[rows[j]] = running
    return adv


def returns(batch, gamma, recurrent=False):
    out = np.zeros(len(batch))
    for rows in trajectories(batch):
        g = bootstrap(batch, rows, recurrent)
        for r in reversed(rows):
            g = float(batch["rewards"][r]) + gamma * g
            out[r] = g
    return out


def n_step(batch, n, gamma):
    """(n_step_rewards, index of the n-step row, n_step_discount) per row."""
    sums, last, disc = np.zeros(len(batch)), np.zeros(len(batch), int), np.zeros(len(batch))
    for rows in trajectories(batch):
        for j, r in enumerate(rows):
            k = min(n, len(rows) - j)
            sums[r] = sum(gamma**i * float(batch["rewards"][rows[j + i]]) for i in range(k))
            end = rows[j + k - 1]
            last[r] = end
            terminal = end == rows[-1] and bool(batch["terminateds"][end])
            disc[r] = 0.0 if terminal else gamma**k
    return sums, last, disc


def vtrace(batch, target_logp, gamma, clip_rho, clip_c, clip_pg, recurrent=False):
    vs, pg = np.zeros(len(batch)), np.zeros(len(batch))
    for rows in trajectories(batch):
        vals = [value(batch, r, False, recurrent) for r in rows]
        boot = bootstrap(batch, rows, recurrent)
        rho = [math.exp(target_logp[r] - float(batch["action_logp"][r])) for r in rows]
        v_next, val_next = boot, boot
        for j in reversed(range(len(rows))):
            r = float(batch["rewards"][rows[j]])
            delta = min(clip_rho, rho[j]) * (r + gamma * val_next - vals[j])
            v = vals[j] + delta + gamma * min(clip_c, rho[j]) * (v_next - val_next)
            pg[rows[j]] = min(clip_pg, rho[j]) * (r + gamma * v_next - vals[j])
            vs[rows[j]] = v
            v_next, val_next = v, vals[j]
    return vs, pg
