#!lua flags=allow-cross-slot-keys
-- Quotient: evaluate every policy of one request atomically, across its
-- subjects: if an enforced policy of any subject rejects, nothing is
-- written for any subject. One call decides a batch of requests, one
-- after the other, each all or nothing on its own (a batching pipeline
-- sends the requests of concurrent callers together; a lone request is a
-- batch of one).
-- This script mirrors algorithm.go line for line (same integer state, same
-- double divisions in the same order); change both together. It is written
-- for speed: per-op state lives in flat local arrays reused by every
-- request of the call, not one table per op, and each request travels as
-- one binary string (one argument for Redis to parse, not 20).
--
-- ARGV: one string per request (redisstore.go: appendRequest), big-endian:
--   header  B has_time, I8 time (µs; tests only, used when has_time is 1,
--           else Redis server TIME), B number of ops, B keep (1: the
--           caller may refund, refund.lua, so buckets report the state
--           they overwrite);
--   per op  B algo (1 token, 2 leaky, 3 fixed, 4 sliding log, 5 sliding
--           counter, 6 fixed replicated across regions), B flags (1
--           enforce, 2 global), I8 cost, I8 rate (milli-tokens/s), I8
--           burst (milli-tokens), I8 limit, I8 window (ms; 0 for algo 3
--           and 6: the UTC calendar month), i2+bytes the state key, then
--           i2+bytes the share key (global buckets only) or B+bytes this
--           region's name (algo 6 only).
-- KEYS: one key, the first request's first state key, so that a cluster
-- client routes the call to the node of that slot. Every key a request
-- touches travels in its string; allow-cross-slot-keys lets the script
-- reach keys of every slot of this node. On a cluster the caller batches
-- only requests whose slots it believes on this node; a request with a key
-- of another node fails in its first phase, which only reads, so nothing
-- of it is written, and its status says so (-1) for the caller to decide
-- it again on its own.
-- Returns one string of signed big-endian 8-byte integers (one bulk reply:
-- Redis encodes, and the client parses, one value instead of a dozen per
-- request): now (µs) of the first request, then per request: status (1
-- allowed, 0 rejected; -1 a key of another node and -2 another error,
-- both before anything was written; -3 an error while writing), and
-- unless the status is negative, per op: admit, remaining,
-- reset_ms, retry_ms, delay_ms, and when keep is 1 five refund values.
-- The refund values say what an op wrote, for refund.lua (zeros when it
-- wrote nothing): buckets the two 6-byte halves of the state written, the
-- rate, and the halves of the state overwritten; fixed windows, replicated
-- windows and sliding counters the window start; sliding logs the entry's
-- time (ms).
local ceil, floor, call, tonumber, unpack, pack = math.ceil, math.floor, redis.call, tonumber, struct.unpack, struct.pack
local sfind, ssub, sformat = string.find, string.sub, string.format
local NANO = 1000000000
local NANO_PER_MILLI = 1000000
-- Bucket bounds (policy.go: MaxRatePerSec, MaxBurst in milli-units) and
-- the bucket state's packing (algorithm.go: bucketState): 12 bytes, the
-- ms (44 bits) then the nano-tokens + 2^51 (52 bits), big-endian.
local MAXRATE, MAXBURST = 1000000000000, 1000000000
local P48, P51 = 281474976710656, 2251799813685248

-- Expiries. A write needs its key to live need ms more (the reset plus
-- one second; see each algorithm below). Writing that expiry on every
-- write costs most of the write (SET ... PX against SET ... KEEPTTL and a
-- PTTL, BenchmarkScriptPieces), so a write keeps the key's current expiry
-- while it is more than need and at most need + 2 * SLACK ms away, and
-- otherwise writes need + SLACK. A key therefore expires at least need ms
-- after the write (never earlier than a write of exactly need would make
-- it) and at most 2 * SLACK ms later than that. The room above need +
-- SLACK is for the clocks: the needed expiry of a window is fixed, but
-- need and the PTTL are counted on two readings of the clock that round
-- apart by a millisecond, so a key written with need + SLACK would be
-- written again on every other write if the keep bound were need +
-- SLACK. A key absent (PTTL -2) or without expiry (-1) always gets one.
-- No stored layout changes: releases before this rule read these keys.
local SLACK = 1000
-- fresh(key, need): whether key's expiry must be written (see above).
local function fresh(key, need)
  local cur = call('PTTL', key)
  return cur <= need or cur > need + 2 * SLACK
