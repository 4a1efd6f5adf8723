"""Key_Shared subscriptions: the records of one key go to one consumer at a time, in order; keys split evenly
over the consumers or by sticky ranges; hand-over on join, leave and death (PROTOCOL.md "Subscription types",
"Key_Shared"). In-process scenarios on the memory backend with a fake clock, and a seeded model run."""

from __future__ import annotations

import random
import uuid
import zlib
from collections import defaultdict
from typing import Any, cast

import pyarrow as pa
import pytest
from fakeclock import FakeClock
from test_subscriptions_random import _Acks, _drain_to_the_end

import txn_core
from txn_core import AckStatus, SubscriptionType
from txn_core.clients.subscriptions.keydispatch import SLICE_CHECK_MS
from txn_core.clients.subscriptions.keys import KEY_SLICES, SLICE_SIZE, auto_split, key_hash, slices_of
from txn_core.clients.subscriptions.seats import KeySharedSeat
from txn_core.clients.subscriptions.store import list_subscriptions
from txn_core.errors import ConfigurationError
from txn_core.storage import MemoryStorage

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string())])
ACK_TIMEOUT = 10_000
SESSION = 4_000
KEYS = [f"key-{i}" for i in range(24)]


def _slice(key: object) -> int:
    return key_hash(key) // SLICE_SIZE


def _log(rows: int = 96, keys: list[str] = KEYS) -> tuple[txn_core.Log, FakeClock, dict[int, str]]:
    """A log whose topic ``in`` holds ``rows`` records (id i has key ``keys[i % len(keys)]``), in entries of 8;
    returns it, its clock and each offset's key."""
    clock = FakeClock()
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex), clock=clock)
    log.create_topic("in", 1, SCHEMA)
    p = log.producer()
    for i in range(0, rows, 8):
        ids = list(range(i, min(rows, i + 8)))
        p.send("in", pa.table({"id": ids, "k": [keys[j % len(keys)] for j in ids]}), partition=0)
        p.flush()
    p.close()
    return log, clock, {i: keys[i % len(keys)] for i in range(rows)}


def _consumer(log: txn_core.Log, name: str, **kw: Any) -> txn_core.SubscriptionConsumer:
    kw.setdefault("ack_timeout_ms", ACK_TIMEOUT)
    kw.setdefault("session_timeout_ms", SESSION)
    return log.subscribe(
        "in", 0, "ks", consumer_name=name, subscription_type="key_shared", key_column="k", **kw
    )  # fmt: skip


def _offsets(t: pa.Table) -> list[int]:
    offsets: list[int] = t.column("_offset").to_pylist()
    return offsets


def test_the_key_hash_is_crc32_of_the_key_bytes_modulo_65536_and_slices_split_evenly() -> None:
    """The hash other languages compute alike (PROTOCOL.md "Routing" key bytes), and the auto split."""
    assert key_hash("key-1") == zlib.crc32(b"key-1") % 65536
    assert (
        key_hash(7) == zlib.crc32((7).to_bytes(8, "little")) % 65536 and key_hash(None) == zlib.crc32(b"\x00") % 65536
    )
    assert slices_of(pa.array(["key-1", None, "key-1"])).tolist() == [_slice("key-1"), _slice(None), _slice("key-1")]
    assert slices_of(pa.array(["x", "y"]).dictionary_encode()).tolist() == [_slice("x"), _slice("y")]
    three = [auto_split(["a", "b", "c"], m) for m in ("a", "b", "c")]
    assert set().union(*three) == set(range(KEY_SLICES)) and sum(map(len, three)) == KEY_SLICES
    assert [min(s) for s in three] == [0, 21, 42] and auto_split(["a"], "z") == frozenset()


