"""The malformed input of live fuzzing (:mod:`.fuzz_live`): seeded frames with wrong magic,
versions, kinds, lengths and msgpack headers, values of wrong types or absurd sizes, HELLOs
with bad fields or a wrong proof, and REQUESTs with unknown methods or bad parameters. Pure
functions of a ``random.Random``: no I/O."""

from __future__ import annotations

import random
import secrets
import struct
from typing import Any

import msgpack

from ...mesh import auth

PREFIX = struct.Struct("!4sBBHIQ")
MAGIC = b"NCOL"
KINDS = list(range(1, 16))
CONTROL = [5, 9, 10, 11, 12, 13, 14, 15]
HUGE = 2**64 - 1  # the largest msgpack int
METHODS = [
    "join", "leave", "status", "barrier", "kv_set", "kv_get", "kv_add", "kv_delete",
    "kv_decide", "daemon_register", "daemon_drain", "submit", "wait", "job", "cancel", "members",
    "cluster", "watch", "job_progress", "job_result", "put", "get", "delete",
]  # fmt: skip
#: methods fuzzed with short timeouts only (they may block for their timeout)
WAITING = {"barrier", "kv_get", "wait"}


# -- generators ----------------------------------------------------------------------------


def prefix(kind: int, header_len: int, payload_len: int = 0, magic: bytes = MAGIC, version: int = 1) -> bytes:
    return PREFIX.pack(magic, version & 0xFF, kind & 0xFF, 0, header_len & 0xFFFFFFFF, payload_len & (2**64 - 1))


def packb(obj: object, use_bin_type: bool = True, strict_types: bool = False) -> bytes:
    """``msgpack.packb``, typed (msgpack ships no annotations)."""
    out: bytes = msgpack.packb(obj, use_bin_type=use_bin_type, strict_types=strict_types)
    return out


class Deep(bytes):
    """Stands for ``depth`` nested arrays/maps: msgpack-python refuses to pack more
    than 511 levels, so :func:`frame` splices the raw bytes in after packing."""

    raw: bytes


def deep(depth: int, as_map: bool = False) -> Deep:
    marker = Deep(b"\x00deep\x00" + secrets.token_bytes(8))
    marker.raw = (b"\x81\xa1k" if as_map else b"\x91") * depth + b"\x01"
    return marker


def _pack(obj: Any) -> bytes:
    deeps: list[Deep] = []

    def walk(o: Any) -> None:
        if isinstance(o, Deep):
            deeps.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(obj)
    body = packb(obj, use_bin_type=True)
    for d in deeps:
        body = body.replace(b"\xc4" + bytes([len(d)]) + bytes(d), d.raw, 1)
    return body


def frame(kind: int, header: Any, payload: bytes = b"") -> bytes:
    body = header if isinstance(header, bytes) and not isinstance(header, Deep) else _pack(header)
    return prefix(kind, len(body), len(payload)) + body + payload


def junk_value(rng: random.Random, depth: int = 0, decodable: bool = False) -> Any:
    """A value of a wrong type or an absurd size. ``decodable``: one the wire
    decoder accepts (no ext types, no nesting deeper than a few levels), so a
    REQUEST carrying it gets an RPC error answer instead of ending the session."""
    r = rng.randrange(14)
    if decodable and r in (10, 12):
        r = 13
    if r == 0:  # the largest ints msgpack can carry (2**70 cannot be encoded at all); floats beyond
        return rng.choice((2**64 - 1, -(2**63), 1e21, 2.0**70, -(2.0**70)))
    if r == 1:
        return rng.choice((2**63, 2**32, -1, 0, 10**18))
    if r == 2:
        return rng.choice((float("nan"), float("inf"), -1e308, 1e-300))
    if r == 3:
        return rng.randbytes(rng.randrange(64))
    if r == 4:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(32)))
    if r == 5:
        return "\x1b[31m\u202e" + "A" * rng.randrange(5000)
    if r == 6:
        return None
    if r == 7:
        return rng.choice((True, False))
    if r == 8 and depth < 3:
        return [junk_value(rng, depth + 1, decodable) for _ in range(rng.randrange(5))]
    if r == 9 and depth < 3:
        return {rng.choice(("id", "group", "key", "spec", "timeout", "x")): junk_value(rng, depth + 1, decodable)}
    if r == 10:
        return deep(rng.choice((50, 500, 3000)), as_map=rng.random() < 0.5)
    if r == 11:
        return rng.randrange(-5, 2**31)
    if r == 12:
        return msgpack.ExtType(rng.randrange(128), rng.randbytes(8))
    return rng.random() * 10 ** rng.randrange(30)