end
-- set(key, value, need): SET with the expiry rule above.
local function set(key, v, need)
  if fresh(key, need) then
    call('SET', key, v, 'PX', need + SLACK)
  else
    call('SET', key, v, 'KEEPTTL')
  end
end

-- month(ms): the UTC calendar month containing ms, as start, end (ms).
-- internal/calendar/month.go (MonthAt) in doubles: every value is an
-- integer below 2^53 and every division is floored, so both are exact.
local DAY = 86400000
local function month(ms)
  local days = floor(ms / DAY)
  local z = days + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local d = doy - floor((153 * mp + 2) / 5) + 1
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  local len = 31
  if m == 2 then
    if y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0) then len = 29 else len = 28 end
  elseif m == 4 or m == 6 or m == 9 or m == 11 then
    len = 30
  end
  local start = days - d + 1
  return start * DAY, (start + len) * DAY
end
-- fixedstart(now, win): the start of the fixed window containing now;
-- fixedend(a, win): the end of the fixed window starting at a.
local function fixedstart(t, win)
  if win == 0 then return (month(t)) end
  return t - t % win
end
local function fixedend(a, win)
  if win == 0 then
    local _, e = month(a)
    return e
  end
  return a + win
end

-- Per-op arrays: parameters, state (A, B, C), decision, extras; reused by
-- every request of the call (an entry is always set before it is read).
local ALGO, COST, RATE, BURST, LIMIT, WIN, KEY = {}, {}, {}, {}, {}, {}, {}
local A, B, C, ADMIT, RETRY, DELAY = {}, {}, {}, {}, {}, {}
local LOG, TRIM, REGION, CAP, ROLLED, WEND = {}, {}, {}, {}, {}, {}
local DRATE = {} -- buckets: the policy's own rate, for reset at rate 0

-- The request being decided: its string, its time, its number of ops,
-- whether it reports overwritten states, and whether it is allowed.
local req, nowus, now, n, keepPrev, allowed
local servertime
local out, no = {''}, 1 -- the reply's parts (see the header), no: how many