def test_each_key_goes_to_one_consumer_and_in_order() -> None:
    """Three consumers split the keys: every record is delivered once, all records of a key to one consumer,
    in offset order, and each consumer gets exactly the keys of its slices."""
    log, clock, key_of = _log()
    consumers = [_consumer(log, n) for n in ("a", "b", "c")]
    clock.now += SESSION // 4  # each has listed the others since the last joined
    got: dict[str, list[int]] = defaultdict(list)
    for _ in range(20):
        for c in consumers:
            t = c.receive(7)
            got[c.consumer_id] += _offsets(t)
            c.acknowledge(t)
    assert sorted(o for offs in got.values() for o in offs) == list(range(96))
    ids = sorted(c.consumer_id for c in consumers)
    for c in consumers:
        mine = got[c.consumer_id]
        assert mine == sorted(mine) and mine  # within a look, in offset order across keys too
        assert {_slice(key_of[o]) for o in mine} <= auto_split(ids, c.consumer_id)
    assert consumers[0].state().mark_delete == 96
    d = log.subscription("in", 0, "ks").describe()
    assert d.type is SubscriptionType.KEY_SHARED and d.consumers == tuple(ids)
    assert d.key_column == "k" and d.key_mode == "auto_split"


def test_a_joining_consumer_gets_a_key_only_once_the_previous_holder_settled_it() -> None:
    """a holds every key; b joins and wants half the slices. a stops delivering them at once, keeps the slices
    with records in flight until they are acknowledged, then releases them; b gets those keys from there on,
    never a record of a key while a still holds one of it."""
    log, clock, key_of = _log()
    a = _consumer(log, "a")
    first = _offsets(a.receive(30))
    assert first == list(range(30))
    b = _consumer(log, "b")
    clock.now += SESSION // 4  # a lists the members again: b wants its share
    mine_b = auto_split(sorted([a.consumer_id, b.consumer_id]), b.consumer_id)
    mine_a = auto_split(sorted([a.consumer_id, b.consumer_id]), a.consumer_id)
    later_a = _offsets(a.receive(100))
    assert later_a and all(_slice(key_of[o]) in mine_a for o in later_a)  # b's keys are no longer a's to deliver
    held_b_keys = {key_of[o] for o in first if _slice(key_of[o]) in mine_b}
    assert held_b_keys
    got_b = _offsets(b.receive(100))
    assert all(key_of[o] not in held_b_keys for o in got_b)  # those keys wait for a
    a.acknowledge(first + later_a)
    a.receive(100)  # nothing of b's slices in flight: a releases them
    clock.now += SLICE_CHECK_MS  # b looks at the slices it wants again
    rest = _offsets(b.receive(100))
    assert rest and all(_slice(key_of[o]) in mine_b for o in rest)
    assert rest == sorted(rest) and {key_of[o] for o in rest} & held_b_keys
    b.acknowledge(rest)
    assert b.state().mark_delete == 96 or not set(range(96)) - set(first + later_a + got_b + rest)


def test_when_a_consumer_dies_its_keys_go_to_the_others_from_the_acknowledged_position() -> None:
    """a is killed (no close) with records in flight: after its session its slices are b's to want, after its
    leases lapse b claims them and delivers a's unacknowledged records first, in order, then the rest."""
    log, clock, _ = _log()
    a, b = _consumer(log, "a"), _consumer(log, "b")
    clock.now += SESSION // 4
    got_a = _offsets(a.receive(100))
    got_b = _offsets(b.receive(100))
    assert got_a and got_b and not set(got_a) & set(got_b)
    a.acknowledge(got_a[:5])
    b.acknowledge(got_b)
    clock.now += SESSION  # a's membership lapsed: b wants every slice, but a's leases still run
    assert not b.receive(100).num_rows
    clock.now += ACK_TIMEOUT - SESSION
    again = _offsets(b.receive(100))
    assert again == got_a[5:]  # a's unacknowledged records, in order
    b.acknowledge(again)
    assert b.state().mark_delete == 96


