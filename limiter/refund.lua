-- Quotient: give back what script.lua consumed for one subject of a
-- request that a later subject (on another cluster node) rejected. See
-- refund.go for what is exact and what is not.
-- KEYS: the state key of each op to refund (one subject: one slot).
-- ARGV[1]: '' (use Redis server TIME) or a time in µs (tests only).
-- ARGV[2]: the time (µs) of the consuming call, as script.lua returned it.
-- ARGV[3]: number of ops; then 9 values per op: algo (script.lua's codes),
--   cost, window (ms), region (algo 6), and the five refund values
--   script.lua returned.
-- Returns the number of ops whose consumption was found and given back.
local nowus
if ARGV[1] ~= '' then
  nowus = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local call, tonumber, fmt, floor = redis.call, tonumber, string.format, math.floor
local NANO, P48 = 1000000000, 281474976710656
local thenus = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local done = 0
for i = 1, n do
  local base = 3 + (i - 1) * 9
  local algo = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
  local win = tonumber(ARGV[base + 3])
  local region = ARGV[base + 4]
  local ra = tonumber(ARGV[base + 5])
  local rb = tonumber(ARGV[base + 6])
  local rc = tonumber(ARGV[base + 7])
  local rd = tonumber(ARGV[base + 8])
  local re = tonumber(ARGV[base + 9])
  local key = KEYS[i]
  if algo == 1 or algo == 2 then
    -- ra, rb: the 12 bytes the request wrote, as two 6-byte numbers
    -- (script.lua); rc: the rate then (milli-tokens/s, nano-tokens/µs);
    -- rd, re: the state it overwrote (rd -1: none, -2: not 12 bytes).
    local v = call('GET', key)
    if v and #v == 12 then
      local h, l = struct.unpack('>I6I6', v)
      local back = cost * NANO
      if h == ra and l == rb and rd == -1 then
        -- Untouched, and there was no state before: none again.
        call('DEL', key)
        done, back = done + 1, 0
      elseif h == ra and l == rb and rd >= 0 then
        -- Untouched: the state before, byte for byte.
        call('SET', key, struct.pack('>I6I6', rd, re), 'KEEPTTL')
        done, back = done + 1, 0
      elseif h ~= ra or l ~= rb then
        -- Others wrote since: the refill that their admissions saw while
        -- this request's tokens were out may have been more than a full
        -- bucket could hold. Keep back at most what refilled since the
        -- consuming call, so the refund never mints tokens.
        local lost = (nowus - thenus) * rc
        if lost < 0 then lost = 0 end
        if lost > back then lost = back end
        back = back - lost
      end
      if back > 0 then
        -- Add back to the tokens of the state as it stands (same ms).
        local u = (h % 16) * P48 + l + back
        local hi = floor(u / P48)
        call('SET', key, struct.pack('>I6I6', floor(h / 16) * 16 + hi, u - hi * P48), 'KEEPTTL')
        done = done + 1
      end
    end
  elseif algo == 3 then
    local v = call('GET', key)
    if v then
      local p = string.find(v, ':', 1, true)
      local a, b = tonumber(string.sub(v, 1, p - 1)), tonumber(string.sub(v, p + 1))
      if a == ra then
        b = b - cost
        if b < 0 then b = 0 end
        call('SET', key, fmt('%d:%d', a, b), 'KEEPTTL')
        done = done + 1
      end
    end
  elseif algo == 6 then
    local w = call('HGET', key, 'w')
    if w and tonumber(w) == ra then
      local f = 'n:' .. region
      local c = tonumber(call('HGET', key, f) or '0') - cost
      if c > 0 then
        call('HSET', key, f, c)
      else
        -- A count of 0 is no count (as if never written).
        call('HDEL', key, f)
      end
      done = done + 1
    end
  elseif algo == 5 then
    local v = call('GET', key)
    if v then
      local p1 = string.find(v, ':', 1, true)
      local p2 = string.find(v, ':', p1 + 1, true)
      local a, b, c = tonumber(string.sub(v, 1, p1 - 1)), tonumber(string.sub(v, p1 + 1, p2 - 1)), tonumber(string.sub(v, p2 + 1))
      local hit = false
      if a == ra then
        b, hit = b - cost, true
        if b < 0 then b = 0 end
      elseif a == ra + win then
        c, hit = c - cost, true
        if c < 0 then c = 0 end
      end
      if hit then
        call('SET', key, fmt('%d:%d:%d', a, b, c), 'KEEPTTL')
        done = done + 1
      end
    end
  elseif algo == 4 then
    if call('LREM', key, -1, fmt('%d:%d', ra, cost)) > 0 then done = done + 1 end
  end
end
return done
