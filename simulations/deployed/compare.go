package deployed

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	"github.com/quotientlabs/quotient/simulations"
)

// Comparison is a deployed run against virtual time on the same scenario
// (same file, seed and rate scale): the per-window errors of every key
// side by side.
type Comparison struct {
	Scenario string
	// Keys are the tracked (key, policy) pairs present in both reports, in
	// report order. Generated groups' keys are compared too.
	Keys []KeyComparison
	// MaxDiff is the largest |deployed - virtual| over every window of
	// every key, in fractions of the window allowance; Worst names it.
	MaxDiff float64
	Worst   *WindowDiff
}

// KeyComparison is one key and policy.
type KeyComparison struct {
	Key, Policy string
	// Deployed and Virtual are the window errors, in window order.
	Deployed, Virtual []float64
	// DeployedWorst and VirtualWorst are each side's KeyResult.
	DeployedWorst, VirtualWorst simulations.KeyResult
}

// WindowDiff is one window of one key.
type WindowDiff struct {
	Key, Policy       string
	WindowStartSec    int64
	Deployed, Virtual float64
}

// Compare compares a deployed report with a virtual-time report of the
// same scenario. It fails when the two do not have the same keys and
// windows (different scenarios).
func Compare(dep, virt *simulations.Report) (*Comparison, error) {
	if len(dep.Keys) != len(virt.Keys) {
		return nil, fmt.Errorf("deployed: compare %s with %s: %d keys against %d", dep.Scenario, virt.Scenario, len(dep.Keys), len(virt.Keys))
	}
	starts := dep.WindowStarts()
	c := &Comparison{Scenario: dep.Scenario}
	for i := range dep.Keys {
		dk, vk := dep.Keys[i], virt.Keys[i]
		if dk.Key != vk.Key || dk.Policy != vk.Policy {
			return nil, fmt.Errorf("deployed: compare: key %d is %s/%s deployed and %s/%s virtual", i, dk.Key, dk.Policy, vk.Key, vk.Policy)
		}
		kc := KeyComparison{Key: dk.Key, Policy: dk.Policy, Deployed: dep.WindowErrors(i), Virtual: virt.WindowErrors(i), DeployedWorst: dk, VirtualWorst: vk}
		if len(kc.Deployed) != len(kc.Virtual) {
			return nil, fmt.Errorf("deployed: compare %s/%s: %d windows against %d", dk.Key, dk.Policy, len(kc.Deployed), len(kc.Virtual))
		}
		for w := range kc.Deployed {
			if d := math.Abs(kc.Deployed[w] - kc.Virtual[w]); d > c.MaxDiff || c.Worst == nil {
				c.MaxDiff = d
				c.Worst = &WindowDiff{Key: dk.Key, Policy: dk.Policy, WindowStartSec: starts[w], Deployed: kc.Deployed[w], Virtual: kc.Virtual[w]}
			}
		}
		c.Keys = append(c.Keys, kc)
	}
	return c, nil
}

// WriteTable prints, for every named or generated key whose windows
// differ at all, each window's error deployed and virtual (in % of the
// allowance), then the largest difference. Keys of generated groups are
// summarised by the group's largest difference only when there are more
// than maxKeys of them.
func (c *Comparison) WriteTable(w io.Writer, starts []int64, maxKeys int) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "key\tpolicy\twindow start s\tvirtual\tdeployed\tdiff\t")
	for i, k := range c.Keys {
		if i >= maxKeys {
			fmt.Fprintf(tw, "(%d more keys)\t\t\t\t\t\t\n", len(c.Keys)-maxKeys)
			break
		}
		for wi := range k.Deployed {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%+.1f%%\t%+.1f%%\t%.1f\t\n", k.Key, k.Policy, starts[wi], 100*k.Virtual[wi], 100*k.Deployed[wi], 100*math.Abs(k.Deployed[wi]-k.Virtual[wi]))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if c.Worst != nil {
		_, err := fmt.Fprintf(w, "%s: largest difference %.1f points (%s/%s, window at %d s: virtual %+.1f%%, deployed %+.1f%%)\n",
			c.Scenario, 100*c.MaxDiff, c.Worst.Key, c.Worst.Policy, c.Worst.WindowStartSec, 100*c.Worst.Virtual, 100*c.Worst.Deployed)
		return err
	}
	return nil
}
