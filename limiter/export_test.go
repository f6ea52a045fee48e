package limiter

import "time"

// Test hooks.

// decideAtGivenTime makes the Redis store pass the caller's time to the
// script instead of using Redis TIME, so that tests can replay a timeline.
func (s *RedisStore) decideAtGivenTime() { s.passTime = true }

// checkSubjectFallbackAt is checkSubjectsFallbackAt for one subject.
func (l *Limiter) checkSubjectFallbackAt(now time.Time, subject Subject, policies []*Policy, cost int64) (Decision, error) {
	return l.checkSubjectsFallbackAt(now, []SubjectPolicies{{Subject: subject, Policies: policies}}, cost)
}
