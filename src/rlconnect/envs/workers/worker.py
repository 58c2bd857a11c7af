"""The env worker process: it steps a contiguous group of sub-envs with the in-process
adapters (``GymEnvs`` / ``MultiAgentEnvs``), so autoreset, per-sub-env errors, restarts,
checks and seeding are exactly those of sub-envs stepped in the runner's process.

Protocol on the worker's pipe (bytes, framed as ``multiprocessing.connection`` frames
them, read and written by ``frames`` on the hot path; it never pickles for array spaces):

- worker -> runner, once after start: a pickled ``Hello`` (spaces, or the build error);
- runner -> worker: a pickled ``("attach", block name, layout)``; then per poll ``b"p"``
  (``poll_message``: commands and actions are in the block) or a pickled ``("poll",
  extra)`` carrying restarts and actions the block cannot hold; ``("restart", local
  index)``; ``b"c"`` closes;
- worker -> runner per poll: ``b""`` (everything is in the block) or a pickled
  ``(infos, errors, rows, unpicklable)``: non-empty infos by local index, error payloads by
  local index, the rows themselves when they cannot live in the block (multi-agent envs,
  spaces that are not arrays), and the sub-envs whose infos could not be pickled.

Between polls a worker blocks reading its pipe: waiting for a slow policy costs it no CPU.
"""

from __future__ import annotations

import contextlib
import pickle
import re
import signal
import traceback
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from operator import itemgetter
from typing import Any

import attrs
import cloudpickle
import gymnasium as gym
import numpy as np
import tree

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.base import BaseEnv, EnvRows, NotAnEnvError
from rlconnect.envs.external import ExternalEnv
from rlconnect.envs.gym_envs import DenseColumns, GymEnvs
from rlconnect.envs.multi_agent import MultiAgentEnvs
from rlconnect.envs.sub_envs import EnvContext, sub_env_context
from rlconnect.envs.workers.frames import frame, read_frame, write_frame
from rlconnect.envs.workers.layout import (
    CMD_NONE,
    CMD_RESET,
    CMD_SOFT,
    CMD_STEP,
    CMD_STEP_PIPED,
    ST_ROW,
    SharedArrays,
    SharedBlock,
)
from rlconnect.envs.workers.lifeline import Lifeline
from rlconnect.envs.workers.tuning import tune_worker_process
from rlconnect.errors import EnvCheckError, EnvError, describe_exception

__all__ = ["GroupSpec", "Hello", "decode_error", "encode_error", "poll_message", "worker_main"]

ErrorPayload = tuple[str, str, str, bytes | None]
_POLL = frame(b"p")


def poll_message(extra: dict[str, Any] | None = None) -> bytes:
    """The runner's "poll" to a worker, framed (``frames``): ``b"p"``, or with ``extra``
    (restarts, actions the block cannot hold) a pickled ``("poll", extra)``."""
    if extra is None:
        return _POLL
    return frame(pickle.dumps(("poll", extra)))


@attrs.define(frozen=True)
class GroupSpec:
    """What a worker builds: sub-envs ``offset .. offset + size - 1`` of ``num_envs``."""

    offset: int
    size: int
    num_envs: int
    seed: int | None
    worker_index: int
    env_config: dict[str, Any]
    restarts: tuple[int, ...]

    def local_context(self, local: int, restarts_here: int) -> EnvContext:
        """The EnvContext of the group's sub-env ``local`` after ``restarts_here`` restarts
        in this process: the one the runner's process would build it with, restarts in
        replaced worker processes counted too."""
        restarts = self.restarts[local] + restarts_here
        return sub_env_context(
            self.offset + local,
            self.num_envs,
            self.worker_index,
            self.seed,
            restarts,
            self.env_config,
        )


@attrs.define(frozen=True)
class Hello:
    """A worker's first message: its envs' spaces, or why they could not be built."""

    multi_agent: bool = False
    obs_space: Any = None
    act_space: Any = None
    possible_agents: tuple = ()
    obs_spaces: dict = attrs.field(factory=dict)
    act_spaces: dict = attrs.field(factory=dict)
    error: ErrorPayload | None = None


