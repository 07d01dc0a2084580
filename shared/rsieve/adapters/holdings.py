"""Holdings and heartbeats in Redis (the rules: rsieve.run.holdings).

- `rsieve:holder:<holder>`: the holder's heartbeat, a key with a TTL of `lapse_s`, set
  again every `heartbeat_s` by its heartbeat thread (services/stage.py). Expiry is Redis's
  clock, so no two hosts' clocks are compared.
- `rsieve:holdings`: a hash, field `<holder>|<task id>` -> the Holding's JSON, written when
  a stage task starts (with the heartbeat, one pipelined round trip) and deleted when it
  returns.
- `rsieve:run:<run>:orphaned`: a list of the run's orphaned holdings requeued (status).
- `rsieve:run:<run>:failed`: a hash shard -> reason of the run's failed shards (written by
  the stage machinery; read here for status).

An orphaned holding's message is put back the way kombu itself restores one (kombu's
`restore_by_tag`): taken out of its unacked hash and pushed to the front of its queue, in
one Lua script that first deletes the holding. Whoever deletes the holding requeues it,
so any number of watchers requeue it once; the message is requeued only while it is still
the unacked delivery the dead holder took (same entry, delivered no later than it
started), so a message already restored (visibility timeout, a rejected task) or acked is
never pushed twice."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis

from rsieve import redis_keys
from rsieve.run.holdings import Holding, orphaned

__all__ = ["Holdings"]

log = logging.getLogger("rsieve")

# kombu's Redis transport (Channel.unacked_key, unacked_index_key; no global_keyprefix).
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"


# KEYS: holdings, unacked, unacked_index, queue, orphaned list
# ARGV: holding field, delivery tag, unacked entry as read, message to push, started_at,
#       record if requeued, kept seconds, record if not
# Returns 0: another watcher claimed it; 1: requeued; 2: claimed, its message was no
# longer the dead holder's unacked delivery (acked, or restored already).
_CLAIM = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
local result = 2
if ARGV[2] ~= '' then
  local entry = redis.call('HGET', KEYS[2], ARGV[2])
  local at = redis.call('ZSCORE', KEYS[3], ARGV[2])
  if entry and entry == ARGV[3] and at and tonumber(at) <= tonumber(ARGV[5]) + 1 then
    redis.call('HDEL', KEYS[2], ARGV[2])
    redis.call('ZREM', KEYS[3], ARGV[2])
    redis.call('RPUSH', KEYS[4], ARGV[4])
    result = 1
  end
end
if KEYS[5] ~= '' then
  redis.call('RPUSH', KEYS[5], result == 1 and ARGV[6] or ARGV[8])
  redis.call('EXPIRE', KEYS[5], ARGV[7])
end
return result
"""


class Holdings:
    def __init__(self, client: redis.Redis, lapse_s: float) -> None:
        self.redis = client
        self.lapse_s = max(1, int(lapse_s))
        self._claim = client.register_script(_CLAIM)

    def beat(self, holder: str) -> None:
        self.redis.set(redis_keys.holder(holder), repr(time.time()), ex=self.lapse_s)

    def hold(self, h: Holding) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(redis_keys.holder(h.holder), repr(time.time()), ex=self.lapse_s)
        pipe.hset(redis_keys.HOLDINGS, h.field, h.model_dump_json())
        pipe.execute()

    def release(self, field: str) -> None:
        self.redis.hdel(redis_keys.HOLDINGS, field)

    def all(self) -> list[Holding]:
        found = []
        for field, raw in self.redis.hgetall(redis_keys.HOLDINGS).items():
            try:
                found.append(Holding.model_validate_json(raw))
            except ValueError:
                log.warning("unreadable holding %r dropped", field)
                self.redis.hdel(redis_keys.HOLDINGS, field)
        return found

    def alive(self, holders: set[str]) -> dict[str, bool]:
        names = sorted(holders)
        if not names:
            return {}
        beats = self.redis.mget([redis_keys.holder(h) for h in names])
        return {h: b is not None for h, b in zip(names, beats, strict=True)}

    def reap(self) -> list[Holding]:
        """Requeue every orphaned holding (the ones this call claimed); never raises for
        one holding's unreadable message."""
        holdings = self.all()
        requeued = []
        for h in orphaned(holdings, self.alive({h.holder for h in holdings})):
            if self.claim(h):
                requeued.append(h)
        return requeued

    def claim(self, h: Holding) -> bool:
        """Requeue one orphaned holding unless another watcher claimed it; True when this
        call claimed it."""
        tag = h.delivery_tag or ""
        entry = self.redis.hget(UNACKED, tag) if tag else None
        message = b""
        if entry is not None:
            try:
                payload, _exchange, _routing_key = json.loads(entry)
                # As kombu marks a restored message (Channel._do_restore_message).
                payload.setdefault("headers", {})["redelivered"] = True
                payload.setdefault("properties", {}).setdefault("delivery_info", {})[
                    "redelivered"
                ] = True
                message = json.dumps(payload).encode()
            except (ValueError, TypeError, AttributeError):
                log.warning("unacked message %s unreadable: left to the visibility timeout", tag)
                entry = None
        now = time.time()
        record = {
            "task": h.task,
            "stage": h.stage,
            "shard": h.shard,
            "holder": h.holder,
            "delivery_id": h.delivery_id,
            "held_s": round(now - h.started_at, 1),
            "requeued_at": now,
        }
        result = int(
            self._claim(
                keys=[
                    redis_keys.HOLDINGS,
                    UNACKED,
                    UNACKED_INDEX,
                    h.queue,
                    redis_keys.run_orphaned(h.run) if h.run else "",
                ],
                args=[
                    h.field,
                    tag if entry is not None else "",
                    entry or b"",
                    message,
                    repr(h.started_at),
                    json.dumps(record | {"requeued": True}),
                    redis_keys.KEPT_S,
                    json.dumps(record | {"requeued": False}),
                ],
            )
        )
        if result == 1:
            log.warning(
                "requeued %s run=%s shard=%s: its holder %s stopped beating",
                h.task,
                h.run,
                h.shard,
                h.holder,
            )
        return result != 0

    def requeued(self, run: str) -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.redis.lrange(redis_keys.run_orphaned(run), 0, -1)]

    def failed(self, run: str) -> dict[str, str]:
        """The run's failed shards (the hash the stage machinery writes: field -> a JSON
        record with `shard`, `error`, `message`, or a plain reason) as shard -> reason."""
        out = {}
        for field, raw in self.redis.hgetall(redis_keys.run_failed(run)).items():
            name = field.decode(errors="replace") if isinstance(field, bytes) else str(field)
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            try:
                value = json.loads(text)
            except ValueError:
                value = text
            if isinstance(value, dict):
                name = str(value.get("shard") or value.get("task") or name)
                text = str(
                    value.get("reason")
                    or ": ".join(str(value[k]) for k in ("error", "message") if value.get(k))
                    or text
                )
            out[name] = text
        return out
