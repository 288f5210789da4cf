"""The regroup round's rules (netcoll.rendezvous.regroup), without sockets: unit cases,
then a seeded schedule explorer (random calls, deaths, timeouts, newcomers arriving
and leaving) checked against a reference after every step; a failure prints its seed."""

from __future__ import annotations

import random

import pytest

from netcoll.groupids import epoch_group, epoch_of
from netcoll.rendezvous.groups import Member
from netcoll.rendezvous.regroup import Round, admission_message, epoch_session, missing_message


def member(name: str, rank: int | None = None) -> Member:
    m = Member(name, None, "127.0.0.1", 1000 + (rank or 0), ("127.0.0.1", 5000))
    m.rank = rank
    return m


def world(n: int) -> list[Member]:
    return [member(f"m{r}", r) for r in range(n)]


def test_closes_only_when_every_connected_member_called() -> None:
    ms, rnd = world(3), Round()
    assert rnd.call(ms, ms[0]) is None
    assert rnd.call(ms, ms[2]) is None
    assert rnd.missing(ms) == [ms[1]]
    out = rnd.call(ms, ms[1])
    assert out is not None and not out.changed
    assert out.order == tuple(ms) and set(out.callers) == set(ms) and out.admitted == ()
    assert rnd.called == []  # the next round starts empty


def test_a_dead_member_is_not_waited_for_and_survivors_keep_their_order() -> None:
    ms, rnd = world(4), Round()
    for m in (ms[2], ms[0], ms[1]):
        assert rnd.call(ms, m) is None  # rank 3 is still connected: the round waits
    ms[3].connected = False
    out = rnd.check(ms)
    assert out is not None and out.changed
    assert [m.member_id for m in out.order] == ["m0", "m1", "m2"]


def test_newcomers_follow_the_members_in_arrival_order() -> None:
    ms, rnd = world(2), Round()
    late, early = member("zz-late"), member("aa-early")
    rnd.arrive(late)
    rnd.arrive(early)
    rnd.depart(member("never-came"))  # (not queued: nothing happens)
    rnd.call(ms, ms[1])
    out = rnd.call(ms, ms[0])
    assert out is not None and out.changed
    assert [m.member_id for m in out.order] == ["m0", "m1", "zz-late", "aa-early"]
    assert out.admitted == (late, early) and rnd.newcomers == []


def test_a_newcomer_that_left_is_not_admitted() -> None:
    ms, rnd = world(2), Round()
    gone = member("gone")
    rnd.arrive(gone)
    rnd.depart(gone)
    rnd.call(ms, ms[0])
    out = rnd.call(ms, ms[1])
    assert out is not None and not out.changed and out.admitted == ()


def test_renew_starts_a_new_epoch_with_the_same_members() -> None:
    ms, rnd = world(2), Round()
    rnd.call(ms, ms[0], renew=True)
    out = rnd.call(ms, ms[1])
    assert out is not None and out.changed and out.order == tuple(ms)
    rnd.call(ms, ms[0])
    again = rnd.call(ms, ms[1])
    assert again is not None and not again.changed  # renew was that round's only


def test_a_withdrawn_call_holds_the_round_open() -> None:
    ms, rnd = world(2), Round()
    rnd.call(ms, ms[0], renew=True)
    rnd.withdraw(ms[0])
    assert rnd.call(ms, ms[1]) is None
    assert rnd.missing(ms) == [ms[0]]
    out = rnd.call(ms, ms[0])
    assert out is not None and not out.changed  # the withdrawn call's renew went with it


def test_refusals() -> None:
    ms, rnd = world(2), Round()
    rnd.call(ms, ms[0])
    with pytest.raises(ValueError, match="already waits"):
        rnd.call(ms, ms[0])
    with pytest.raises(ValueError, match="not a member"):
        rnd.call(ms, member("stranger"))


