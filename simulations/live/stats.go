package live

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CoordinatorStats is what one region's coordinator did during a run,
// read from its metrics.
type CoordinatorStats struct {
	// Decisions counts decisions by mode ("grow", "hold", "fallback"),
	// with " late" appended for decisions made at the next collection.
	Decisions map[string]int64
	// Reports counts the other regions' reports received.
	Reports int64
	// MeanReportLag is the mean time from the end of a report's epoch to
	// its receipt, real time (it includes the CollectDelay).
	MeanReportLag time.Duration
	// Errors counts failures by kind (usage_read, publish, share_write,
	// report); only nonzero kinds are listed.
	Errors map[string]int64
	// Transfers counts asks and gives between decisions: "asks sent",
	// "asks received", and gives by direction and outcome ("gives sent
	// published", "gives received accepted", ...); only nonzero ones.
	Transfers map[string]int64
}

// coordinatorStats reads the region package's metrics from reg.
func coordinatorStats(reg prometheus.Gatherer) CoordinatorStats {
	st := CoordinatorStats{Decisions: map[string]int64{}, Errors: map[string]int64{}, Transfers: map[string]int64{}}
	mfs, err := reg.Gather()
	if err != nil {
		return st
	}
	var lagSum float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "quotient_coordinator_decisions_total":
				k := labels["mode"]
				if labels["late"] == "true" {
					k += " late"
				}
				st.Decisions[k] += int64(m.GetCounter().GetValue())
			case "quotient_coordinator_report_lag_seconds":
				st.Reports += int64(m.GetHistogram().GetSampleCount())
				lagSum += m.GetHistogram().GetSampleSum()
			case "quotient_coordinator_transfer_asks_total":
				if v := int64(m.GetCounter().GetValue()); v > 0 {
					st.Transfers["asks "+labels["direction"]] = v
				}
			case "quotient_coordinator_transfer_gives_total":
				if v := int64(m.GetCounter().GetValue()); v > 0 {
					st.Transfers["gives "+labels["direction"]+" "+labels["outcome"]] = v
				}
			case "quotient_coordinator_errors_total":
				if v := int64(m.GetCounter().GetValue()); v > 0 {
					st.Errors[labels["kind"]] = v
				}
			}
		}
	}
	if st.Reports > 0 {
		st.MeanReportLag = time.Duration(lagSum / float64(st.Reports) * float64(time.Second))
	}
	return st
}

// Faithful reports whether the run kept to its real-time schedule, so
// that its accuracy measures Quotient rather than the machine, and if not
// why: at most 1% of requests started more than one scenario second late,
// at most 0.1% fell back (store deadline missed), and every coordinator
// decision after warm-up was timely and complete (no hold or late
// decision: a report that misses MaxWait costs a whole epoch of growth),
// with no publish, read or write error.
func (s Stats) Faithful() (bool, string) {
	var why []string
	if s.Late*100 > s.Requests {
		why = append(why, fmt.Sprintf("%d of %d requests late", s.Late, s.Requests))
	}
	if s.Fallback*1000 > s.Requests {
		why = append(why, fmt.Sprintf("%d of %d decisions fell back", s.Fallback, s.Requests))
	}
	for _, r := range slices.Sorted(maps.Keys(s.CoordinatorStats)) {
		cs := s.CoordinatorStats[r]
		var n int64
		for mode, v := range cs.Decisions {
			if mode != "grow" && mode != "fallback" {
				n += v
			}
		}
		if n > 0 {
			why = append(why, fmt.Sprintf("%s: %d decisions held or late", r, n))
		}
		for kind, v := range cs.Errors {
			why = append(why, fmt.Sprintf("%s: %d %s errors", r, v, kind))
		}
	}
	return len(why) == 0, strings.Join(why, "; ")
}