def encode_error(exc: BaseException) -> ErrorPayload:
    """What the runner needs to report ``exc``: the exception itself only when it survives
    a pickle round trip."""
    blob: bytes | None
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return type(exc).__name__, describe_exception(exc), tb, blob


def decode_error(payload: ErrorPayload, where: str) -> BaseException:
    """The worker's exception as itself when it could be sent, else an ``EnvError``."""
    _name, text, tb, blob = payload
    if blob is not None:
        with contextlib.suppress(Exception):
            exc = pickle.loads(blob)  # written by our own worker process, checked there
            if isinstance(exc, BaseException):
                note = getattr(exc, "add_note", None)  # Python >= 3.11
                if note is not None:
                    note(f"raised in the worker process of {where}:\n{tb}")
                return exc
    return EnvError(f"{text} (in the worker process of {where})\n{tb}")


def _build(creator: Callable[[EnvContext], Any], spec: GroupSpec) -> tuple[BaseEnv, Hello]:
    envs = [creator(spec.local_context(i, 0)) for i in range(spec.size)]
    first = envs[0]
    if isinstance(first, gym.Env):
        group: BaseEnv = GymEnvs(creator, spec.size, envs=envs, contexts=spec.local_context)
        hello = Hello(obs_space=first.observation_space, act_space=first.action_space)
        return group, hello
    if hasattr(first, "observation_spaces") and hasattr(first, "step"):
        multi = MultiAgentEnvs(creator, spec.size, envs=envs, contexts=spec.local_context)
        return multi, Hello(
            multi_agent=True,
            possible_agents=multi.possible_agents,
            obs_spaces=dict(first.observation_spaces),
            act_spaces=dict(first.action_spaces),
        )
    if not isinstance(first, BaseEnv | ExternalEnv):
        raise NotAnEnvError(f"env creator returned {type(first).__name__}, which is not an env")
    raise TypeError(
        "env worker processes (num_env_workers >= 1 or remote_envs=True) step gymnasium envs "
        f"and multi-agent envs, but the env creator returned {type(first).__name__}; use "
        "num_env_workers=0 and remote_envs=False to build it in the runner's process"
    )


def _global_names(exc: BaseException, offset: int) -> BaseException:
    """An ``EnvCheckError`` of the group names local sub-envs: name the global ones."""
    if not isinstance(exc, EnvCheckError) or not offset:
        return exc
    text = re.sub(r"\benv (\d+) /", lambda m: f"env {int(m[1]) + offset} /", str(exc))
    return EnvCheckError(text)


