"""The rows of one poll of env workers: from the shared block, or from the pipes."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import tree

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.envs.base import EnvRows
from rlconnect.envs.rows import EnvRowsBuilder, errors_only
from rlconnect.envs.workers.handle import WorkerHandle
from rlconnect.envs.workers.layout import ST_ROW, SharedArrays
from rlconnect.envs.workers.worker import decode_error
from rlconnect.spaces import unstack_batch

__all__ = ["block_rows", "concat_rows", "decode_replies"]


def decode_replies(
    workers: list[WorkerHandle],
    replies: list[bytes],
    errors: dict[int, BaseException],
    warned: set[int],
) -> tuple[dict[int, dict], list[EnvRows]]:
    """Non-empty infos by env id and rows sent through the pipes (env ids made global);
    sub-envs that raised are added to ``errors``. A sub-env whose infos could not leave
    its worker gets one warning (``warned``: the sub-envs warned about already)."""
    infos: dict[int, dict] = {}
    piped: list[EnvRows] = []
    for w, raw in zip(workers, replies):
        if not raw:
            continue
        w_infos, w_errors, rows, unpicklable = pickle.loads(raw)  # from our own worker
        for local, payload in w_errors.items():
            errors[w.lo + local] = decode_error(payload, f"sub-env {w.lo + local}")
        for local, why in (unpicklable or {}).items():
            _warn_unpicklable(w.lo + local, why, warned)
        if w_infos:
            infos.update({w.lo + i: v for i, v in w_infos.items()})
        if rows is not None:
            piped.append(rows.shifted(w.lo))
    return infos, piped


def _warn_unpicklable(env_id: int, why: str, warned: set[int]) -> None:
    if env_id in warned:
        return
    warned.add(env_id)
    warnings.warn(
        f"sub-env {env_id}: an info that cannot be pickled cannot leave its env worker "
        f"process ({why}); such rows carry {{'unpicklable_info': repr(info)}} instead, the "
        "other rows keep their infos (said once per sub-env; num_env_workers=0 keeps such "
        "infos as they are)",
        RuntimeWarning,
        stacklevel=4,
    )


def block_rows(
    a: SharedArrays,
    spans: list[tuple[int, int]],
    full: bool,
    all_ids: np.ndarray,
    infos: dict[int, dict],
    errors: dict[int, BaseException],
) -> EnvRows:
    """The rows the answering workers (sub-envs ``lo .. hi - 1`` each) wrote to the block,
    copied out of it; ``full``: every worker answered."""
    # (a status is ST_ROW or 0: counting is one C call, comparing first is not)
    in_order = full and np.count_nonzero(a.status) == len(a.status)
    if in_order:
        ids: Any = all_ids
        obs = a.obs.copy() if type(a.obs) is np.ndarray else tree.map_structure(np.copy, a.obs)
        first, rew, term, trunc = a.first.copy(), a.rew.copy(), a.term.copy(), a.trunc.copy()
    else:
        parts = [np.arange(lo, hi) for lo, hi in spans]
        span = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        ids = span[a.status[span] == ST_ROW]
        obs = tree.map_structure(lambda v: v[ids], a.obs)
        first, rew, term, trunc = a.first[ids], a.rew[ids], a.term[ids], a.trunc[ids]
    # sub-envs without an info share one read-only empty mapping (no dict per row)
    info_list = (
        [infos.get(i, EMPTY_INFO) for i in ids.tolist()] if infos else [EMPTY_INFO] * len(ids)
    )
    if not in_order:
        rows = EnvRowsBuilder.columns(ids, obs, rew, term, trunc, info_list, first)
        return rows.without_envs(errors) if errors else rows
    # every sub-env has a row: what a worker writes is checked already (float64 rewards,
    # first rows without reward or flags), so only what the columns imply is derived
    rows = EnvRows(
        ids, (DEFAULT_AGENT_ID,) * len(ids), obs, rew, term, trunc, info_list, first, True
    )
    return rows.without_envs(errors) if errors else rows


def concat_rows(parts: list[EnvRows], errors: dict[int, BaseException]) -> EnvRows:
    """Rows that came through the pipes (multi-agent envs, spaces that are not arrays):
    observations stay one batch when every part with rows has them stacked."""
    if not parts:
        return errors_only(errors)
    if len(parts) == 1 and not errors:
        return parts[0]
    obs: Any
    with_rows = [p for p in parts if len(p)]
    stacked = bool(with_rows) and all(p.stacked for p in with_rows)
    if stacked:
        obs = tree.map_structure(lambda *xs: np.concatenate(xs), *[p.obs for p in with_rows])
    else:
        obs = [o for p in with_rows for o in (unstack_batch(p.obs) if p.stacked else p.obs)]
    return EnvRows(
        env_ids=np.concatenate([p.env_ids for p in parts]),
        agent_ids=tuple(a for p in parts for a in p.agent_ids),
        obs=obs,
        rewards=np.concatenate([p.rewards for p in parts]),
        terminateds=np.concatenate([p.terminateds for p in parts]),
        truncateds=np.concatenate([p.truncateds for p in parts]),
        infos=[i for p in parts for i in p.infos],
        is_first=np.concatenate([p.is_first for p in parts]),
        single_agent=all(p.single_agent for p in parts),
        ended={e: f for p in parts for e, f in p.ended.items()},
        extra_rewards=[x for p in parts for x in p.extra_rewards],
        errors=errors,
        also_stepped=tuple(e for p in parts for e in p.also_stepped),
    )
