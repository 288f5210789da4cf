#!/usr/bin/env python3
"""JSON checks for deploy/e2e.sh (stdlib only; runs on the host, not in the image).

The CLI prints one JSON document per command (`netcoll status --json`,
`netcoll submit ... --json`). This helper is deliberately tolerant about the
exact shape (it looks for a few likely key names) and strict about the
contract: a job's `state`, `verified` and `error`, and the member count.

    e2e_json.py members FILE
        print the number of live members in a `status --json` document
    e2e_json.py busy FILE
        exit 0 if some member reports a current job, 1 if none, 2 if unknown
    e2e_json.py job FILE EXPECT [WORLD_SIZE|-] [NEEDLE ...]
        EXPECT is `succeeded` (state=succeeded and verified=true; a barrier
        moves no data, so its `verified` may be null) or `failed-rank`
        (state=failed and the error names a rank).
        Prints one summary line; exits 0 when the expectation holds, 1 if not.
        If WORLD_SIZE is given (not `-`) and the job reports its world size, it
        must match; if the job does not report one, the line says
        "world=UNVERIFIED".
        With NEEDLEs (failed-rank only), the error must also contain one of
        them (e.g. the killed container's address or hostname): it must name
        *the* lost rank, not just any rank.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

DEAD_STATES = {"dead", "lost", "left", "failed", "expired", "gone", "down", "removed"}
MEMBER_LIST_KEYS = ("members", "ranks", "peers", "nodes")
WORLD_KEYS = ("world_size", "world", "nranks", "n_ranks", "num_ranks")
CURRENT_JOB_KEYS = ("current_job", "job", "job_id", "running_job")
TIMING_RE = re.compile(r"(time|duration|elapsed|seconds|latency|_s$|_ms$|_us$|bw|bandwidth)", re.I)
RANK_RE = re.compile(r"\brank(?:s)?\b\W{0,3}\[?\s*\d+", re.I)


def load(path: str) -> Any:
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read().strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    # Tolerate log lines around the document: take the last line that parses.
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line[:1] in "{[":
            try:
                return json.loads(line)
            except ValueError:
                continue
    sys.exit(f"no JSON document in {path}: {text[-400:]!r}")


def member_list(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        for key in MEMBER_LIST_KEYS:
            value = doc.get(key)
            if isinstance(value, list):
                return value
            if isinstance(value, dict):  # {member_id: {...}}
                return list(value.values())
        sys.exit(f"status JSON has none of {MEMBER_LIST_KEYS}: keys={sorted(doc)}")
    if isinstance(doc, list):
        return doc
    sys.exit(f"status JSON is neither an object nor a list: {type(doc).__name__}")


def is_live(member: Any) -> bool:
    if not isinstance(member, dict):
        return True
    state = member.get("state", member.get("status", ""))
    return str(state).lower() not in DEAD_STATES


def cmd_members(path: str) -> int:
    print(sum(1 for m in member_list(load(path)) if is_live(m)))
    return 0


def cmd_busy(path: str) -> int:
    members = member_list(load(path))
    seen_key = False
    for m in members:
        if not isinstance(m, dict):
            continue
        for key in CURRENT_JOB_KEYS:
            if key in m:
                seen_key = True
                if m[key] not in (None, "", [], {}):
                    return 0
    return 1 if seen_key else 2


def find_world(doc: dict[str, Any]) -> int | None:
    for scope in (doc, doc.get("stats"), doc.get("result"), doc.get("job")):
        if not isinstance(scope, dict):
            continue
        for key in WORLD_KEYS:
            if isinstance(scope.get(key), int):
                return int(scope[key])
        ranks = scope.get("ranks")
        if isinstance(ranks, int):
            return ranks
        if isinstance(ranks, list):
            return len(ranks)
    return None


def timings(doc: dict[str, Any]) -> str:
    out = []
    for scope_name, scope in (("", doc), ("stats.", doc.get("stats"))):
        if not isinstance(scope, dict):
            continue
        for key, value in scope.items():
            if TIMING_RE.search(key) and isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append(f"{scope_name}{key}={value:.4g}")
    return " ".join(out[:6])


def cmd_job(path: str, expect: str, world: str | None, needles: list[str]) -> int:
    doc = load(path)
    if not isinstance(doc, dict):
        sys.exit(f"submit JSON is not an object: {doc!r:.200}")
    state = str(doc.get("state"))
    verified = doc.get("verified")
    error = doc.get("error")
    got_world = find_world(doc)
    problems = []

    if expect == "succeeded":
        if state != "succeeded":
            problems.append(f"state={state} (want succeeded)")
        # A barrier carries no data: nothing to verify, null is the honest answer.
        no_data = doc.get("op") == "barrier"
        if verified is not True and not (no_data and verified is None):
            problems.append(f"verified={verified!r} (want true)")
    elif expect == "failed-rank":
        if state != "failed":
            problems.append(f"state={state} (want failed)")
        if not (isinstance(error, str) and RANK_RE.search(error)):
            problems.append(f"error does not name a rank: {error!r}")
        elif needles and not any(n and n in error for n in needles):
            problems.append(f"error does not name the lost rank ({' or '.join(needles)}): {error!r}")
    else:
        sys.exit(f"unknown expectation {expect!r}")

    world_note = ""
    if world not in (None, "-"):
        if got_world is None:
            world_note = " world=UNVERIFIED(job JSON has no world size)"
        elif got_world != int(world):
            problems.append(f"world_size={got_world} (want {world})")
        else:
            world_note = f" world={got_world}"

    parts = [f"id={doc.get('id')} state={state} verified={verified}{world_note}", timings(doc)]
    if error:
        parts.append(f"error={str(error)[:300]!r}")
    line = " ".join(p for p in parts if p)
    if problems:
        print(f"{line}  <-- " + "; ".join(problems))
        return 1
    print(line)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "members":
        return cmd_members(argv[1])
    if len(argv) >= 2 and argv[0] == "busy":
        return cmd_busy(argv[1])
    if len(argv) >= 3 and argv[0] == "job":
        return cmd_job(argv[1], argv[2], argv[3] if len(argv) >= 4 else None, argv[4:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