class _Server:
    """The worker's side of one poll: read commands, poll the group, write the results."""

    def __init__(self, group: BaseEnv, spec: GroupSpec, arrays: SharedArrays) -> None:
        self.group, self.spec, self.a = group, spec, arrays
        self.lo, self.hi = spec.offset, spec.offset + spec.size
        self.span = slice(self.lo, self.hi)
        self.local_ids = np.arange(spec.size)
        self.agents = (DEFAULT_AGENT_ID,) * spec.size
        self.in_block = not group.is_multi_agent and arrays.obs is not None
        # a dense poll of gymnasium envs goes into the block as columns (no EnvRows)
        self.poll_group = (
            group.poll_columns if isinstance(group, GymEnvs) and self.in_block else group.poll
        )

    def restart(self, local: int) -> bytes:
        """Rebuild sub-env ``local``: ``b""``, or a pickled ``(cause, message)`` of the
        failure (the message names the sub-env globally, both causes in it)."""
        try:
            self.group.try_restart(local)
        except Exception as exc:
            where = f"sub-env {self.lo + local}"
            if isinstance(exc, EnvError):  # the group's own words, naming the local index
                told = describe_exception(exc).removeprefix(f"{type(exc).__name__}: ")
                text = re.sub(r"^sub-env \d+", where, told)
            else:
                text = f"{where} could not be rebuilt: {describe_exception(exc)}"
            return pickle.dumps((encode_error(exc.__cause__ or exc), text))
        return b""

    def poll(self, extra: dict[str, Any] | None) -> bytes:
        errors: dict[int, ErrorPayload] = {}
        if extra:
            for local in extra.get("restart", ()):
                reply = self.restart(local)
                if reply:
                    errors[local] = pickle.loads(reply)[0]
        self._command()
        group = self.group
        if extra:
            for ids, agents, acts in extra.get("actions", ()):
                group.send_actions(ids, agents, acts)
        out = self.poll_group()
        if isinstance(out, DenseColumns):  # every sub-env has a row
            obs, rewards, term, trunc, infos, first = out
            self._write(self.span, obs, rewards, term, trunc, False if first is None else first)
            return self._reply(self.local_ids, infos, errors)
        rows = out
        for local, exc in rows.errors.items():
            errors[local] = encode_error(_global_names(exc, self.lo))
        self.a.status[self.span] = 0
        if not self.in_block:
            return self._pickled(None, errors, rows._replace(errors={}))
        ids = rows.env_ids
        where = self.span if len(ids) == self.hi - self.lo else ids + self.lo
        self._write(where, rows.obs, rows.rewards, rows.terminateds, rows.truncateds, rows.is_first)
        return self._reply(ids, rows.infos, errors)

    def _command(self) -> None:
        """Hand the group the runner's commands (steps with their actions, resets)."""
        a, lo, hi, group = self.a, self.lo, self.hi, self.group
        codes = a.cmd[lo:hi].copy()
        act = a.act
        plain = type(act) is np.ndarray
        others = (codes != CMD_STEP).nonzero()[0]
        other_codes = codes[others].tolist()  # a few resets, usually
        if plain and CMD_NONE not in other_codes and CMD_STEP_PIPED not in other_codes:
            # every sub-env steps or resets (the common poll): one copy of the group's
            # actions, and the resets below drop those of the sub-envs they reset
            group.send_actions(self.local_ids, self.agents, act[lo:hi].copy())
        else:
            step = (codes == CMD_STEP).nonzero()[0]
            if len(step):
                acts = (
                    act[lo:hi][step] if plain else tree.map_structure(lambda v: v[lo:hi][step], act)
                )
                group.send_actions(step, self.agents[: len(step)], acts)
        for local, code in zip(others.tolist(), other_codes):
            if code == CMD_RESET:
                group.try_reset(local)
            elif code == CMD_SOFT:
                group.soft_reset(local)

    def _write(self, where: Any, obs: Any, rew: Any, term: Any, trunc: Any, first: Any) -> None:
        """Rows into the block, at ``where`` (the group's slice, or global indices)."""
        a = self.a
        if type(obs) is np.ndarray and type(a.obs) is np.ndarray:
            a.obs[where] = obs
        else:
            for view, leaf in zip(a.obs_leaves, tree.flatten(obs)):
                view[where] = leaf
        a.rew[where] = rew
        a.term[where] = term
        a.trunc[where] = trunc
        a.first[where] = first
        a.status[where] = ST_ROW

    def _reply(
        self, ids: np.ndarray, infos: Sequence[Mapping], errors: dict[int, ErrorPayload]
    ) -> bytes:
        """What goes back by pipe: nothing when everything is in the block."""
        if not errors and not any(infos):
            return b""
        return self._pickled({i: v for i, v in zip(ids.tolist(), infos) if v}, errors, None)

    def _pickled(self, infos: Any, errors: dict[int, ErrorPayload], rows: EnvRows | None) -> bytes:
        """The reply ``(infos, errors, rows, unpicklable)``; ``unpicklable`` names the
        sub-envs (local index: why) whose infos could not be pickled and were replaced,
        each row's own only, by ``{"unpicklable_info": repr(info)}``. A sub-env whose
        observation cannot be pickled is that sub-env's error, its rows left out."""
        try:
            return pickle.dumps((infos, errors, rows, None))
        except Exception:  # an info or an observation of some sub-env
            pass
        unpicklable: dict[int, str] = {}
        if infos:
            infos = {i: _picklable(v, i, unpicklable) for i, v in infos.items()}
        if rows is not None:
            ids = rows.env_ids.tolist()
            rows = rows._replace(
                infos=[_picklable(v, i, unpicklable) for i, v in zip(ids, rows.infos)]
            )
            rows = self._without_unpicklable_obs(rows, errors)
        return pickle.dumps((infos, errors, rows, unpicklable))

    def _without_unpicklable_obs(self, rows: EnvRows, errors: dict[int, ErrorPayload]) -> EnvRows:
        """``rows`` less those of every sub-env with an observation that cannot be pickled,
        whose ``EnvCheckError`` (naming the sub-env and agent) goes into ``errors``."""
        bad: dict[int, BaseException] = {}
        for k, (local, agent) in enumerate(zip(rows.env_ids.tolist(), rows.agent_ids)):
            if local in bad:
                continue
            obs = tree.map_structure(itemgetter(k), rows.obs) if rows.stacked else rows.obs[k]
            why = _pickle_failure(obs)
            if why is not None:
                bad[local] = EnvCheckError(
                    f"env {local + self.lo} / agent {agent!r}: its observation cannot be "
                    f"pickled to leave its env worker process ({why}); num_env_workers=0 "
                    "and remote_envs=False step it in the runner's process"
                )
        if not bad:
            return rows
        errors.update({local: encode_error(exc) for local, exc in bad.items()})
        return rows.without_envs(bad)._replace(errors={})  # (they travel in ``errors``)