def test_timeout_message_names_the_members_that_never_called() -> None:
    ms, rnd = world(3), Round()
    rnd.call(ms, ms[0])
    rnd.call(ms, ms[2])
    text = missing_message("g", 2, ms, rnd, 1.5)
    assert "rank 1 (member 'm1'" in text and "never called regroup" in text
    assert "within 1.5s" in text and "epoch 2" in text and "ranks waiting: 0, 2" in text
    assert "rank 0 (" not in text and "rank 2 (" not in text
    rnd.withdraw(ms[0], timed_out=True)  # a caller whose wait ended is not named as never calling
    text = missing_message("g", 2, ms, rnd, None)
    assert "rank 0 (" not in text and "rank 1 (member 'm1'" in text
    assert "ranks waiting: 2; ranks 0 called but their wait ended first" in text
    assert "no group 'g' is running" in admission_message("g", 3.0, running=False)
    assert "have not called regroup" in admission_message("g", None, running=True)


def test_epoch_names() -> None:
    assert epoch_group("default", 0) == "default" and epoch_group("default", 3) == "default/e3"
    assert epoch_of("default") == 0 and epoch_of("default/e3") == 3
    assert epoch_of("default/e3/split0:1") == 3 and epoch_of("default/split0:1") == 0
    assert epoch_of("epoch4") == 0 and epoch_of("x/eX") == 0
    assert epoch_session("abc", 0) == "abc" and epoch_session("abc", 2) == "abc.2"


# -- the schedule explorer ------------------------------------------------------------


def explore(seed: int, steps: int = 120) -> tuple[int, int]:
    """Random events on one group's rounds; every outcome checked against what the
    rules say it must be (the reference below, written from the docstring). Returns
    how many rounds closed with a new epoch and how many unchanged."""
    rng = random.Random(seed)
    members = world(rng.randint(1, 6))
    rnd = Round()
    queued: list[Member] = []  # the reference queue, in arrival order
    renewing: set[Member] = set()
    epoch = same = made = 0
    for step in range(steps):
        where = f"seed {seed} step {step}"
        live = [m for m in members if m.connected]
        waiting = [m for m in live if m not in rnd.called]
        event = rng.choice(["call", "call", "call", "die", "withdraw", "arrive", "depart"])
        outcome = None
        if event == "call" and waiting:
            m = rng.choice(waiting)
            renew = rng.random() < 0.1
            if renew:
                renewing.add(m)
            outcome = rnd.call(members, m, renew=renew)
        elif event == "die" and len(live) > 1:
            victim = rng.choice(live)
            victim.connected = False
            if victim in rnd.called:
                rnd.withdraw(victim)  # (its connection closed: the coordinator withdraws it)
                renewing.discard(victim)
            outcome = rnd.check(members)
        elif event == "withdraw" and rnd.called:
            m = rng.choice(rnd.called)
            rnd.withdraw(m, timed_out=rng.random() < 0.5)
            renewing.discard(m)
        elif event == "arrive":
            made += 1
            n = member(f"new{made}")
            rnd.arrive(n)
            queued.append(n)
        elif event == "depart" and queued:
            n = rng.choice(queued)
            n.connected = False
            rnd.depart(n)
            queued.remove(n)
        if outcome is None:
            # never closed while a connected member has not called
            assert not rnd.called or rnd.missing(members), where
            continue
        assert set(outcome.callers) == set(live if event != "die" else [m for m in members if m.connected]), where
        survivors = [m for m in members if m.connected]
        changed = len(survivors) < len(members) or bool(queued) or bool(renewing)
        assert outcome.changed == changed, where
        assert outcome.admitted == tuple(queued), where
        if changed:
            assert list(outcome.order) == survivors + queued, where  # old order, then arrival order
            members = list(outcome.order)
            for r, m in enumerate(members):
                m.rank = r
            epoch += 1
            queued.clear()
        else:
            assert list(outcome.order) == members, where
            same += 1
        renewing.clear()
        assert rnd.called == [] and rnd.gave_up == [] and rnd.newcomers == queued, where
    return epoch, same


@pytest.mark.parametrize("seed", range(200))
def test_explore_regroup_rounds(seed: int) -> None:
    explore(seed)


def test_the_explorer_reaches_both_outcomes() -> None:
    totals = [explore(seed) for seed in range(20)]
    assert sum(t[0] for t in totals) > 20 and sum(t[1] for t in totals) > 20, totals
