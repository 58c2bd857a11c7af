"""Hostile request bodies for the policy server's msgpack decoder (``rlconnect.serve.wire``).

Invariants: ``decode`` raises only ``WireError`` and returns only plain values and numeric
arrays; nothing is unpickled (canary marker), nothing imported; memory stays bounded (a
header declaring 2**32 elements allocates nothing, and no body decodes into more than
``MAX_VALUES`` values). ``test_hostile_server.py`` sends such bodies to a live server.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fuzz_common as fc
import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlconnect.serve.wire import MAX_TUPLE_DEPTH, MAX_VALUES, WireError, decode, encode

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning"),
]


# -- hostile msgpack bodies ------------------------------------------------------------------
def array_ext(dtype: Any, shape: Any, raw: Any) -> bytes:
    return fc.ext(1, msgpack.packb([dtype, shape, raw], use_bin_type=True))


HEADERS = [  # a type byte + a length field declaring far more than the body holds
    b"\xdd\xff\xff\xff\xff",  # array32 of 2**32-1 elements
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xdb\xff\xff\xff\xff",  # str32
    b"\xc6\xff\xff\xff\xff",  # bin32
    b"\xc9\xff\xff\xff\xff\x01",  # ext32, code 1
    b"\xc9\x7f\xff\xff\xff\x02",  # ext32, code 2
    b"\xdc\xff\xff",  # array16
]
DECLARED = st.builds(
    lambda h, tail: h + tail, st.sampled_from(HEADERS), st.binary(max_size=16)
).map(lambda b: ("declared_size", b))
ARRAY_PAYLOADS = st.builds(
    array_ext,
    st.sampled_from(["<f4", "|O", "O", "<U10", "|V8", "<M8", "(1000000000,)f8", "f8,f8", ">c16"])
    | st.sampled_from([None, 1, 2**64 - 1, ["<f4"], b"<f4"]),
    st.sampled_from([[3], [10**12], [-1], [2**63], [], [1, 1, 1] * 40, "3", None, [[3]]]),
    st.sampled_from([b"\0" * 12, b"", "text", 5, None, [1, 2]]),
).map(lambda b: ("array_ext", b))
OTHER_EXT = st.builds(  # ext8: 0xc7, length, signed type code, payload
    lambda code, payload: b"\xc7" + bytes([len(payload), code & 0xFF]) + payload,
    st.integers(-128, 127),
    st.binary(max_size=24),
).map(lambda b: ("ext_code", b))
DEEP_BODIES = {
    "deep_tuples": lambda: fc.nested_tuples(MAX_TUPLE_DEPTH + 1),
    "deeper_tuples": lambda: fc.nested_tuples(5000),
    "deep_lists": lambda: b"\x91" * 100_000 + b"\xc0",
    "deep_maps": lambda: b"\x81\xa1a" * 100_000 + b"\xc0",
}
DEEP = st.sampled_from(sorted(DEEP_BODIES)).map(lambda k: (k, DEEP_BODIES[k]()))


def valid_messages() -> dict[str, bytes]:
    return {
        "get_action": encode({"episode_id": "e1", "obs": np.arange(3, dtype=np.float32)}),
        "nested": encode({"obs": {"a": (np.zeros((2, 2)), 1)}, "info": {"k": [1, "x", None]}}),
        "report": encode({"commands": [["log_returns", {"episode_id": 1, "reward": 0.5}]]}),
    }


VALID = valid_messages()
BODIES = st.one_of(
    st.builds(
        lambda name, m: (str(m).split("(")[0], m.apply(VALID[name])),
        st.sampled_from(sorted(VALID)),
        fc.byte_mutations(dict(VALID)),
    ),
    DECLARED,
    ARRAY_PAYLOADS,
    OTHER_EXT,
    DEEP,
)


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("hostile_wire")
    fc.publish(["wire:decode", "wire:value_budget"])


@settings(fc.SETTINGS, max_examples=fc.examples(150))
@given(body=BODIES)
def test_decode_raises_only_wire_error(marker_dir: Path, body: tuple[str, bytes]) -> None:
    kind, data = body
    guard = fc.Guard("wire:decode", (WireError,), marker_dir)
    guard.run(lambda: check_decoded(decode(data)), f"{kind}: {data[:60]!r}", kind)


def check_decoded(value: Any) -> None:
    """What decode returns holds only plain values and numeric arrays (never objects)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, np.ndarray | np.generic):
            assert v.dtype.kind in "biufc", v.dtype
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
        else:
            assert v is None or isinstance(v, bool | int | float | str | bytes), type(v)