def _pickle_failure(value: Any) -> str | None:
    """Why ``value`` cannot be pickled, or None if it can."""
    try:
        pickle.dumps(value)
    except Exception as exc:
        return describe_exception(exc)
    return None


def _picklable(info: Any, local: int, unpicklable: dict[int, str]) -> Any:
    """``info`` if it pickles, else its stand-in (the reason noted in ``unpicklable``)."""
    why = _pickle_failure(info)
    if why is None:
        return info
    unpicklable.setdefault(local, why)
    try:
        text = repr(info)
    except Exception:  # a broken __repr__ must not break the reply
        text = f"<{type(info).__name__} that cannot be shown>"
    return {"unpicklable_info": text}


def worker_main(
    blob: bytes,
    spec: GroupSpec,
    commands: Connection,
    answers: Connection,
    runner_ends: tuple[Connection, Connection],
    lifeline: Lifeline,
) -> None:
    """Build the group, say hello, attach to the block, then serve polls until closed.
    Commands come in on ``commands``, answers go out on ``answers``: a pipe each way
    (``frames``).

    First the worker ties its life to its parent's (``lifeline``: it dies with the runner
    even inside a hung step), and closes ``runner_ends`` (the runner's ends of both pipes,
    inherited when forked), so it sees its command pipe close when the runner's process
    goes away. SIGINT is ignored: the runner ends its workers. The process is tuned (one thread per
    numeric library: ``tuning``) before the env creator is unpickled or run."""
    lifeline.follow()
    for end in runner_ends:
        end.close()
    # Ctrl-C in a terminal reaches every process of the group: the runner decides what it
    # means (the command line finishes its batch first), and ends its workers itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tune_worker_process()
    group: BaseEnv | None = None
    block: SharedBlock | None = None
    try:
        group = _say_hello(blob, spec, answers)
        if group is None:
            return
        attach = commands.recv_bytes()
        if attach == b"c":  # ended before it started: another worker's envs failed to build
            return
        _, name, layout = pickle.loads(attach)
        block = SharedBlock(layout, name)
        assert block.arrays is not None
        _serve(_Server(group, spec, block.arrays), commands, answers)
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the runner went away or closed the pipe: end quietly
    finally:
        if group is not None:
            group.close()
        if block is not None:
            block.close()
        for end in (commands, answers):
            with contextlib.suppress(Exception):
                end.close()


def _say_hello(blob: bytes, spec: GroupSpec, answers: Connection) -> BaseEnv | None:
    """Build the group and send the runner its spaces; None (the error sent) when the
    env creator raised."""
    creator = cloudpickle.loads(blob)
    try:
        group, hello = _build(creator, spec)
    except Exception as exc:
        answers.send_bytes(pickle.dumps(Hello(error=encode_error(exc))))
        return None
    answers.send_bytes(pickle.dumps(hello))
    return group


def _serve(server: _Server, commands: Connection, answers: Connection) -> None:
    """Answer the runner's polls and restarts until it says close, blocking on the pipe
    between them."""
    while True:
        msg = read_frame(commands)
        if msg == b"p":
            reply = server.poll(None)
        elif msg == b"c":
            return
        else:
            kind, data = pickle.loads(msg)  # from the runner that started this process
            reply = server.poll(data) if kind == "poll" else server.restart(data)
        write_frame(answers, frame(reply))