def test_closing_hands_the_keys_over_at_once() -> None:
    log, clock, _ = _log()
    a, b = _consumer(log, "a"), _consumer(log, "b")
    clock.now += SESSION // 4
    got_a = _offsets(a.receive(100))
    b.acknowledge(b.receive(100))
    a.close()  # releases its slices and leaves
    clock.now += SESSION // 4  # b lists the members again: it wants every slice
    assert _offsets(b.receive(100)) == got_a


def test_sticky_consumers_take_the_ranges_they_name_and_overlaps_are_refused() -> None:
    log, clock, key_of = _log()
    low = _consumer(log, "low", key_ranges=[(0, 32767)])
    high = _consumer(log, "high", key_ranges=[(32768, 65535)])
    overlap = r"overlap \[\(32768, 65535\)\] held by consumer 'high-\w+'; \[\(0, 32767\)\] held by consumer 'low-"
    with pytest.raises(txn_core.ConsumerBusyError, match=overlap) as exc:
        _consumer(log, "third", key_ranges=[(0, 1023), (40960, 41983)])
    assert exc.value.holder == high.consumer_id
    with pytest.raises(
        txn_core.ConsumerBusyError, match=r"\[\(0, 1023\)\] overlap \[\(0, 32767\)\] held by consumer 'low-"
    ):
        _consumer(log, "fourth", key_ranges=[(0, 1023)])
    got_low, got_high = _offsets(low.receive(100)), _offsets(high.receive(100))
    assert sorted(got_low + got_high) == list(range(96))
    assert all(key_hash(key_of[o]) < 32768 for o in got_low) and all(key_hash(key_of[o]) >= 32768 for o in got_high)
    high.close()  # a sticky range nobody holds is delivered by nobody: no other consumer wants it
    clock.now += 2 * ACK_TIMEOUT
    low.acknowledge(got_low)
    assert not low.receive(100).num_rows
    assert _offsets(_consumer(log, "high2", key_ranges=[(32768, 65535)]).receive(100)) == got_high


def test_bad_key_shared_settings_name_the_fix() -> None:
    log, _, _ = _log(8)
    with pytest.raises(ConfigurationError, match=r"needs key_column, the column whose value is the key \(one of"):
        log.subscribe("in", 0, "x", subscription_type="key_shared")
    with pytest.raises(ConfigurationError, match="key_column 'key' is not a column of topic 'in': columns are"):
        log.subscribe("in", 0, "x", subscription_type="key_shared", key_column="key")
    with pytest.raises(ConfigurationError, match="key_column and key_ranges are for subscription_type='key_shared'"):
        log.subscribe("in", 0, "x", key_column="k")
    with pytest.raises(ConfigurationError, match=r"key range \(0, 100\) does not fall on slice bounds.*\(0, 1023\)"):
        _consumer(log, "a", key_ranges=[(0, 100)])
    with pytest.raises(ConfigurationError, match=r"key ranges \(0, 2047\) and \(1024, 3071\) overlap"):
        _consumer(log, "a", key_ranges=[(1024, 3071), (0, 2047)])
    with pytest.raises(ConfigurationError, match=r"need 0 <= first <= last <= 65535"):
        _consumer(log, "a", key_ranges=[(0, 65536)])
    with pytest.raises(ConfigurationError, match="key_ranges is empty"):
        _consumer(log, "a", key_ranges=[])
    _consumer(log, "a").close()  # created auto split
    with pytest.raises(ConfigurationError, match="was created auto_split: its consumers subscribe without key_ranges"):
        _consumer(log, "b", key_ranges=[(0, 1023)])
    with pytest.raises(
        ConfigurationError, match="keys records by column 'k'; it cannot be opened with key_column='id'"
    ):
        log.subscribe("in", 0, "ks", subscription_type="key_shared", key_column="id")
    with pytest.raises(ConfigurationError, match="was created as key_shared; it cannot be opened as shared"):
        log.subscribe("in", 0, "ks")