-- read: the first phase of one request. It parses the request, reads the
-- state of every op and decides each; it writes nothing.
local function read()
  local timed, t, nops, keep, pos = unpack('>BI8BB', req)
  if timed == 1 then
    nowus = t
  else
    if not servertime then
      local tt = call('TIME')
      servertime = tonumber(tt[1]) * 1000000 + tonumber(tt[2])
    end
    nowus = servertime
  end
  now = (nowus - nowus % 1000) / 1000
  n, keepPrev, allowed = nops, keep == 1, 1
  for i = 1, n do
    local algo, flags, cost, rate, burst, limit, win, key
    algo, flags, cost, rate, burst, limit, win, key, pos = unpack('>BBI8I8I8I8I8i2c0', req, pos)
    local drate = rate
    if algo == 6 then
      REGION[i], pos = unpack('>Bc0', req, pos)
    elseif flags >= 2 then
      local shkey
      shkey, pos = unpack('>i2c0', req, pos)
      local sh = call('HMGET', shkey, 'r', 'b')
      if sh[1] and sh[2] then
        rate = tonumber(sh[1])
        burst = tonumber(sh[2])
      end
    end
    local admit, retry, delay = false, 0, 0
    local a, b, c = 0, 0, 0
    if algo == 1 or algo == 2 then
      -- advance (algorithm.go: bucketLimits, bucketTokens)
      DRATE[i] = drate
      if drate < 1 then DRATE[i] = 1 end
      if rate % 1 ~= 0 then rate = floor(rate) end
      if burst % 1 ~= 0 then burst = floor(burst) end
      if rate < 0 then rate = 0 elseif rate > MAXRATE then rate = MAXRATE end
      if burst < 0 then burst = 0 elseif burst > MAXBURST then burst = MAXBURST end
      local capN = burst * NANO_PER_MILLI
      local v = call('GET', key)
      a = capN
      if v then
        if #v == 12 then
          local h, l = unpack('>I6I6', v)
          local tms = (h - h % 16) / 16
          a = (h % 16) * P48 + l - P51 + (nowus - tms * 1000) * rate
        else
          -- Written before buckets kept their tokens: the µs when full.
          local f = tonumber(v)
          if f < nowus then f = nowus end
          a = capN - (f - nowus) * rate
        end
        if a > capN then a = capN elseif a < 0 then a = 0 end
      end
      -- decide
      if cost * 1000 > burst then
        retry = -1
      else
        local costN = cost * NANO
        admit = a >= costN
        if admit then
          if algo == 2 and rate > 0 then delay = ceil(ceil((capN - a) / rate) / 1000) end
        elseif rate > 0 then
          retry = ceil(ceil((costN - a) / rate) / 1000)
        else
          retry = -1
        end
      end
    elseif algo == 3 then
      -- fixedstart and fixedend inlined for a window of ms (win > 0)
      local start
      if win == 0 then start = fixedstart(now, 0) else start = now - now % win end
      local v = call('GET', key)
      if v then
        local p = sfind(v, ':', 1, true)
        a, b = tonumber(ssub(v, 1, p - 1)), tonumber(ssub(v, p + 1))
      end
      if not v or start > a then a, b = start, 0 end
      local t = now
      if a > t then t = a end
      local wend
      if win == 0 then wend = fixedend(a, 0) else wend = a + win end
      WEND[i] = wend
      admit = b + cost <= limit
      if not admit then
        if cost > limit then retry = -1 else retry = wend - t end
      end
    elseif algo == 6 then
      local start = fixedstart(now, win)
      local raw = call('HGETALL', key)
      local w, cap, counts = nil, -1, {}
      for j = 1, #raw, 2 do
        local f, v = raw[j], raw[j + 1]
        if f == 'w' then
          w = tonumber(v)
        elseif f == 'cap' then
          cap = tonumber(v)
        elseif ssub(f, 1, 2) == 'n:' then
          counts[ssub(f, 3)] = tonumber(v)
        end
      end
      if not w or start > w then
        a, counts, cap = start, {}, -1
        ROLLED[i] = w ~= nil
      else
        a = w
        ROLLED[i] = false
      end
      local region = REGION[i]
      local total = 0
      for _, cnt in pairs(counts) do total = total + cnt end
      b, c = total, counts[region] or 0 -- b: total, c: own
      REGION[i], CAP[i] = region, cap
      local t = now
      if a > t then t = a end
      WEND[i] = fixedend(a, win)
      admit = b + cost <= limit and (cap < 0 or c + cost <= cap)
      if not admit then
        if cost > limit then retry = -1 else retry = WEND[i] - t end
      end
    elseif algo == 5 then
      local start = now - now % win
      local v = call('GET', key)
      if not v then
        a, b, c = start, 0, 0
      else
        local p1 = sfind(v, ':', 1, true)
        local p2 = sfind(v, ':', p1 + 1, true)
        a, b, c = tonumber(ssub(v, 1, p1 - 1)), tonumber(ssub(v, p1 + 1, p2 - 1)), tonumber(ssub(v, p2 + 1))
        if start <= a then
        elseif start == a + win then
          c, b, a = b, 0, start
        else
          c, b, a = 0, 0, start
        end
      end
      local t = now
      if a > t then t = a end
      local e = t - a
      local est = c * (win - e) / win + b
      admit = est + cost <= limit
      if not admit then
        local need = limit - b - cost
        if cost > limit then
          retry = -1
        elseif need >= 0 then
          local e2 = win - floor(need * win / c)
          retry = e2 - e
          if retry < 1 then retry = 1 end
        elseif b == 0 then
          retry = win - e
        else
          local e3 = win - floor((limit - cost) * win / b)
          if e3 < 0 then e3 = 0 end
          retry = win - e + e3
        end
      end
    elseif algo == 4 then
      local raw = call('LRANGE', key, 0, -1)
      local log = {}
      for j = 1, #raw do
        local s = raw[j]
        local p = sfind(s, ':', 1, true)
        log[j] = {tonumber(ssub(s, 1, p - 1)), tonumber(ssub(s, p + 1))}
      end
      local t = now
      if #log > 0 and log[#log][1] > t then t = log[#log][1] end
      local k = 0
      while k < #log and log[k + 1][1] <= t - win do k = k + 1 end
      local kept = {}
      for j = k + 1, #log do kept[#kept + 1] = log[j] end
      TRIM[i], LOG[i] = k, kept
      local total = 0
      for j = 1, #kept do total = total + kept[j][2] end
      admit = total + cost <= limit
      if not admit then
        if cost > limit then
          retry = -1
        else
          local need = total + cost - limit
          local freed = 0
          for j = 1, #kept do
            freed = freed + kept[j][2]
            if freed >= need then
              retry = kept[j][1] + win - t
              break
            end
          end
        end
      end
    end
    ALGO[i], COST[i], RATE[i], BURST[i], LIMIT[i], WIN[i], KEY[i] = algo, cost, rate, burst, limit, win, key
    A[i], B[i], C[i], ADMIT[i], RETRY[i], DELAY[i] = a, b, c, admit, retry, delay
    if not admit and flags % 2 == 1 then allowed = 0 end
  end