def bad_header_bytes(rng: random.Random) -> bytes:
    """A header that breaks msgpack or the schema in some way."""
    r = rng.randrange(10)
    if r == 0:
        return rng.randbytes(rng.randrange(1, 200))
    if r == 1:
        return packb([1, 2, 3])  # not a map
    if r == 2:
        return packb({1: 2, "a": "b"}, strict_types=False)  # int key
    if r == 3:
        return b"\x81\xa1a\xa4\xff\xfe\xfd\xfc"  # {"a": bad utf-8 str}
    if r == 4:
        return packb({"a": 1}) + b"\x00trailing"
    if r == 5:
        return packb({"a": "x" * 100})[:-7]  # truncated
    if r == 6:
        return b"\xdf\xff\xff\xff\xff"  # map32 declaring 4G entries, no data
    if r == 7:
        return b"\xdd\xff\xff\xff\xff"  # array32 declaring 4G entries
    if r == 8:
        return _pack({"k": deep(rng.choice((200, 2000, 20000)))})
    return b"\xc1" * rng.randrange(1, 50)  # never-used msgpack byte


def malformed_frame(rng: random.Random) -> tuple[str, bytes]:
    """(label, bytes): one malformed frame as any connection might see it."""
    r = rng.randrange(16)
    kind = rng.choice(KINDS)
    if r == 0:
        return "garbage", rng.randbytes(rng.randrange(1, 300))
    if r == 1:
        return "truncated_prefix", prefix(kind, 1)[: rng.randrange(1, 20)]
    if r == 2:
        return "bad_magic", prefix(
            kind, 1, magic=rng.choice((b"GET ", b"\x16\x03\x01\x00", rng.randbytes(4)))
        ) + b"\x80"
    if r == 3:
        return "bad_version", prefix(kind, 1, version=rng.choice((0, 2, 255))) + b"\x80"
    if r == 4:
        return "bad_kind", prefix(rng.choice((0, 16, 99, 255)), 1) + b"\x80"
    if r == 5:
        return "absurd_header_len", prefix(kind, rng.choice((2**32 - 1, 2**31, 65537, 16385, 4097)), 0) + b"\x80" * 64
    if r == 6:
        return "absurd_payload_len", prefix(
            rng.choice((4, 6, 7)), 1, rng.choice((2**64 - 1, 2**50, 2**40 + 1, 2**33))
        ) + b"\x80"
    if r == 7:
        return "control_with_payload", prefix(rng.choice(CONTROL), 1, rng.randrange(1, 1 << 20)) + b"\x80" + b"x" * 16
    if r == 8:
        return "oversize_control", frame(rng.choice(CONTROL), {"message": "x" * rng.choice((4097, 16385, 60000))})
    if r == 9:
        return "bad_header", (lambda h: prefix(kind, len(h)) + h)(bad_header_bytes(rng))
    if r == 10:
        return "header_len_mismatch", prefix(kind, 50) + packb({"a": 1})
    if r == 11:
        hdr = {"id": junk_value(rng), "n": junk_value(rng), "g": junk_value(rng), "q": junk_value(rng), "s": 0, "c": 0}
        return "flow_control_bad_ids", frame(rng.choice((13, 14, 15)), hdr)
    if r == 12:
        hdr = {"g": junk_value(rng), "q": junk_value(rng), "s": 0, "c": 0, "f": "x"}
        return "data_frame", frame(4, hdr, rng.randbytes(rng.randrange(0, 64)))
    if r == 13:
        return "abort_frame", frame(
            5, {"g": "x", "q": junk_value(rng), "reason": junk_value(rng), "origin": 0, "cause": "x"}
        )
    if r == 14:
        return "wrong_kind", frame(
            rng.choice((1, 3, 7, 8, 9, 11, 12)),
            {"topic": "x", "id": 1, "ok": True, "nonce": b"1" * 16, "role": "x", "message": "m"},
        )
    return "zero_header", prefix(rng.choice((2, 4, 6, 7)), 0)