def test_transactional_acknowledgements_of_a_dead_consumer_hold_its_keys_until_the_transaction_ends() -> None:
    """a acknowledges some records in a transaction and dies: b never gets them while the transaction is open,
    gets them once it aborts (its timeout), and never gets those of a committed one."""
    log, clock, _ = _log()
    a, b = _consumer(log, "a"), _consumer(log, "b")
    clock.now += SESSION // 4
    got = _offsets(a.receive(100))
    committed = log.producer("committed", transaction_timeout_ms=ACK_TIMEOUT)
    committed.init_transactions()
    committed.begin_transaction()
    a.acknowledge(got[:4], transaction=committed)
    committed.commit_transaction()
    committed.wait_for_completion()
    dying = log.producer("dying", transaction_timeout_ms=3 * ACK_TIMEOUT)
    dying.init_transactions()
    dying.begin_transaction()
    a.acknowledge(got[4:8], transaction=dying)  # a dies here
    b.acknowledge(b.receive(100))
    clock.now += ACK_TIMEOUT
    assert _offsets(b.receive(100)) == got[8:]
    b.acknowledge(got[8:])
    clock.now += 2 * ACK_TIMEOUT + 1  # the dead transaction times out; a replica aborts it
    assert _offsets(b.receive(100)) == got[4:8]
    assert all(b.state().status(o) is AckStatus.ACKED for o in got[:4])


def _holder_dies_in_a_transaction(
    log: txn_core.Log, clock: FakeClock
) -> tuple[txn_core.SubscriptionConsumer, txn_core.SubscriptionConsumer, list[int]]:
    """Two consumers, the log's records all of one key: the one that holds it acknowledges them in a
    transaction (timeout three ack timeouts) and dies. Returns (holder, the other, the held offsets)."""
    a, b = _consumer(log, "a"), _consumer(log, "b")
    clock.now += SESSION // 4
    a.receive(100)
    b.receive(100)
    holder, other = (a, b) if a.unacknowledged() else (b, a)
    held = holder.unacknowledged()
    dying = log.producer("dying", transaction_timeout_ms=3 * ACK_TIMEOUT)
    dying.init_transactions()
    dying.begin_transaction()
    holder.acknowledge(held, transaction=dying)  # the holder dies here
    return holder, other, held


def test_records_held_by_a_dead_consumers_transaction_come_back_to_the_next_holder_when_it_aborts() -> None:
    """One key: its holder acknowledges everything in a transaction and dies. The other consumer finds nothing
    deliverable while the transaction is open (and must not look past those records), and gets them all, in
    order, once the transaction times out and aborts."""
    log, clock, _ = _log(16, ["one"])
    _holder, other, got = _holder_dies_in_a_transaction(log, clock)
    assert got == list(range(16)) and not other.unacknowledged()
    clock.now += ACK_TIMEOUT + SESSION  # its session and lease lapsed: the other wants and may claim the key
    assert not other.receive(100).num_rows  # held by the open transaction
    clock.now += 2 * ACK_TIMEOUT + 1  # the transaction times out; a replica aborts it
    assert _offsets(other.receive(100)) == got


def test_a_record_delivered_again_under_a_half_spent_lease_renews_the_lease_first() -> None:
    """A negatively acknowledged record goes out again only with at least half an ack timeout of lease ahead
    (PROTOCOL.md "Dispatch"): past half its lease, the redelivery renews the slice first."""
    log, clock, _ = _log(8, ["one"])
    a = _consumer(log, "a", nack_delay_ms=0)
    assert _offsets(a.receive(1)) == [0]
    a.negative_acknowledge([0])
    clock.now += ACK_TIMEOUT // 2 + 1
    assert _offsets(a.receive(1)) == [0]  # again, under a renewed lease
    clock.now += ACK_TIMEOUT // 2  # the first lease has lapsed by now
    s = _slice("one")
    assert log.subscription("in", 0, "ks").describe().key_holders == {a.consumer_id: ((s * 1024, s * 1024 + 1023),)}


