package calendar

// DayMs is the length of a UTC day in milliseconds.
const DayMs = 86_400_000

// floorDiv is a/b rounded towards minus infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// Civil converts days since 1970-01-01 to the proleptic Gregorian date:
// year, month 1..12 and day of month 1..31.
func Civil(days int64) (year, month, day int64) {
	z := days + 719_468 // days since 0000-03-01
	era := floorDiv(z, 146_097)
	doe := z - era*146_097                                    // day of the 400-year era, 0..146096
	yoe := (doe - doe/1_460 + doe/36_524 - doe/146_096) / 365 // year of the era, 0..399
	doy := doe - (365*yoe + yoe/4 - yoe/100)                  // day of the year from March 1st, 0..365
	mp := (5*doy + 2) / 153                                   // month from March, 0..11
	day = doy - (153*mp+2)/5 + 1
	month = mp + 3
	if mp >= 10 {
		month = mp - 9
	}
	year = yoe + era*400
	if month <= 2 {
		year++
	}
	return year, month, day
}

// DaysIn is the number of days of month (1..12) in year.
func DaysIn(year, month int64) int64 {
	switch month {
	case 2:
		if floorMod(year, 4) == 0 && (floorMod(year, 100) != 0 || floorMod(year, 400) == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

// MonthAt returns the UTC calendar month that contains the Unix millisecond
// ms, as [startMs, endMs): the 1st of the month at 00:00 UTC, and the 1st of
// the next month at 00:00 UTC.
func MonthAt(ms int64) (startMs, endMs int64) {
	days := floorDiv(ms, DayMs)
	y, m, d := Civil(days)
	start := days - d + 1
	return start * DayMs, (start + DaysIn(y, m)) * DayMs
}