def bad_hello(rng: random.Random, nonce: bytes, token: str | None) -> tuple[str, bytes]:
    """A HELLO with bad fields (label, bytes); ``token``: with a valid proof."""
    mine = auth.new_nonce()
    hdr: dict[str, Any] = {"role": rng.choice(("client", "peer", "rank", junk_value(rng))), "nonce": mine}
    label = "hello_wrong_proof"
    if token is not None:
        hdr["proof"] = auth.proof(token, "hello", nonce, mine)
        label = "hello_valid_proof_bad_fields"
    else:
        hdr["proof"] = rng.choice((rng.randbytes(32), rng.randbytes(rng.randrange(64)), "str", HUGE, None))
    r = rng.randrange(4)
    if r == 0:
        hdr["nonce"] = rng.choice(("text", HUGE, b"", rng.randbytes(1000)))
        if token is None:
            label = "hello_bad_nonce"
    for key in ("session", "rank", "link", "group", "member_id", "listen_port"):
        if rng.random() < 0.5:
            hdr[key] = junk_value(rng)
    if rng.random() < 0.3:
        hdr["link"] = {"v": junk_value(rng), "caps": junk_value(rng), "window": junk_value(rng)}
    return label, frame(2, hdr)


def bad_request(rng: random.Random, rid: int) -> tuple[str, bytes]:
    """A REQUEST that is a valid frame but a bad RPC (the session stays open)."""
    r = rng.randrange(8)
    if r == 0:
        method = rng.choice(("", "x" * 3000, "\x1b[2J\u202eevil", "__init__", "status ", "STATUS", "_rpc_submit"))
        return "unknown_method", frame(6, {"id": rid, "method": method, "params": {}})
    method = rng.choice(METHODS)
    if r == 1:
        return "params_not_map", frame(6, {"id": rid, "method": method, "params": junk_value(rng, decodable=True)})
    params: dict[str, Any] = {}
    for key in rng.sample(
        ["group", "key", "name", "amount", "id", "spec", "inputs", "world_size", "member_id", "epoch", "size",
         "rank_hint", "listen_port", "advertise_host", "value", "count", "session", "rank"], rng.randrange(1, 6)
    ):  # fmt: skip
        params[key] = junk_value(rng, decodable=True)
    if method in WAITING or rng.random() < 0.5:
        params["timeout"] = rng.choice((0, 0.01, -1, HUGE, float("nan"), "1", None))
    if method in WAITING and not isinstance(params["timeout"], int | float):
        params["timeout"] = 0.01
    if r == 2:
        params["spec"] = {
            "op": rng.choice(("all_reduce", "x", 1)),
            "size": junk_value(rng, decodable=True),
            "world_size": junk_value(rng, decodable=True),
            "iters": junk_value(rng, decodable=True),
            "dtype": junk_value(rng, decodable=True),
        }
        method = "submit"
    if r == 3:
        params["inputs"] = junk_value(rng, decodable=True)
        params["spec"] = {"op": "all_reduce", "data": "inline", "dtype": "float32"}
        method = "submit"
        return "submit_bad_inputs", frame(
            6, {"id": rid, "method": method, "params": params}, rng.randbytes(rng.randrange(0, 128))
        )
    if r == 4:
        params = {"group": "fuzz", "key": junk_value(rng, decodable=True), "amount": junk_value(rng, decodable=True)}
        method = rng.choice(("kv_add", "kv_delete", "kv_set"))
    if r == 5:
        return "huge_values", frame(
            6,
            {
                "id": rid,
                "method": method,
                "params": {"id": HUGE, "group": -(2**63), "x": [[[[1e308]]]], "timeout": 0.01},
            },
        )
    label = "bad_params_" + ("waiting" if method in WAITING else "call")
    return label, frame(6, {"id": rid, "method": method, "params": params, "extra": junk_value(rng, decodable=True)})