def test_idle_consumers_write_nothing_and_trimming_keeps_slice_leases_bounded() -> None:
    log, clock, _ = _log()
    a = _consumer(log, "a")
    root = "subscriptions/in/00000/ks/keys/"
    for _ in range(12):  # busy: every half ack timeout its slices' leases are renewed
        a.acknowledge(a.receive(8))
        clock.now += ACK_TIMEOUT // 2
    before = sorted(log.storage.list(root))
    assert a.state().mark_delete == 96 and before
    for _ in range(6):
        clock.now += SESSION // 16
        assert not a.receive(100).num_rows
    assert set(log.storage.list(root)) <= set(before)  # idle: no slice claimed or renewed (old ones trimmed)
    log.subscription("in", 0, "ks").trim(min_age_ms=0, check_min_age=False)
    gens: dict[str, int] = defaultdict(int)
    for name in log.storage.list(root):
        gens[name.partition("-")[0]] += 1
    assert gens and max(gens.values()) <= 2


def test_keys_of_any_type_and_null_keys_are_dispatched() -> None:
    clock = FakeClock()
    log = txn_core.Log(MemoryStorage(uuid.uuid4().hex), clock=clock)
    log.create_topic("in", 1, pa.schema([("id", pa.int64()), ("k", pa.int64())]))
    p = log.producer()
    p.send(
        "in", pa.table({"id": list(range(40)), "k": [None if i % 5 == 0 else i % 7 for i in range(40)]}), partition=0
    )
    p.close()
    a = log.subscribe("in", 0, "ks", subscription_type="key_shared", key_column="k", consumer_name="a")
    b = log.subscribe("in", 0, "ks", subscription_type="key_shared", key_column="k", consumer_name="b")
    clock.now += 30_000 // 4
    ta, tb = a.receive(100), b.receive(100)
    assert sorted(_offsets(ta) + _offsets(tb)) == list(range(40))
    assert not set(ta.column("k").to_pylist()) & set(tb.column("k").to_pylist())  # null is one key too


# --- the model ----------------------------------------------------------------------------------------------