def test_msgpack_numpy_object_markers_are_plain_data(marker_dir: Path) -> None:
    """msgpack-numpy would unpickle ``data`` for ``kind == b'O'``; our decoder never does."""
    marker = marker_dir / "PWNED"
    payload = fc.pickle_canary(marker)
    evil = msgpack.packb(
        {b"nd": True, b"type": b"|O", b"kind": b"O", b"shape": [1], b"data": payload},
        use_bin_type=True,
    )
    guard = fc.Guard("wire:decode", (WireError,), marker_dir)
    assert guard.run(lambda: check_decoded(decode(evil)), "msgpack-numpy marker", "canary") == (
        "accepted"
    )
    out = decode(evil)
    assert out[b"data"] == payload  # bytes, never unpickled
    for dtype in ("|O", "O", "|O8"):
        assert guard.run(lambda d=dtype: decode(array_ext(d, [1], payload)), dtype, "canary") == (
            "WireError"
        )
    assert not marker.exists()


def test_deep_tuples_are_refused_in_a_child_process() -> None:
    """Regression: 200 nested tuple extensions overflowed the C stack (a segfault, taking
    the server down). Run in a child: a regression must fail this test, not the session."""
    wire = Path(importlib.util.find_spec("rlconnect.serve.wire").origin)
    code = (
        "import importlib.util, msgpack, sys\n"
        f"spec = importlib.util.spec_from_file_location('wire', {str(wire)!r})\n"
        "wire = importlib.util.module_from_spec(spec); spec.loader.exec_module(wire)\n"
        "for depth in (200, 1000, 5000):\n"
        "    data = msgpack.packb(1)\n"
        "    for _ in range(depth):\n"
        "        data = msgpack.packb(msgpack.ExtType(2, b'\\x91' + data))\n"
        "    try:\n"
        "        wire.decode(data)\n"
        "    except wire.WireError as exc:\n"
        "        print(depth, 'refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"the decoder crashed (exit {out.returncode}): {out.stderr}"
    # refused for their depth, or (5000 levels) for the bytes the nested copies would take
    assert out.stdout.count("refused: ") == 3, out.stdout
    assert out.stdout.count("nested deeper than") >= 2, out.stdout
    t = (1,)
    for _ in range(MAX_TUPLE_DEPTH - 1):
        t = (t,)
    assert decode(encode(t)) == t  # the deepest allowed nest still round-trips


@pytest.mark.parametrize(
    "body",
    [
        b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x80" * (1 << 20),  # 1M empty maps
        b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x90" * (1 << 20),  # 1M empty lists
        b"\x92"
        + (b"\xdd" + (MAX_VALUES // 2).to_bytes(4, "big") + b"\xa2ab" * (MAX_VALUES // 2)) * 2,
        fc.ext(2, b"\x91" + fc.ext(2, b"\xdd\xff\xff\xff\xff")),  # 2**32 values in a tuple
    ],
    ids=["empty_maps", "empty_lists", "split_over_lists", "inside_tuples"],
)
def test_regression_values_per_message_are_bounded_before_decoding(
    marker_dir: Path, body: bytes
) -> None:
    """A 1 MB body of empty maps decoded into 76 MB (a 64 MB body: ~4.6 GB in the server's
    process); now every message holds at most MAX_VALUES values, counted before building."""
    guard = fc.Guard("wire:value_budget", (WireError,), marker_dir)
    assert guard.run(lambda: decode(body), len(body), "value_budget") == "WireError"
    assert guard.last_peak < 1 << 20
    # counted by the walk, or (a body too small to need it) by msgpack's length limits
    with pytest.raises(WireError, match=f"more than {MAX_VALUES} values|max_array_len"):
        decode(body)


def test_values_within_the_budget_cost_a_bounded_amount_each(marker_dir: Path) -> None:
    n = MAX_VALUES - 1
    body = b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n  # the costliest value: an empty dict
    guard = fc.Guard("wire:value_budget", (WireError,), marker_dir)
    assert guard.run(lambda: decode(body), n, "within_budget") == "accepted"
    assert guard.last_peak < 100 * n  # ~72 B per empty dict with its list slot


def test_regression_timestamp_extension_decodes_to_a_number() -> None:
    """msgpack's own timestamp extension (-1) came back as a msgpack.Timestamp object."""
    assert decode(b"\xd6\xff\x00\x00\x00\x05") == 5.0
