-- Quotient: merge into a replicated fixed window (see replicated.go).
-- KEYS[1]: rl:{<subject>}:<policy>:fg
-- ARGV: what ('n' a region's count, 'cap' this region's cap), window start
-- (Unix ms), window length (ms: the window's own, so a calendar month's
-- length for monthly policies; it only sets the expiry), region, value.
local ws, win, v = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local w = redis.call('HGET', KEYS[1], 'w')
if w then w = tonumber(w) end
if w and ws < w then return 0 end
if not w or ws > w then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'w', ws)
end
if ARGV[1] == 'n' then
  local f = 'n:' .. ARGV[4]
  local cur = tonumber(redis.call('HGET', KEYS[1], f) or '0')
  if v > cur then redis.call('HSET', KEYS[1], f, v) end
elseif v < 0 then
  redis.call('HDEL', KEYS[1], 'cap')
else
  redis.call('HSET', KEYS[1], 'cap', v)
end
redis.call('PEXPIREAT', KEYS[1], ws + win + 1000)
return 1
