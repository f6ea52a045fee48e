// Package calendar is the UTC calendar-month arithmetic that the limiter's
// Go code, its Lua script (limiter/script.lua, which mirrors month.go) and
// dailyquota share: which calendar month contains a Unix millisecond, and
// where it starts and ends.
//
// It works on integers only (days since the Unix epoch, converted to and
// from the proleptic Gregorian calendar with the days-from-civil /
// civil-from-days method of H. Hinnant's "chrono-Compatible Low-Level Date
// Algorithms"), so the Lua copy, which runs in doubles, computes exactly
// the same numbers: every intermediate value is an integer far below 2^53
// and every division is floored.
//
// What it does not do: time zones (months are UTC), leap seconds (Unix time
// has none, so every day is 86 400 000 ms), I/O or clocks: functions take
// the time as a value.
//
// Invariants: for every ms, MonthAt(ms) returns start <= ms < end, start is
// 00:00 UTC on the 1st of a month and end is 00:00 UTC on the 1st of the
// next, so end-start is 28, 29, 30 or 31 days; MonthAt(end) starts at end.
package calendar
