package main

import (
	"flag"
	"fmt"
	"time"
)

// maxClockOffset bounds --clock-offset: an hour is far beyond any skew a
// test models and keeps a typo (10h for 10ms) from passing.
const maxClockOffset = time.Hour

// clockOffsetUsage is the help text of --clock-offset, on every command
// that has it.
const clockOffsetUsage = "FOR TESTS ONLY (never set in production): shift every reading of this process's clock by this much " +
	"(e.g. 800ms, -600ms; within ±1h), as if its host's clock were off; deployed mode's clock_skew_ms. " +
	"Decisions on Redis still use Redis server time"

// offsetClock is the process's clock for the protocol: the system clock
// shifted by a fixed offset (--clock-offset, for tests of clock skew; zero
// in production). Every reading that a decision depends on (epoch numbers,
// the epoch loop's deadlines and fence claims, report and record
// timestamps, the consumers' lookback start, usage epochs, override
// expiry) goes through one offsetClock, so a skewed process is skewed
// everywhere at once. Timers wait real durations (an offset does not
// change how long anything takes). The zero value is the system clock; it
// is safe for concurrent use. It satisfies rebalancer.Clock,
// dailyquota.Clock, limiter.Clock, admin.Clock and quota.Clock.
type offsetClock struct {
	offset time.Duration
}

// Now returns the system time plus the offset.
func (c offsetClock) Now() time.Time { return time.Now().Add(c.offset) }

// NewTimer returns a timer that fires d from now (real time).
func (offsetClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// registerClockOffset adds --clock-offset to fs.
func registerClockOffset(fs *flag.FlagSet, d *time.Duration) {
	fs.DurationVar(d, "clock-offset", 0, clockOffsetUsage)
}

// validClockOffset checks a --clock-offset value.
func validClockOffset(d time.Duration) error {
	if d < -maxClockOffset || d > maxClockOffset {
		return fmt.Errorf("--clock-offset %v: want a duration within ±1h", d)
	}
	return nil
}
