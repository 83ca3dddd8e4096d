"""The Lua scripts of the Redis coordination backend (coordinator/backend_redis.py), one per
operation: each read-check-write runs atomically on the server, and every time is the Redis
clock (`TIME` inside the script). Each must stay safe to run twice (epoch checks,
compare-and-set): the client retries once after a lost connection.
"""

# Shared by every script below: the server clock in ms, and (de)coding of one bucket's state.
# HGET of a missing field gives Lua `false`, which reads as "unowned at epoch 0".
PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function load(raw)
  if not raw then return {e = 0} end
  return cjson.decode(raw)
end
local function save(key, bucket, st)
  redis.call('HSET', key, bucket, cjson.encode(st))
end
"""

# KEYS: members, member key. ARGV: channel, payload, member, lease_ms, prune_after_ms.
# Refresh the lease; prune long-dead entries; publish only if the member was not live before,
# so a join wakes everyone at once but routine heartbeats wake nobody. Returns 1 if new.
HEARTBEAT = (
    PRELUDE
    + """
local now, lease = now_ms(), tonumber(ARGV[4])
local old = redis.call('ZSCORE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
redis.call('SET', KEYS[2], now + lease, 'PX', lease)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[5])))
if old and tonumber(old) > now then return 0 end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
"""
)

# KEYS: leader. ARGV: member, lease_ms. Renew if we hold it (compare, then PEXPIRE), take it
# if free (an expired key reads as free), else refuse. Returns 1 iff we hold it afterwards.
TRY_LEAD = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: members, leader, buckets. Everything `view()` needs in one round trip, with the
# server's now so liveness and overdue revokes are judged on the Redis clock:
# {now_ms, [member, expiry_ms, ...] (live only), leader or nil, leader PTTL, HGETALL buckets}.
VIEW = (
    PRELUDE
    + """
local now = now_ms()
return {now, redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES'),
        redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2]), redis.call('HGETALL', KEYS[3])}
"""
)

# KEYS: leader, buckets. ARGV: channel, payload, leader, revoke_deadline_ms, then groups of
# (bucket, expected_epoch, kind, target). The leadership check and every epoch check happen
# in the same atomic step as the writes, so a deposed leader can never apply a stale plan.
# Returns -1 if `leader` does not hold the leadership, else the number of changes applied.
APPLY = (
    PRELUDE
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[3] then return -1 end
local now, applied = now_ms(), 0
for i = 5, #ARGV, 4 do
  local st, kind, target = load(redis.call('HGET', KEYS[2], ARGV[i])), ARGV[i + 2], ARGV[i + 3]
  if st.e == tonumber(ARGV[i + 1]) then
    if kind == 'assign' then
      st.o, st.n, st.d, st.e = target, nil, nil, st.e + 1
    elseif kind == 'revoke' then
      st.n, st.d = target, now + tonumber(ARGV[4])
    else
      st.n, st.d = nil, nil
    end
    save(KEYS[2], ARGV[i], st)
    applied = applied + 1
  end
end
if applied > 0 then redis.call('PUBLISH', ARGV[1], ARGV[2]) end
return applied
"""
)

# KEYS: buckets. ARGV: channel, payload, member, bucket... The old owner completes pending
# hand-offs it still holds: owner := next_owner, epoch + 1. Returns how many moved.
HAND_OVER = (
    PRELUDE
    + """
local moved = 0
for i = 4, #ARGV do
  local st = load(redis.call('HGET', KEYS[1], ARGV[i]))
  if st.o == ARGV[3] and st.n and st.n ~= ARGV[3] then
    st.o, st.n, st.d, st.e = st.n, nil, nil, st.e + 1
    save(KEYS[1], ARGV[i], st)
    moved = moved + 1
  end
end
if moved > 0 then redis.call('PUBLISH', ARGV[1], ARGV[2]) end
return moved
"""
)

# KEYS: members, member key, leader, buckets. ARGV: channel, payload, member. Graceful exit:
# drop the member, pass each owned bucket to its pending next_owner (else unowned), epoch + 1;
# void hand-offs *to* the leaver (its old owner keeps polling instead of handing to a ghost);
# resign leadership if held (compare-and-delete). Returns the number of buckets released.
LEAVE = (
    PRELUDE
    + """
local m, released = ARGV[3], 0
redis.call('ZREM', KEYS[1], m)
redis.call('DEL', KEYS[2])
if redis.call('GET', KEYS[3]) == m then redis.call('DEL', KEYS[3]) end
local all = redis.call('HGETALL', KEYS[4])
for i = 1, #all, 2 do
  local st = cjson.decode(all[i + 1])
  if st.o == m then
    if st.n and st.n ~= m then st.o = st.n else st.o = nil end
    st.n, st.d, st.e = nil, nil, st.e + 1
    save(KEYS[4], all[i], st)
    released = released + 1
  elseif st.n == m then
    st.n, st.d = nil, nil
    save(KEYS[4], all[i], st)
  end
end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return released
"""
)

# name -> source, registered once per client (EVALSHA, reloaded on NOSCRIPT).
SCRIPTS: dict[str, str] = {
    "heartbeat": HEARTBEAT,
    "try_lead": TRY_LEAD,
    "view": VIEW,
    "apply": APPLY,
    "hand_over": HAND_OVER,
    "leave": LEAVE,
}
