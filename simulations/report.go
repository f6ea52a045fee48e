package simulations

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Report is the accuracy of one run: per tracked key and policy the window
// errors against the ideal limiter, and whether the scenario's target holds.
// Build it with Recorder.Report; write it with WriteFiles.
type Report struct {
	Scenario     string
	Pass         bool
	Seed         int64
	SimulatedSec int64
	// Wall is the run's wall-clock time; the caller fills it (it is the
	// only field that differs between two runs of the same file and seed).
	Wall      time.Duration
	Decisions int64
	Target    Target
	Keys      []KeyResult
	Worst     Worst

	rec       *Recorder
	startUnix int64
	ideal     [][]int64 // per tracked key, per second, milli cost units
}

// KeyResult is the accuracy of one key and policy over all windows.
// MaxOver and MaxUnder are >= 0 (0 when no window errs that way).
type KeyResult struct {
	Key          string  `json:"key"`
	Policy       string  `json:"policy"`
	Windows      int     `json:"windows"`
	MaxOver      float64 `json:"max_over"`
	MaxUnder     float64 `json:"max_under"`
	MeanAbsError float64 `json:"mean_abs_error"`
}

// Worst names the worst window each way over all keys.
type Worst struct {
	MaxOver  float64   `json:"max_over"`
	Over     *WindowAt `json:"over,omitempty"`
	MaxUnder float64   `json:"max_under"`
	Under    *WindowAt `json:"under,omitempty"`
}

// WindowAt is one key, policy and evaluation window.
type WindowAt struct {
	Key            string  `json:"key"`
	Policy         string  `json:"policy"`
	WindowStartSec int64   `json:"window_start_s"`
	Error          float64 `json:"error"`
}

// Report computes the ideal and the errors. startUnix is the Unix second
// at which the run started (fixed windows align to the Unix epoch).
func (r *Recorder) Report(startUnix int64) *Report {
	sc := r.sc
	rep := &Report{
		Scenario:     sc.Name,
		Pass:         true,
		Seed:         sc.Seed,
		SimulatedSec: sc.DurationSec,
		Decisions:    r.decisions,
		Target:       sc.Target,
		rec:          r,
		startUnix:    startUnix,
		ideal:        make([][]int64, len(r.keys)),
	}
	for k, t := range r.keys {
		ideal := t.idealMilli(startUnix)
		rep.ideal[k] = ideal
		allowance := float64(t.allowanceMilli(sc.WindowSec))
		kr := KeyResult{Key: t.key, Policy: t.policy.ID, Windows: r.windows}
		sumAbs := 0.0
		for w := 0; w < r.windows; w++ {
			e := rep.windowError(k, w, allowance)
			sumAbs += math.Abs(e)
			start := sc.WarmupSec + int64(w)*sc.WindowSec
			if e > kr.MaxOver {
				kr.MaxOver = e
			}
			if -e > kr.MaxUnder {
				kr.MaxUnder = -e
			}
			if e > rep.Worst.MaxOver {
				rep.Worst.MaxOver = e
				rep.Worst.Over = &WindowAt{Key: t.key, Policy: t.policy.ID, WindowStartSec: start, Error: round6(e)}
			}
			if -e > rep.Worst.MaxUnder {
				rep.Worst.MaxUnder = -e
				rep.Worst.Under = &WindowAt{Key: t.key, Policy: t.policy.ID, WindowStartSec: start, Error: round6(e)}
			}
			if e > sc.Target.MaxOver || -e > sc.Target.MaxUnder {
				rep.Pass = false
			}
		}
		if r.windows > 0 {
			kr.MeanAbsError = sumAbs / float64(r.windows)
		}
		kr.MaxOver, kr.MaxUnder, kr.MeanAbsError = round6(kr.MaxOver), round6(kr.MaxUnder), round6(kr.MeanAbsError)
		rep.Keys = append(rep.Keys, kr)
	}
	rep.Worst.MaxOver, rep.Worst.MaxUnder = round6(rep.Worst.MaxOver), round6(rep.Worst.MaxUnder)
	return rep
}

// windowBounds returns the seconds [from, to) of evaluation window w.
func (rep *Report) windowBounds(w int) (int64, int64) {
	sc := rep.rec.sc
	from := sc.WarmupSec + int64(w)*sc.WindowSec
	return from, from + sc.WindowSec
}

// windowError is (admitted - ideal) / allowance for tracked key k, window w.
func (rep *Report) windowError(k, w int, allowanceMilli float64) float64 {
	t := rep.rec.keys[k]
	var admitted int64
	for reg := range t.winAdmitted {
		admitted += t.winAdmitted[reg][w]
	}
	return float64(admitted*1000-rep.windowIdeal(k, w)) / allowanceMilli
}

func (rep *Report) windowIdeal(k, w int) int64 {
	from, to := rep.windowBounds(w)
	var ideal int64
	for _, v := range rep.ideal[k][from:to] {
		ideal += v
	}
	return ideal
}

