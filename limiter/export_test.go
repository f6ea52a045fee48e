package limiter

// Test hooks.

// decideAtGivenTime makes the Redis store pass the caller's time to the
// script instead of using Redis TIME, so that tests can replay a timeline.
func (s *RedisStore) decideAtGivenTime() { s.passTime = true }
