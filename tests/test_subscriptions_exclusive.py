"""Exclusive subscriptions: one consumer at a time, through the hold (PROTOCOL.md "Subscription types",
"Exclusive"). In-process scenarios on the memory backend with a fake clock."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from fakeclock import FakeClock

import txn_core
from txn_core import AckStatus, ConfigurationError, ConsumerBusyError, SubscriptionType
from txn_core.clients.subscriptions.consumer import TRIM_EVERY_MS
from txn_core.clients.subscriptions.store import (
    META_VERSION,
    META_VERSION_TYPED,
    SubscriptionMeta,
    SubscriptionRef,
    read_meta,
)
from txn_core.errors import CorruptDataError
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64())])
ACK_TIMEOUT = 10_000
SESSION = 4_000


@pytest.fixture
def env() -> tuple[txn_core.Log, FakeClock, str]:
    clock = FakeClock()
    name = uuid.uuid4().hex
    log = txn_core.Log(MemoryStorage(name), clock=clock)
    log.create_topic("in", 1, SCHEMA)
    p = log.producer()
    for i in range(0, 12, 4):
        p.send("in", pa.table({"id": list(range(i, i + 4))}), partition=0)
        p.flush()
    p.close()
    return log, clock, name


def _excl(log: txn_core.Log, name: str, **kw: Any) -> txn_core.SubscriptionConsumer:
    kw.setdefault("ack_timeout_ms", ACK_TIMEOUT)
    kw.setdefault("session_timeout_ms", SESSION)
    kw.setdefault("range_size", 8)
    return log.subscribe("in", 0, "x", consumer_name=name, subscription_type="exclusive", **kw)


def _offsets(t: pa.Table) -> list[int]:
    offsets: list[int] = t.column("_offset").to_pylist()
    return offsets


def test_a_second_consumer_is_refused_with_the_holders_name_and_when_its_hold_lapses(env: Any) -> None:
    log, clock, _ = env
    first = _excl(log, "first")
    with pytest.raises(ConsumerBusyError) as err:
        _excl(log, "second")
    assert err.value.holder == first.consumer_id and first.consumer_id.startswith("first-")
    assert err.value.expires_ms == clock.now + SESSION
    message = str(err.value)
    assert first.consumer_id in message and f"{SESSION} ms from now" in message and "Close that consumer" in message
    assert "subscription 'x' of in-0" in message


def test_the_next_consumer_takes_over_at_once_when_the_holder_closes(env: Any) -> None:
    log, _clock, _ = env
    first = _excl(log, "first")
    assert _offsets(first.receive(100)) == list(range(12))
    first.acknowledge([0, 1, 2])
    first.close()
    second = _excl(log, "second")
    assert _offsets(second.receive(100)) == list(range(3, 12))  # released leases: redelivered now


def test_a_killed_holder_is_replaced_once_its_hold_and_leases_lapse(env: Any) -> None:
    """A holder that dies without closing: its hold lapses after the session timeout, the ranges it leased
    after the ack timeout; the records it had in flight then go to the new holder."""
    log, clock, _ = env
    first = _excl(log, "first")
    assert _offsets(first.receive(5)) == list(range(5))
    clock.now += SESSION - 1
    with pytest.raises(ConsumerBusyError):
        _excl(log, "second")
    clock.now += 1
    second = _excl(log, "second")
    assert _offsets(second.receive(100)) == list(range(8, 12))  # range [0, 8) is still leased by the first
    clock.now += ACK_TIMEOUT - SESSION
    assert _offsets(second.receive(100)) == list(range(8))


def test_a_holder_that_lost_its_hold_is_told_who_has_it_and_gives_its_ranges_up(env: Any) -> None:
    """A paused holder (a long garbage collection, say) comes back after another consumer took over: its
    receive fails naming the new holder, and the ranges it leased are released to it."""
    log, clock, _ = env
    first = _excl(log, "first", session_timeout_ms=SESSION)
    assert _offsets(first.receive(3)) == [0, 1, 2]
    clock.now += SESSION
    second = _excl(log, "second")
    with pytest.raises(ConsumerBusyError) as err:
        first.receive(10)
    assert err.value.holder == second.consumer_id
    assert f"consumer {first.consumer_id!r} no longer holds" in str(err.value)
    assert _offsets(second.receive(100)) == list(range(12))  # nothing waits for the first one's leases
    first.acknowledge([0])  # what it had in flight it may still acknowledge: at-least-once
    assert second.state().status(0) is AckStatus.ACKED


def test_receiving_renews_the_hold_once_half_of_it_is_spent(env: Any) -> None:
    log, clock, _ = env
    first = _excl(log, "first")
    clock.now += SESSION // 2 - 1
    first.receive(1)  # more than half left: not renewed
    clock.now += 1
    with pytest.raises(ConsumerBusyError) as err:
        _excl(log, "second")
    assert err.value.expires_ms == clock.now + SESSION // 2
    first.receive(1)  # half spent: renewed
    clock.now += SESSION // 2 + 1  # past the first generation, within the renewed one
    with pytest.raises(ConsumerBusyError) as err:
        _excl(log, "second")
    assert err.value.expires_ms == clock.now + SESSION // 2 - 1
    clock.now += SESSION // 2 - 1
    _excl(log, "second")


def test_a_lapsed_hold_nobody_took_is_taken_again_by_its_consumer(env: Any) -> None:
    log, clock, _ = env
    first = _excl(log, "first")
    assert _offsets(first.receive(2)) == [0, 1]
    clock.now += SESSION + 1  # the hold lapsed; the range lease (ack timeout) did not
    assert _offsets(first.receive(1)) == [2]
    with pytest.raises(ConsumerBusyError) as err:
        _excl(log, "second")
    assert err.value.holder == first.consumer_id


def test_a_transaction_of_a_killed_holder_keeps_its_records_from_the_next_one(env: Any) -> None:
    """The new holder never receives what a committed transaction of the old one acknowledged, nor what an
    open one holds; when that one times out, its records come back."""
    log, clock, _ = env
    first = _excl(log, "first")
    got = _offsets(first.receive(12))
    done = log.producer("done", transaction_timeout_ms=ACK_TIMEOUT)
    done.init_transactions()
    done.begin_transaction()
    first.acknowledge(got[:4], transaction=done)
    done.commit_transaction()
    done.wait_for_completion()
    dying = log.producer("dying", transaction_timeout_ms=ACK_TIMEOUT * 3)
    dying.init_transactions()
    dying.begin_transaction()
    first.acknowledge(got[4:8], transaction=dying)  # the process dies here: nothing more from either
    clock.now += ACK_TIMEOUT
    second = _excl(log, "second")
    assert _offsets(second.receive(100)) == list(range(8, 12))
    second.acknowledge(list(range(8, 12)))
    clock.now += ACK_TIMEOUT * 2 + 1  # the dead transaction times out; a replica aborts it
    assert _offsets(second.receive(100)) == list(range(4, 8))


def test_the_type_is_fixed_when_the_subscription_is_created(env: Any) -> None:
    log, _clock, _ = env
    _excl(log, "first").close()
    with pytest.raises(
        ConfigurationError,
        match=r"was created as exclusive; it cannot be opened as shared\. Subscribe with subscription_type='exclusive'",
    ):
        log.subscribe("in", 0, "x")
    log.subscribe("in", 0, "s").close()
    with pytest.raises(ConfigurationError, match="subscription_type='shared'"):
        log.subscribe("in", 0, "s", subscription_type="exclusive")
    with pytest.raises(ConfigurationError, match="'failover', 'key_shared', got 'exlusive'"):
        log.subscribe("in", 0, "y", subscription_type="exlusive")
    with pytest.raises(ConfigurationError, match="session_timeout_ms must be an int >= 2"):
        log.subscribe("in", 0, "y", subscription_type="exclusive", session_timeout_ms=0)
    assert log.subscription("in", 0, "x").describe().type is SubscriptionType.EXCLUSIVE


def test_metadata_of_a_shared_subscription_stays_readable_by_older_releases(env: Any) -> None:
    """Shared: version 1, no type field (as before types existed). Other types: version 2, which a release
    that knows only Shared refuses rather than consuming an exclusive subscription as a shared one."""
    ref = SubscriptionRef("in", 0, "x")
    shared = SubscriptionMeta(ref, 0, 8, 1).to_json()
    assert shared["version"] == META_VERSION and "type" not in shared
    exclusive = SubscriptionMeta(ref, 0, 8, 1, SubscriptionType.EXCLUSIVE).to_json()
    assert exclusive["version"] == META_VERSION_TYPED and exclusive["type"] == "exclusive"
    for value in (shared, exclusive):
        assert SubscriptionMeta.from_json(ref, value, "k").to_json() == value
    with pytest.raises(CorruptDataError, match="malformed"):
        SubscriptionMeta.from_json(ref, {**exclusive, "type": "queue"}, "k")
    log, _clock, _ = env
    _excl(log, "a").close()
    assert read_meta(log.storage, SubscriptionRef("in", 0, "x")).type is SubscriptionType.EXCLUSIVE


def test_an_idle_holders_renewals_are_trimmed_and_the_hold_still_refuses_others(env: Any) -> None:
    """An idle holder renews its hold every half session timeout: one object each time. Trimming (the
    consumer's own, every 30 s) keeps the newest two generations, and the hold is still found and held."""
    log, clock, _ = env
    root = "subscriptions/in/00000/x/"
    holder = _excl(log, "holder")
    for _ in range(40):  # 40 half sessions: 40 renewals, and two of the holder's trims
        clock.now += SESSION // 2
        holder.receive(10)
    generations = sorted(log.storage.list(root + "hold/"))
    since_trim = TRIM_EVERY_MS // (SESSION // 2) + 1  # renewals since its last trim, at most
    assert int(generations[0]) > 0 and len(generations) <= 2 + since_trim < 40, generations  # 41 untrimmed
    assert int(generations[-1]) >= 40  # the generations went on counting: none was re-created
    with pytest.raises(txn_core.ConsumerBusyError) as busy:
        _excl(log, "second")
    assert busy.value.holder == holder.consumer_id
    log.subscription("in", 0, "x").trim(min_age_ms=0, check_min_age=False)
    assert len(log.storage.list(root + "hold/")) == 2
    holder.close()
    assert _excl(log, "second").receive(100).num_rows == 12  # released: taken at once, its records redelivered