func round6(v float64) float64 { return math.Round(v*1e6) / 1e6 }

// milli formats thousandths as a decimal with up to three decimals.
func milli(v int64) string {
	s := strconv.FormatFloat(float64(v)/1000, 'f', 3, 64)
	for s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s
}

type summaryJSON struct {
	Scenario     string       `json:"scenario"`
	Pass         bool         `json:"pass"`
	Seed         int64        `json:"seed"`
	SimulatedSec int64        `json:"simulated_s"`
	WallSec      float64      `json:"wall_s"`
	Decisions    int64        `json:"decisions"`
	Target       targetJSON   `json:"target"`
	Keys         []KeyResult  `json:"keys"`
	Worst        Worst        `json:"worst"`
	Regions      []string     `json:"regions"`
	Windows      []windowSpan `json:"windows"`
}

type targetJSON struct {
	MaxOver  float64 `json:"max_over"`
	MaxUnder float64 `json:"max_under"`
}

type windowSpan struct {
	Start int64 `json:"start_s"`
	End   int64 `json:"end_s"`
}

// WriteSummary writes <name>.summary.json's contents.
func (rep *Report) WriteSummary(w io.Writer) error {
	s := summaryJSON{
		Scenario:     rep.Scenario,
		Pass:         rep.Pass,
		Seed:         rep.Seed,
		SimulatedSec: rep.SimulatedSec,
		WallSec:      math.Round(rep.Wall.Seconds()*1000) / 1000,
		Decisions:    rep.Decisions,
		Target:       targetJSON{rep.Target.MaxOver, rep.Target.MaxUnder},
		Keys:         rep.Keys,
		Worst:        rep.Worst,
		Regions:      rep.rec.sc.Regions,
	}
	for w := 0; w < rep.rec.windows; w++ {
		from, to := rep.windowBounds(w)
		s.Windows = append(s.Windows, windowSpan{from, to})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// WriteWindows writes <name>.windows.csv's contents: per window, tracked
// key and policy, one row per region and one for the global sum (region
// "*", the only row with the ideal).
func (rep *Report) WriteWindows(w io.Writer) error {
	bw := bufio.NewWriter(w)
	bw.WriteString("window_start_s,window_end_s,key,policy,region,demand,admitted,ideal\n")
	sc := rep.rec.sc
	for win := 0; win < rep.rec.windows; win++ {
		from, to := rep.windowBounds(win)
		prefix := strconv.FormatInt(from, 10) + "," + strconv.FormatInt(to, 10) + ","
		for k, t := range rep.rec.keys {
			kp := csvField(t.key) + "," + csvField(t.policy.ID) + ","
			var dSum, aSum int64
			for reg, name := range sc.Regions {
				d, a := t.winDemand[reg][win], t.winAdmitted[reg][win]
				dSum += d
				aSum += a
				fmt.Fprintf(bw, "%s%s%s,%d,%d,\n", prefix, kp, name, d, a)
			}
			fmt.Fprintf(bw, "%s%s*,%d,%d,%s\n", prefix, kp, dSum, aSum, milli(rep.windowIdeal(k, win)))
		}
	}
	return bw.Flush()
}

// WriteSeconds writes <name>.seconds.csv's contents: per second, named key,
// policy and region.
func (rep *Report) WriteSeconds(w io.Writer) error {
	bw := bufio.NewWriter(w)
	bw.WriteString("t_s,key,policy,region,demand,admitted,share\n")
	sc := rep.rec.sc
	named := rep.rec.Named()
	for s := int64(0); s < sc.DurationSec; s++ {
		ts := strconv.FormatInt(s, 10) + ","
		for _, k := range named {
			t := rep.rec.keys[k]
			kp := csvField(t.key) + "," + csvField(t.policy.ID) + ","
			for reg, name := range sc.Regions {
				fmt.Fprintf(bw, "%s%s%s,%d,%d,%s\n", ts, kp, name, t.secRegDemand[reg][s], t.secRegAdmitted[reg][s], milli(t.secShareMilli[reg][s]))
			}
		}
	}
	return bw.Flush()
}

// csvField quotes a field when CSV requires it.
func csvField(s string) string {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ',', '"', '\n', '\r':
			return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
		}
	}
	return s
}

// WriteFiles writes the summary, both tables and the plot into dir (created
// if missing), named after the scenario. On error some files may be
// written; the error names the file.
func (rep *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("simulations: output folder: %w", err)
	}
	files := []struct {
		suffix string
		write  func(io.Writer) error
	}{
		{".summary.json", rep.WriteSummary},
		{".windows.csv", rep.WriteWindows},
		{".seconds.csv", rep.WriteSeconds},
		{".svg", rep.WritePlot},
	}
	for _, f := range files {
		path := filepath.Join(dir, rep.Scenario+f.suffix)
		if err := writeFile(path, f.write); err != nil {
			return fmt.Errorf("simulations: %s: %w", path, err)
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
