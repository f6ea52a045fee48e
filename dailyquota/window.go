package dailyquota

import (
	"fmt"
	"time"

	"github.com/quotientlabs/quotient/internal/calendar"
)

// Day is the length of a UTC day. A fixed window of Day is the UTC day:
// Unix time has no leap seconds, so every multiple of 86 400 000 ms since
// the epoch is a UTC midnight.
const Day = 24 * time.Hour

// Spec says how a policy cuts time into windows: fixed windows of one
// length aligned to the Unix epoch (Spec{Length: d}), or UTC calendar
// months (Spec{Month: true}). The zero Spec is invalid. A Spec is a value;
// it is safe to copy and share.
type Spec struct {
	// Length of a fixed window, a positive whole number of milliseconds.
	// Ignored when Month is set.
	Length time.Duration
	// Month makes windows the UTC calendar months: [1st 00:00 UTC, 1st of
	// the next month 00:00 UTC), 28 to 31 days long.
	Month bool
}

// Fixed is the Spec of fixed windows of length d, aligned to the Unix
// epoch: Fixed(Day) is the UTC day, Fixed(time.Hour) the UTC hour.
func Fixed(d time.Duration) Spec { return Spec{Length: d} }

// Month is the Spec of UTC calendar months.
func Month() Spec { return Spec{Month: true} }

// Validate reports a Spec that cuts no windows: a length that is not a
// positive whole number of milliseconds.
func (s Spec) Validate() error {
	if s.Month {
		return nil
	}
	if s.Length <= 0 || s.Length%time.Millisecond != 0 {
		return fmt.Errorf("%w: window length %v: want a positive whole number of milliseconds", ErrInvalid, s.Length)
	}
	return nil
}

// String is "month" or the fixed length.
func (s Spec) String() string {
	if s.Month {
		return "month"
	}
	return s.Length.String()
}

// Window is one window [StartMs, EndMs) in Unix milliseconds. The zero
// Window is empty.
type Window struct {
	StartMs int64 // first millisecond in the window
	EndMs   int64 // first millisecond after it
}

// Start is the window's start as a UTC time.
func (w Window) Start() time.Time { return time.UnixMilli(w.StartMs).UTC() }

// End is the first instant after the window, as a UTC time.
func (w Window) End() time.Time { return time.UnixMilli(w.EndMs).UTC() }

// LengthMs is the window's length in milliseconds.
func (w Window) LengthMs() int64 { return w.EndMs - w.StartMs }

// Contains reports whether t falls in the window.
func (w Window) Contains(t time.Time) bool {
	ms := t.UnixMilli()
	return w.StartMs <= ms && ms < w.EndMs
}

// At returns the window of s that contains t (any location; windows are
// UTC). Times before 1970 work too: fixed windows are aligned by floored
// division. s must be valid (Validate); an invalid Spec panics.
func (s Spec) At(t time.Time) Window {
	if s.Month {
		// The same integer arithmetic as the limiter's script, so the
		// windows this package replicates are the windows it counts in.
		start, end := calendar.MonthAt(t.UnixMilli())
		return Window{StartMs: start, EndMs: end}
	}
	if err := s.Validate(); err != nil {
		panic(err)
	}
	l := s.Length.Milliseconds()
	start := floorDiv(t.UnixMilli(), l) * l
	return Window{StartMs: start, EndMs: start + l}
}

// Next returns the window after w under s.
func (s Spec) Next(w Window) Window { return s.At(time.UnixMilli(w.EndMs)) }

// Aligned reports whether a window [startMs, startMs+lengthMs) is a window
// of s: what a receiver checks before merging a replicated count.
func (s Spec) Aligned(startMs, lengthMs int64) bool {
	w := s.At(time.UnixMilli(startMs))
	return w.StartMs == startMs && w.LengthMs() == lengthMs
}

// floorDiv is a/b rounded towards minus infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
