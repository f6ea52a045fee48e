-- Quotient: evaluate every policy of one subject atomically.
-- This script mirrors algorithm.go line for line (same integer state, same
-- double divisions in the same order); change both together.
--
-- KEYS: for each op, its state key, then its share key when the op is global.
-- ARGV[1]: '' (use Redis server TIME) or a time in µs (tests only).
-- ARGV[2]: number of ops; then 8 values per op:
--   algo (1 token, 2 leaky, 3 fixed, 4 sliding log, 5 sliding counter,
--   6 fixed replicated across regions), flags (1 enforce, 2 global), cost,
--   rate (milli-tokens/s), burst (milli-tokens), limit, window (ms), and this
--   region's name (algo 6).
-- Returns {allowed, then per op: admit, remaining, reset_ms, retry_ms, delay_ms}.
local nowus
if ARGV[1] ~= '' then
  nowus = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local ceil, floor = math.ceil, math.floor
local now = floor(nowus / 1000)
local NANO = 1000000000
local NANO_PER_MILLI = 1000000
local n = tonumber(ARGV[2])
local ops = {}
local ki = 1
local allowed = 1

local function nowfor(o)
  local a = o.algo
  if a == 3 or a == 5 or a == 6 then
    if o.a > now then return o.a end
  elseif a == 4 then
    local m = #o.log
    if m > 0 and o.log[m][1] > now then return o.log[m][1] end
  end
  return now
end

for i = 1, n do
  local b = 2 + (i - 1) * 8
  local o = {
    algo = tonumber(ARGV[b + 1]), flags = tonumber(ARGV[b + 2]),
    cost = tonumber(ARGV[b + 3]), rate = tonumber(ARGV[b + 4]),
    burst = tonumber(ARGV[b + 5]), limit = tonumber(ARGV[b + 6]),
    win = tonumber(ARGV[b + 7]), region = ARGV[b + 8], trim = 0,
  }
  o.key = KEYS[ki]
  ki = ki + 1
  o.enforce = (o.flags % 2) == 1
  if o.flags >= 2 and o.algo ~= 6 then
    local sh = redis.call('HMGET', KEYS[ki], 'r', 'b')
    ki = ki + 1
    if sh[1] and sh[2] then
      o.rate = tonumber(sh[1])
      o.burst = tonumber(sh[2])
    end
  end
  local algo, rate, burst = o.algo, o.rate, o.burst
  -- load and advance (algorithm.go: advance)
  if algo == 1 or algo == 2 then
    local v = redis.call('GET', o.key)
    local f = 0
    if v then f = tonumber(v) end
    local base = f
    if nowus > base then base = nowus end
    local maxdef = floor(burst * NANO_PER_MILLI / rate)
    if base - nowus > maxdef then base = nowus + maxdef end
    o.a = base
  elseif algo == 3 then
    local start = now - now % o.win
    local v = redis.call('HMGET', o.key, 'w', 'n')
    if not v[1] or start > tonumber(v[1]) then
      o.a, o.b = start, 0
    else
      o.a, o.b = tonumber(v[1]), tonumber(v[2])
    end
  elseif algo == 6 then
    local start = now - now % o.win
    local raw = redis.call('HGETALL', o.key)
    local w, cap, counts = nil, -1, {}
    for j = 1, #raw, 2 do
      local f, v = raw[j], raw[j + 1]
      if f == 'w' then
        w = tonumber(v)
      elseif f == 'cap' then
        cap = tonumber(v)
      elseif string.sub(f, 1, 2) == 'n:' then
        counts[string.sub(f, 3)] = tonumber(v)
      end
    end
    if not w or start > w then
      o.a, o.counts, o.cap, o.rolled = start, {}, -1, w ~= nil
    else
      o.a, o.counts, o.cap, o.rolled = w, counts, cap, false
    end
    o.total = 0
    for _, c in pairs(o.counts) do o.total = o.total + c end
    o.own = o.counts[o.region] or 0
  elseif algo == 5 then
    local start = now - now % o.win
    local v = redis.call('HMGET', o.key, 'w', 'c', 'p')
    if not v[1] then
      o.a, o.b, o.c = start, 0, 0
    else
      o.a, o.b, o.c = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
      if start <= o.a then
      elseif start == o.a + o.win then
        o.c, o.b, o.a = o.b, 0, start
      else
        o.c, o.b, o.a = 0, 0, start
      end
    end
  elseif algo == 4 then
    local raw = redis.call('LRANGE', o.key, 0, -1)
    local log = {}
    for j = 1, #raw do
      local s = raw[j]
      local p = string.find(s, ':', 1, true)
      log[j] = {tonumber(string.sub(s, 1, p - 1)), tonumber(string.sub(s, p + 1))}
    end
    local t = now
    if #log > 0 and log[#log][1] > t then t = log[#log][1] end
    local k = 0
    while k < #log and log[k + 1][1] <= t - o.win do k = k + 1 end
    o.trim = k
    o.log = {}
    for j = k + 1, #log do o.log[#o.log + 1] = log[j] end
  end

  -- decide (algorithm.go: decide)
  local t = nowfor(o)
  local admit = false
  local retry, delay = 0, 0
  if algo == 1 or algo == 2 then
    local capN = burst * NANO_PER_MILLI
    local def = (o.a - nowus) * rate
    if o.cost * 1000 > burst then
      retry = -1
    else
      local costN = o.cost * NANO
      admit = def + costN <= capN
      if admit and algo == 2 then
        delay = ceil((o.a - nowus) / 1000)
      elseif not admit then
        retry = ceil(ceil((def + costN - capN) / rate) / 1000)
      end
    end
  elseif algo == 3 then
    admit = o.b + o.cost <= o.limit
    if not admit then
      if o.cost > o.limit then retry = -1 else retry = o.a + o.win - t end
    end
  elseif algo == 6 then
    admit = o.total + o.cost <= o.limit and (o.cap < 0 or o.own + o.cost <= o.cap)
    if not admit then
      if o.cost > o.limit then retry = -1 else retry = o.a + o.win - t end
    end
  elseif algo == 5 then
    local e = t - o.a
    local est = o.c * (o.win - e) / o.win + o.b
    admit = est + o.cost <= o.limit
    if not admit then
      local need = o.limit - o.b - o.cost
      if o.cost > o.limit then
        retry = -1
      elseif need >= 0 then
        local e2 = o.win - floor(need * o.win / o.c)
        retry = e2 - e
        if retry < 1 then retry = 1 end
      elseif o.b == 0 then
        retry = o.win - e
      else
        local e3 = o.win - floor((o.limit - o.cost) * o.win / o.b)
        if e3 < 0 then e3 = 0 end
        retry = o.win - e + e3
      end
    end
  elseif algo == 4 then
    local total = 0
    for j = 1, #o.log do total = total + o.log[j][2] end
    admit = total + o.cost <= o.limit
    if not admit then
      if o.cost > o.limit then
        retry = -1
      else
        local need = total + o.cost - o.limit
        local freed = 0
        for j = 1, #o.log do
          freed = freed + o.log[j][2]
          if freed >= need then
            retry = o.log[j][1] + o.win - t
            break
          end
        end
      end
    end
  end
  o.admit, o.retry, o.delay = admit, retry, delay
  if not admit and o.enforce then allowed = 0 end
  ops[i] = o