@pytest.mark.matrix(keep=3)
@pytest.mark.parametrize("seed", range(10))
def test_random_key_shared_consumers_joining_leaving_and_killed_keep_keys_whole_and_ordered(seed: int) -> None:
    """Three consumer processes of a Key_Shared subscription start, close, are killed (left to their session
    and leases), pause, acknowledge plainly, in transactions and negatively. A record never comes while
    acknowledged or pending; a record of a key never reaches a consumer while another live one holds a record
    of that key with time left; a key's records are first delivered in offset order; once everything settles
    each live consumer receives only keys of its own slices; at the end everything is acknowledged exactly
    once."""
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(rng.choice([3, 9, 40]))]
    log, clock, key_of = _log(rng.choice([64, 160]), keys)
    end = len(key_of)
    procs: list[txn_core.SubscriptionConsumer | None] = [None, None, None]
    acks = _Acks(log, rng)
    acked = acks.acked
    held: dict[int, tuple[str, int]] = {}  # offset -> (consumer id, delivery time)
    first_delivered: set[int] = set()
    settled = 0

    def subscribe(i: int) -> txn_core.SubscriptionConsumer:
        return _consumer(log, f"c{i}", ack_timeout_ms=acks_t)

    acks_t = 10_000
    subscribe(9).close()

    def receive(c: txn_core.SubscriptionConsumer) -> list[int]:
        got: list[int] = c.receive(rng.randint(1, 6)).column("_offset").to_pylist()
        st = c.state()
        live = {p.consumer_id: p for p in procs if p is not None and p is not c}
        for o in got:
            assert o not in acked and st.status(o) is AckStatus.UNACKED, (seed, step, o)
            for other in live.values():
                for q in other.unacknowledged():
                    if key_of[q] == key_of[o] and q in held and held[q][0] == other.consumer_id:
                        assert clock.now - held[q][1] >= acks_t // 2, f"key {key_of[o]}: {q} and {o} at once"
            if o not in first_delivered:
                before = [q for q in range(o) if key_of[q] == key_of[o]]
                assert set(before) <= first_delivered, f"key {key_of[o]}: {o} before {set(before) - first_delivered}"
                first_delivered.add(o)
            held[o] = (c.consumer_id, clock.now)
        return got

    for step in range(250):
        i = rng.randrange(3)
        c = procs[i]
        op = rng.random()
        if c is None:
            if op < 0.5:
                procs[i] = subscribe(i)
        elif op < 0.3:
            receive(c)
        elif op < 0.55:
            acks.act(c)
        elif op < 0.62 and c.unacknowledged():
            c.negative_acknowledge(rng.sample(c.unacknowledged(), 1))
        elif op < 0.72:
            clock.now += rng.choice([200, 1000, SESSION // 2, SESSION])
        elif op < 0.8:
            # Settle: the dead's sessions and everyone's leases lapse, every live member renews its membership
            # and lists the others; then each receives only keys of the slices the split gives it.
            clock.now += acks_t + SESSION
            live = [p for p in procs if p is not None]
            for p in live:
                receive(p)  # renews its membership
            clock.now += SESSION // 4
            ids = sorted(p.consumer_id for p in live)
            for p in rng.sample(live, len(live)) * 2:
                for o in receive(p):
                    assert _slice(key_of[o]) in auto_split(ids, p.consumer_id), (seed, step)
            settled += 1
        elif op < 0.9:
            c.close()
            procs[i] = None
        else:
            procs[i] = None  # killed
        st = log.subscription("in", 0, "ks").state()
        st._check()
        assert all(st.status(o) is AckStatus.ACKED for o in acked), (seed, step)

    assert settled and first_delivered
    acks.finish(procs, clock)
    _drain_to_the_end(subscribe(9), acked, end)


def test_keys_are_split_and_handed_over_on_every_backend(location: Any) -> None:
    """On a real clock and store: two consumers split the keys, and when one closes the other takes its keys
    (the listing of ``keys/`` and the member objects as each backend lists them)."""
    import time

    log = location.open()
    log.create_topic("in", 1, SCHEMA)
    p = log.producer()
    p.send("in", pa.table({"id": list(range(48)), "k": [KEYS[i % len(KEYS)] for i in range(48)]}), partition=0)
    p.close()
    a, b = (_consumer(log, n, session_timeout_ms=2_000) for n in ("a", "b"))
    time.sleep(0.6)  # each lists the members again (a quarter session): both see both
    got_a, got_b = _offsets(a.receive(100)), _offsets(b.receive(100))
    assert got_a and got_b and sorted(got_a + got_b) == list(range(48))
    assert not {KEYS[o % len(KEYS)] for o in got_a} & {KEYS[o % len(KEYS)] for o in got_b}
    b.acknowledge(got_b)
    a.close()  # releases its slices, leaves
    time.sleep(0.6)
    assert _offsets(b.receive(100, timeout_s=5)) == got_a
    held = log.subscription("in", 0, "ks").describe().key_holders
    assert list(held) == [b.consumer_id]
    b.close()


def test_a_record_held_by_an_open_transaction_does_not_hold_up_the_other_keys() -> None:
    """The holder of one key acknowledges its records in a transaction and dies; 3,000 records of other keys
    follow. The survivor delivers all of them while the transaction stays open (the held records are watched,
    not looked at again and again), and the held ones once it aborts."""
    log, clock, _ = _log(16, ["one"])
    _holder, other, held = _holder_dies_in_a_transaction(log, clock)
    more = log.producer()
    others = [k for k in KEYS if k != "one"]
    for i in range(16, 3_016, 100):
        ids = list(range(i, i + 100))
        more.send("in", pa.table({"id": ids, "k": [others[j % len(others)] for j in ids]}), partition=0)
        more.flush()
    more.close()
    clock.now += ACK_TIMEOUT + SESSION  # the holder's session and lease lapsed
    got: list[int] = []
    for _ in range(40):  # 30 would do: 100 records each
        t = other.receive(100)
        got += _offsets(t)
        other.acknowledge(t)
    assert sorted(got) == list(range(16, 3_016))
    clock.now += 2 * ACK_TIMEOUT + 1  # the transaction times out; a replica aborts it
    assert _offsets(other.receive(100)) == held


def test_records_taken_before_a_storage_error_are_handed_out_not_stranded() -> None:
    """A receive takes the records due again (negatively acknowledged), then claiming the slice of a new key
    fails (a storage error listing the slice leases). The records already taken are returned, not left in
    flight unseen until their lease lapses (and their key's later records delivered first); the error comes
    at the next receive."""
    from txn_core.errors import StorageError

    clock = FakeClock()
    storage = MemoryStorage(uuid.uuid4().hex)
    log = txn_core.Log(storage, clock=clock)
    log.create_topic("in", 1, SCHEMA)
    p = log.producer()
    p.send("in", pa.table({"id": list(range(8)), "k": ["one"] * 8}), partition=0)
    p.flush()
    c = _consumer(log, "a", nack_delay_ms=0)
    assert _offsets(c.receive(100)) == list(range(8))
    c.negative_acknowledge([0, 1])
    c.acknowledge(list(range(2, 8)))
    two = next(k for k in KEYS if _slice(k) != _slice("one"))
    p.send("in", pa.table({"id": list(range(8, 16)), "k": [two] * 8}), partition=0)
    p.close()
    real_list = storage.list

    def failing_list(prefix: str) -> list[str]:
        if prefix.endswith("/keys/"):
            raise StorageError(f"listing {prefix} failed")
        return real_list(prefix)

    storage.list = failing_list  # type: ignore[method-assign]
    assert _offsets(c.receive(100)) == [0, 1]  # taken before the claim failed: handed out
    assert c.unacknowledged() == [0, 1]
    with pytest.raises(StorageError, match=r"listing .*/keys/ failed"):
        c.receive(100)
    storage.list = real_list  # type: ignore[method-assign]
    c.acknowledge([0, 1])
    assert _offsets(c.receive(100)) == list(range(8, 16))


def test_key_ranges_on_another_type_are_refused_before_anything_is_created() -> None:
    log, _, _ = _log(8)
    with pytest.raises(ConfigurationError, match="key_ranges are for subscription_type='key_shared', not 'shared'"):
        log.subscribe("in", 0, "plain", key_ranges=[(0, 1023)])
    assert list_subscriptions(log.storage, "in", 0) == []


def test_a_sticky_conflict_is_found_even_when_the_holder_renews_while_it_is_read() -> None:
    """The overlap check lists the member objects, then reads them: a member that renewed in between (its
    listed object deleted, a newer one created) is listed and read again, not left out."""
    log, clock, _ = _log(8)
    low = _consumer(log, "low", key_ranges=[(0, 32767)])
    storage = log.storage
    real_read = storage.read

    def renewing_read(key: str, *args: Any) -> Any:
        if "/members/low-" in key and storage.read is renewing_read:
            storage.read = real_read  # type: ignore[method-assign]
            clock.now += SESSION // 2  # half its session spent: the next keep renews
            cast(KeySharedSeat, low._seat).members.keep(clock.now)  # the renewal, at the worst moment
        return real_read(key, *args)

    storage.read = renewing_read  # type: ignore[method-assign,assignment]
    with pytest.raises(txn_core.ConsumerBusyError, match=r"overlap \[\(0, 32767\)\] held by consumer 'low-"):
        _consumer(log, "second", key_ranges=[(0, 1023)])
    assert storage.read is real_read, "the read that raced a renewal happened"