end

-- write: the second phase: consume (only when the request is allowed),
-- write the states and append the answers to out.
local function write()
  for i = 1, n do
    local algo, cost, rate, burst, limit, win, key = ALGO[i], COST[i], RATE[i], BURST[i], LIMIT[i], WIN[i], KEY[i]
    local a, b, c, admit = A[i], B[i], C[i], ADMIT[i]
    local write = allowed == 1 and admit and cost > 0
    local prev = false
    if keepPrev and write and (algo == 1 or algo == 2) then prev = call('GET', key) end
    local remaining, reset = 0, 0
    if algo == 1 or algo == 2 then
      -- a: nano-tokens now (algorithm.go: consume, report, bucketState)
      if write then a = a - cost * NANO end
      remaining = (a - a % NANO) / NANO
      local fill = rate
      if fill == 0 then fill = DRATE[i] end
      local q = (burst * NANO_PER_MILLI - a) / fill
      q = q + (-q) % 1
      reset = (q + (-q) % 1000) / 1000
      if write then
        local tms = now
        local u = a - (nowus - tms * 1000) * rate + P51
        local hi = (u - u % P48) / P48
        set(key, pack('>I6I6', tms * 16 + hi, u - hi * P48), reset + 1000)
      end
    elseif algo == 3 then
      if write then b = b + cost end
      local t = now
      if a > t then t = a end
      remaining = limit - b
      if remaining < 0 then remaining = 0 end
      reset = WEND[i] - t
      if write then set(key, sformat('%d:%d', a, b), reset + 1000) end
    elseif algo == 6 then
      if write then
        b = b + cost
        c = c + cost
      end
      local t = now
      if a > t then t = a end
      remaining = limit - b
      if remaining < 0 then remaining = 0 end
      local cap = CAP[i]
      if cap >= 0 then
        local r = cap - c
        if r < 0 then r = 0 end
        if r < remaining then remaining = r end
      end
      reset = WEND[i] - t
      if write then
        if ROLLED[i] then call('DEL', key) end
        call('HSET', key, 'w', a, 'n:' .. REGION[i], c)
        if fresh(key, reset + 1000) then call('PEXPIRE', key, reset + 1000 + SLACK) end
      end
    elseif algo == 5 then
      if write then b = b + cost end
      local t = now
      if a > t then t = a end
      local e = t - a
      local est = c * (win - e) / win + b
      remaining = floor(limit - est)
      if remaining < 0 then remaining = 0 end
      if b > 0 then
        reset = 2 * win - e
      elseif c > 0 then
        reset = win - e
      end
      if write then set(key, sformat('%d:%d:%d', a, b, c), 2 * win - e + 1000) end
    elseif algo == 4 then
      local log = LOG[i]
      local t = now
      if #log > 0 and log[#log][1] > t then t = log[#log][1] end
      if write then log[#log + 1] = {t, cost} end
      local total = 0
      for j = 1, #log do total = total + log[j][2] end
      remaining = limit - total
      if remaining < 0 then remaining = 0 end
      local m = #log
      if m > 0 then reset = log[m][1] + win - t end
      if write then
        if TRIM[i] > 0 then call('LTRIM', key, TRIM[i], -1) end
        call('RPUSH', key, sformat('%d:%d', t, cost))
        if fresh(key, win + 1000) then call('PEXPIRE', key, win + 1000 + SLACK) end
      end
    end
    local retry, delay = RETRY[i], DELAY[i]
    if allowed == 0 or not admit then delay = 0 end
    if allowed == 1 and admit then retry = 0 end
    local adm = 0
    if admit then adm = 1 end
    local ra, rb, rc, rd, re = 0, 0, 0, 0, 0
    if write and keepPrev then
      if algo == 1 or algo == 2 then
        -- The two halves of the 12 bytes written (as above), the rate, and
        -- the halves of the state overwritten (-1: none, -2: not 12 bytes).
        local tms = now
        local u = a - (nowus - tms * 1000) * rate + P51
        local hi = (u - u % P48) / P48
        ra, rb, rc = tms * 16 + hi, u - hi * P48, rate
        if not prev then
          rd = -1
        elseif #prev == 12 then
          rd, re = unpack('>I6I6', prev)
        else
          rd = -2
        end
      elseif algo == 4 then
        ra = LOG[i][#LOG[i]][1]
      else
        ra = a
      end
    end
    no = no + 1
    if keepPrev then
      out[no] = pack('>i8i8i8i8i8i8i8i8i8i8', adm, remaining, reset, retry, delay, ra, rb, rc, rd, re)
    else
      out[no] = pack('>i8i8i8i8i8', adm, remaining, reset, retry, delay)
    end
  end
end

-- failed: the status of a request that failed (see the header): -1 for
-- a key of another cluster node and -2 for any other error before it
-- wrote, -3 while it wrote. e is the error pcall caught (redis.call
-- raises a table with the server's error in err).
local function failed(e, writing)
  if writing then return -3 end
  if type(e) == 'table' then e = e.err end
  if sfind(tostring(e), 'non local key', 1, true) then return -1 end
  return -2
end

local R = #ARGV
local ALLOWED, REJECTED = pack('>i8', 1), pack('>i8', 0) -- a request's status
for r = 1, R do
  req = ARGV[r]
  no = no + 1
  local mark = no
  local ok, e = pcall(read)
  if not ok then
    out[mark] = pack('>i8', failed(e, false))
  else
    if allowed == 1 then out[mark] = ALLOWED else out[mark] = REJECTED end
    ok, e = pcall(write)
    if not ok then
      for j = no, mark + 1, -1 do out[j] = nil end
      no = mark
      out[mark] = pack('>i8', failed(e, true))
    end
  end
  if r == 1 then out[1] = pack('>i8', nowus or 0) end
end
return table.concat(out, '', 1, no)