end

local out = {allowed}
for i = 1, n do
  local o = ops[i]
  local algo, rate, burst = o.algo, o.rate, o.burst
  local write = allowed == 1 and o.admit and o.cost > 0
  local t = nowfor(o)
  if write then
    -- consume (algorithm.go: consume)
    if algo == 1 or algo == 2 then
      o.a = o.a + ceil(o.cost * NANO / rate)
    elseif algo == 3 or algo == 5 then
      o.b = o.b + o.cost
    elseif algo == 6 then
      o.own = o.own + o.cost
      o.total = o.total + o.cost
    elseif algo == 4 then
      o.log[#o.log + 1] = {t, o.cost}
    end
    t = nowfor(o)
  end
  -- report (algorithm.go: report)
  local remaining, reset, ttl = 0, 0, 1000
  if algo == 1 or algo == 2 then
    local capN = burst * NANO_PER_MILLI
    remaining = floor((capN - (o.a - nowus) * rate) / NANO)
    if remaining < 0 then remaining = 0 end
    reset = ceil((o.a - nowus) / 1000)
    ttl = reset + 1000
  elseif algo == 3 then
    remaining = o.limit - o.b
    if remaining < 0 then remaining = 0 end
    reset = o.a + o.win - t
    ttl = reset + 1000
  elseif algo == 6 then
    remaining = o.limit - o.total
    if remaining < 0 then remaining = 0 end
    if o.cap >= 0 then
      local r = o.cap - o.own
      if r < 0 then r = 0 end
      if r < remaining then remaining = r end
    end
    reset = o.a + o.win - t
    ttl = reset + 1000
  elseif algo == 5 then
    local e = t - o.a
    local est = o.c * (o.win - e) / o.win + o.b
    remaining = floor(o.limit - est)
    if remaining < 0 then remaining = 0 end
    if o.b > 0 then
      reset = 2 * o.win - e
    elseif o.c > 0 then
      reset = o.win - e
    end
    ttl = 2 * o.win - e + 1000
  elseif algo == 4 then
    local total = 0
    for j = 1, #o.log do total = total + o.log[j][2] end
    remaining = o.limit - total
    if remaining < 0 then remaining = 0 end
    local m = #o.log
    if m > 0 then reset = o.log[m][1] + o.win - t end
    ttl = o.win + 1000
  end
  if write then
    if algo == 1 or algo == 2 then
      redis.call('SET', o.key, string.format('%d', o.a), 'PX', ttl)
    elseif algo == 3 then
      redis.call('HSET', o.key, 'w', o.a, 'n', o.b)
    elseif algo == 5 then
      redis.call('HSET', o.key, 'w', o.a, 'c', o.b, 'p', o.c)
    elseif algo == 6 then
      if o.rolled then redis.call('DEL', o.key) end
      redis.call('HSET', o.key, 'w', o.a, 'n:' .. o.region, o.own)
    elseif algo == 4 then
      if o.trim > 0 then redis.call('LTRIM', o.key, o.trim, -1) end
      redis.call('RPUSH', o.key, string.format('%d:%d', t, o.cost))
    end
    if algo ~= 1 and algo ~= 2 then redis.call('PEXPIRE', o.key, ttl) end
  end
  local admit, retry, delay = 0, o.retry, o.delay
  if o.admit then admit = 1 end
  if allowed == 0 or not o.admit then delay = 0 end
  if allowed == 1 and o.admit then retry = 0 end
  out[#out + 1] = admit
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
  out[#out + 1] = delay
end
return out
