"""format.leases: the one expiring-lease mechanism (trainer lease, window claims).

Every test runs on a local root and on the fake-gcs-server emulator, which
enforces ``ifGenerationMatch`` itself (tests/gcs_emulators.py), so the
compare-and-swap is the server's, not only the local store's.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cloud.base import PreconditionFailed
from cloud.storage import open_storage
from format.leases import (DAMAGED_EXPIRED, Lease, LeaseDamaged, LeaseLost, LeaseRecord, Takeover, held_record,
                           read_record)

PATH = "cluster/test-lease.json"


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["local", "fake-gcs-server"])
def storage(request, tmp_path):
    if request.param == "local":
        return open_storage(str(tmp_path / "lake"))
    return request.getfixturevalue("fake_gcs").storage


def lease(storage, clock, seconds=60.0, **options) -> Lease:
    return Lease(storage, PATH, seconds, clock=clock, **options)


def test_a_lease_is_exclusive_until_it_expires_then_taken_over_and_the_old_holder_learns_it(storage):
    clock = Clock()
    first, second = lease(storage, clock, details={"attempt": "a1"}), lease(storage, clock)
    assert first.try_acquire() is None and first.record.details == {"attempt": "a1"}
    clock.now += 30
    holder = second.try_acquire()
    assert holder.holder == first.holder and holder.details == {"attempt": "a1"}
    first.renew()                                       # now expires at +90
    clock.now += 45
    assert second.try_acquire().holder == first.holder
    clock.now += 20                                     # +95: expired
    assert second.try_acquire() is None
    assert second.took_over.holder == first.holder
    with pytest.raises(LeaseLost, match=f"lost the lease .* held by {second.holder}"):
        first.renew()
    with pytest.raises(LeaseLost):
        first.check()
    assert not first.release()                          # a lost lease is never released over the new holder
    record, _ = read_record(storage, PATH)
    assert record.holder == second.holder and not record.released


def test_release_lets_the_next_holder_in_at_once(storage):
    clock = Clock()
    first = lease(storage, clock)
    first.try_acquire()
    assert first.release()
    record, _ = read_record(storage, PATH)
    assert record.released and held_record(storage, PATH, now=clock.now) is None
    second = lease(storage, clock)
    assert second.try_acquire() is None and second.took_over is None   # a released record is no takeover


def test_of_two_racing_takers_exactly_one_wins_and_the_other_is_told_who(storage, monkeypatch):
    clock = Clock()
    lease(storage, clock, 10).try_acquire()
    clock.now += 11                                     # expired: two processes race to take it
    late, early = lease(storage, clock, 10), lease(storage, clock, 10)
    real_read = late.read

    def read_then_lose_the_race():
        result = real_read()
        if early.record is None:
            assert early.try_acquire() is None          # between late's read and its conditional write
        return result

    monkeypatch.setattr(late, "read", read_then_lose_the_race)
    assert late.try_acquire().holder == early.holder
    assert read_record(storage, PATH)[0].holder == early.holder


def test_a_stale_generation_is_refused_by_the_store_itself(storage):
    clock = Clock()
    holder = lease(storage, clock)
    holder.try_acquire()
    _, generation = read_record(storage, PATH)
    holder.renew()
    with pytest.raises(PreconditionFailed):
        storage.write_if_generation(PATH, b"{}", generation)


def test_a_damaged_record_is_refused_or_replaced_as_the_caller_chooses(storage):
    clock = Clock()
    storage.write_new(PATH, b"{not json")
    with pytest.raises(LeaseDamaged, match=r"test-lease.json: not valid JSON.*delete it"):
        lease(storage, clock).try_acquire()
    assert held_record(storage, PATH) is None           # readers treat it as not held
    claim = lease(storage, clock, takeover=Takeover(damaged=DAMAGED_EXPIRED))
    assert claim.try_acquire() is None and claim.took_over is None
    assert read_record(storage, PATH)[0].holder == claim.holder


def test_a_dead_holder_on_this_host_is_taken_at_once_only_under_that_rule(storage):
    clock = Clock()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    probe = lease(storage, clock)
    ghost = LeaseRecord(f"{probe.host}:{dead.pid}:dead", probe.host, dead.pid, clock.now, clock.now,
                        clock.now + 60)
    storage.write_if_generation(PATH, ghost.to_bytes(), 0)
    assert probe.try_acquire().holder == ghost.holder   # default rules: wait out the expiry
    restarted = lease(storage, clock, takeover=Takeover(dead_local_holder=True))
    assert restarted.try_acquire() is None and restarted.took_over.holder == ghost.holder
    # The same pid on another host may be alive there: waited out.
    _, generation = read_record(storage, PATH)
    elsewhere = LeaseRecord("elsewhere:1:x", "elsewhere", dead.pid, clock.now, clock.now, clock.now + 60)
    storage.write_if_generation(PATH, elsewhere.to_bytes(), generation)
    assert lease(storage, clock, takeover=Takeover(dead_local_holder=True)).try_acquire().holder == "elsewhere:1:x"


class LandedButFailed:
    """A store whose next conditional write lands but reports 412, as a retried GCS request can."""

    def __init__(self, storage):
        self.storage = storage
        self.armed = False

    def __getattr__(self, name):
        return getattr(self.storage, name)

    def write_if_generation(self, path, data, generation):
        written = self.storage.write_if_generation(path, data, generation)
        if self.armed:
            self.armed = False
            raise PreconditionFailed(f"{path}: generation moved (our own retried write)")
        return written


def test_a_renewal_whose_write_landed_but_reported_failure_keeps_the_lease(storage):
    clock = Clock()
    flaky = LandedButFailed(storage)
    holder = Lease(flaky, PATH, 60, clock=clock)
    holder.try_acquire()
    flaky.armed = True
    clock.now += 10
    assert holder.renew().expires == clock.now + 60     # re-read: still ours, so it goes on from there
    clock.now += 10
    holder.renew()                                      # and later renewals use the right generation
    assert read_record(storage, PATH)[0].renewed == clock.now


def test_a_lease_that_lapsed_unrenewed_stops_its_holder(storage):
    clock = Clock()
    holder = lease(storage, clock, 10)
    holder.try_acquire()
    clock.now += 10
    with pytest.raises(LeaseLost, match="expired .* before it could be renewed"):
        holder.check()
    with pytest.raises(LeaseLost):
        holder.renew()


def test_records_round_trip_and_name_the_bad_field():
    record = LeaseRecord("h:1:x", "h", 1, 1.0, 2.0, 3.0, details={"attempt": "a"})
    assert LeaseRecord.from_bytes(record.to_bytes(), "u") == record
    assert b"details" not in LeaseRecord("h:1:x", "h", 1, 1.0, 2.0, 3.0).to_bytes()
    with pytest.raises(LeaseDamaged, match="u: field 'pid'"):
        LeaseRecord.from_bytes(b'{"holder": "h", "host": "h", "pid": "1", "acquired": 1, "renewed": 1, '
                               b'"expires": 1}', "u")
    with pytest.raises(ValueError, match="Takeover.damaged"):
        Takeover(damaged="ignored")


@pytest.mark.parametrize("field, value, says", [
    ("pid", 2 ** 70, "'pid' is"), ("pid", 0, "'pid' is"),
    ("expires", 1e300, "'expires' is"), ("renewed", float("nan"), "'renewed' is"),
    ("acquired", -5.0, "'acquired' is"),
    ("expires", 1_000_000.0 + 10 * 86400, "lives at most"),      # far past its renewal (a skewed writer)
    ("renewed", 999_000.0, "out of order"),                       # renewed before it was acquired
])
def test_an_out_of_range_record_is_damaged_never_a_traceback_or_an_endless_hold(storage, field, value, says):
    clock = Clock()
    record = {"holder": "h:1:x", "host": "h", "pid": 1, "acquired": 1_000_000.0, "renewed": 1_000_000.0,
              "expires": 1_000_060.0, "released": False}
    storage.write_new(PATH, json.dumps({**record, field: value}).encode())
    with pytest.raises(LeaseDamaged, match=f"test-lease.json: .*{says}"):
        lease(storage, clock, takeover=Takeover(dead_local_holder=True)).try_acquire()
    assert held_record(storage, PATH, now=clock.now) is None
    claim = lease(storage, clock, takeover=Takeover(damaged=DAMAGED_EXPIRED))
    assert claim.try_acquire() is None                   # a claim replaces it at once


def test_a_record_renewed_in_the_readers_future_is_damaged(storage):
    """A writer whose clock runs a day ahead: its record looks live for a day,
    but was renewed further ahead than its own lifetime."""
    clock = Clock()
    ahead = Lease(storage, PATH, 180.0, clock=Clock(clock.now + 86400))
    assert ahead.try_acquire() is None
    assert held_record(storage, PATH, now=clock.now) is None
    with pytest.raises(LeaseDamaged, match="renewed .* further ahead than its lifetime of 180 s"):
        lease(storage, clock).try_acquire()
    claim = lease(storage, clock, takeover=Takeover(damaged=DAMAGED_EXPIRED))
    assert claim.try_acquire() is None
    # Within its lifetime, a clock ahead is tolerated (the protocol's stated tolerance).
    storage2_clock = Clock(clock.now + 60)
    slightly = Lease(storage, "cluster/other.json", 180.0, clock=storage2_clock)
    assert slightly.try_acquire() is None
    assert held_record(storage, "cluster/other.json", now=clock.now) is not None


def test_under_the_own_period_rule_a_record_lives_at_most_its_renewal_plus_the_readers_period(storage):
    """Window claims (pipeline.follow.CLAIM_TAKEOVER): a claim its writer gave an hour's life stalls
    another follower for that follower's own --claim-seconds at most, not for the hour."""
    clock = Clock()
    writer = lease(storage, clock, seconds=3000.0)
    assert writer.try_acquire() is None
    clock.now += 100
    assert lease(storage, clock, seconds=60.0).try_acquire().holder == writer.holder   # the default rule waits
    bounded = lease(storage, clock, seconds=60.0, takeover=Takeover(own_period=True))
    assert bounded.try_acquire() is None and bounded.took_over.holder == writer.holder
    clock.now += 10                                     # a holder renewed 10 s ago keeps its claim
    rival = lease(storage, clock, seconds=60.0, takeover=Takeover(own_period=True))
    assert rival.try_acquire().holder == bounded.holder


def test_window_claims_use_the_own_period_rule():
    from pipeline.lake_view import CLAIM_TAKEOVER

    assert CLAIM_TAKEOVER.own_period and CLAIM_TAKEOVER.damaged == DAMAGED_EXPIRED
