package rows

// UTCSeconds reads s when it is a timestamp in the form the timestamp
// check writes, YYYY-MM-DDTHH:MM:SS[.fraction]Z (RFC 3339 in UTC; a year
// from 0001 to 9999, one to nine fraction digits, every field in range):
// the seconds since the Unix epoch and the nanoseconds, as time.Parse with
// time.RFC3339Nano reads it. ok is false for any other string, which the
// caller reads with time.Parse: this path decides nothing time.Parse
// would decide otherwise; it only spares a row its cost (a value parsed
// when the row is checked and again when it is encoded for COPY).
func UTCSeconds(s string) (sec int64, nsec int, ok bool) {
	if len(s) < 20 || s[len(s)-1] != 'Z' || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' {
		return 0, 0, false
	}
	year, ok1 := digits(s[0:4])
	month, ok2 := digits(s[5:7])
	day, ok3 := digits(s[8:10])
	hour, ok4 := digits(s[11:13])
	minute, ok5 := digits(s[14:16])
	second, ok6 := digits(s[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || year < 1 || month < 1 || month > 12 || day < 1 ||
		day > daysIn(month, year) || hour > 23 || minute > 59 || second > 59 {
		return 0, 0, false
	}
	if frac := s[19 : len(s)-1]; frac != "" {
		if len(frac) < 2 || len(frac) > 10 || frac[0] != '.' {
			return 0, 0, false
		}
		n, okf := digits(frac[1:])
		if !okf {
			return 0, 0, false
		}
		for range 10 - len(frac) {
			n *= 10
		}
		nsec = n
	}
	days := daysFromCivil(year, month, day)
	return days*86400 + int64(hour*3600+minute*60+second), nsec, true
}

// digits is the value of s, all ASCII digits (at most nine), or false.
func digits(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i] - '0'
		if c > 9 {
			return 0, false
		}
		n = n*10 + int(c)
	}
	return n, true
}

// daysIn is the number of days of month in year (proleptic Gregorian).
func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// daysFromCivil is the days from 1970-01-01 to year-month-day (year >= 1;
// H. Hinnant's days_from_civil).
func daysFromCivil(year, month, day int) int64 {
	if month <= 2 {
		year--
	}
	era := year / 400
	yoe := year - era*400
	mp := (month + 9) % 12
	doy := (153*mp+2)/5 + day - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return int64(era)*146097 + int64(doe) - 719468
}
