package dailyquota

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"time"
)

// Errors callers branch on; returned errors wrap them and say what was
// wrong.
var (
	// ErrInvalid: a count, window or configuration is malformed; nothing
	// was applied.
	ErrInvalid = errors.New("dailyquota: invalid")
	// ErrExpired: a count belongs to a window that has ended (more than the
	// grace ago); it is dropped, which is correct, not a failure.
	ErrExpired = errors.New("dailyquota: window expired")
)

var namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Key names one replicated count: one region's admissions for one subject,
// policy and window. It is the compaction key on Kafka.
type Key struct {
	Subject string // the limiter's encoded subject (limiter.Subject.Key)
	Policy  string // policy id
	StartMs int64  // window start, Unix ms
	Region  string // region whose admissions are counted
}

// Count is one region's absolute admitted count in one window. Within a
// window a region's count only grows, so receivers keep the maximum they
// have seen (max-merge): applying a Count twice, late or out of order
// changes nothing.
type Count struct {
	Key
	WindowMs  int64 // window length, ms, > 0
	N         int64 // admitted cost units, >= 0
	UpdatedMs int64 // when the sender read N, Unix ms of its clock; informational (lag)
}

// EndMs is the end of the count's window, Unix ms.
func (c Count) EndMs() int64 { return c.StartMs + c.WindowMs }

// Validate reports a malformed count, naming the field.
func (c Count) Validate() error {
	switch {
	case c.Subject == "":
		return fmt.Errorf("%w: count: subject is empty", ErrInvalid)
	case !namePattern.MatchString(c.Policy):
		return fmt.Errorf("%w: count: policy %q: want 1 to 64 of [A-Za-z0-9._-]", ErrInvalid, c.Policy)
	case !namePattern.MatchString(c.Region):
		return fmt.Errorf("%w: count: region %q: want 1 to 64 of [A-Za-z0-9._-]", ErrInvalid, c.Region)
	case c.StartMs < 0:
		return fmt.Errorf("%w: count: window start %d: want >= 0", ErrInvalid, c.StartMs)
	case c.WindowMs <= 0:
		return fmt.Errorf("%w: count: window length %d ms: want > 0", ErrInvalid, c.WindowMs)
	case c.N < 0:
		return fmt.Errorf("%w: count: n %d: want >= 0", ErrInvalid, c.N)
	}
	return nil
}

// Accept decides whether a received count should be merged into this
// region's store at now: it must be valid, of a policy in policies with the
// policy's window alignment, and its window must not have ended more than
// grace ago (expired windows are dropped everywhere: ErrExpired). A nil
// error means merge it. Accept is pure.
func Accept(now time.Time, c Count, policies map[string]Policy, grace time.Duration) error {
	if err := c.Validate(); err != nil {
		return err
	}
	p, ok := policies[c.Policy]
	if !ok {
		return fmt.Errorf("%w: count: policy %q is not a replicated window policy here", ErrInvalid, c.Policy)
	}
	if !p.Window.Aligned(c.StartMs, c.WindowMs) {
		return fmt.Errorf("%w: count: window [%d, +%d ms) is not a %v window of policy %q",
			ErrInvalid, c.StartMs, c.WindowMs, p.Window, c.Policy)
	}
	if c.EndMs()+grace.Milliseconds() <= now.UnixMilli() {
		return fmt.Errorf("%w: count of policy %q for window ending %s", ErrExpired, c.Policy, time.UnixMilli(c.EndMs()).UTC().Format(time.RFC3339))
	}
	return nil
}

// Policy is what replication needs to know of a global fixed-window policy.
type Policy struct {
	ID     string
	Limit  int64 // cost units per window, > 0
	Window Spec
}

// Validate reports a malformed policy, naming the field.
func (p Policy) Validate() error {
	if !namePattern.MatchString(p.ID) {
		return fmt.Errorf("%w: policy id %q: want 1 to 64 of [A-Za-z0-9._-]", ErrInvalid, p.ID)
	}
	if p.Limit <= 0 {
		return fmt.Errorf("%w: policy %q: limit %d: want > 0", ErrInvalid, p.ID, p.Limit)
	}
	if err := p.Window.Validate(); err != nil {
		return fmt.Errorf("policy %q: %w", p.ID, err)
	}
	return nil
}

// PublisherConfig configures a Publisher. Start from DefaultPublisherConfig.
type PublisherConfig struct {
	// Region is this region's name. Required.
	Region string
	// Refresh re-publishes a count that has not changed for this long,
	// while its window lasts, so that it outlives the topic's retention
	// (3 days by default for daily windows) and reaches a broker that lost
	// its log. Default 1 h.
	Refresh time.Duration
	// MaxRefreshPerTick bounds the refreshed counts one Pending call adds,
	// so a refresh of many keys spreads over several ticks. Default 10000.
	MaxRefreshPerTick int
}

// DefaultPublisherConfig returns the defaults for region.
func DefaultPublisherConfig(region string) PublisherConfig {
	return PublisherConfig{Region: region, Refresh: time.Hour, MaxRefreshPerTick: 10_000}
}

// Validate fills defaults and rejects bad values, naming the field.
func (c *PublisherConfig) Validate() error {
	d := DefaultPublisherConfig(c.Region)
	if !namePattern.MatchString(c.Region) {
		return fmt.Errorf("%w: publisher: region %q: want 1 to 64 of [A-Za-z0-9._-]", ErrInvalid, c.Region)
	}
	if c.Refresh == 0 {
		c.Refresh = d.Refresh
	}
	if c.Refresh < 0 {
		return fmt.Errorf("%w: publisher: refresh %v: must not be negative", ErrInvalid, c.Refresh)
	}
	if c.MaxRefreshPerTick == 0 {
		c.MaxRefreshPerTick = d.MaxRefreshPerTick
	}
	if c.MaxRefreshPerTick < 0 {
		return fmt.Errorf("%w: publisher: max refresh per tick %d: must not be negative", ErrInvalid, c.MaxRefreshPerTick)
	}
	return nil
}

type sent struct {
	n, windowMs int64
	atMs        int64 // when last acknowledged
}

// Publisher decides which of this region's counts to publish: a count that
// grew since it was last acknowledged, and a count last acknowledged more
// than Refresh ago whose window is still open. It remembers, per key, the
// last acknowledged count until the window ends. It is pure (no I/O, no
// clock) and not safe for concurrent use; the driver owns it.
//
// Protocol: Pending(now, observed) returns the counts to send; the driver
// sends them and calls Acked with those the bus confirmed. A count not
// acknowledged is offered again by the next Pending (at-least-once).
type Publisher struct {
	cfg  PublisherConfig
	sent map[Key]sent
}

// NewPublisher returns a Publisher, or an error naming a bad config field.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{cfg: cfg, sent: map[Key]sent{}}, nil
}

// Pending returns the counts to publish at now, sorted by key, each stamped
// UpdatedMs = now: every observed count of this region that exceeds what
// was last acknowledged for its key (a count from another region, of an
// ended window, or not larger is skipped; observed is not modified), then
// up to MaxRefreshPerTick counts due for a refresh. Pending also forgets
// keys whose windows have ended.
func (p *Publisher) Pending(now time.Time, observed []Count) []Count {
	nowMs := now.UnixMilli()
	for k, s := range p.sent {
		if k.StartMs+s.windowMs <= nowMs {
			delete(p.sent, k)
		}
	}
	var out []Count
	chosen := map[Key]bool{}
	for _, c := range observed {
		if c.Region != p.cfg.Region || c.Validate() != nil || c.EndMs() <= nowMs {
			continue
		}
		if s, ok := p.sent[c.Key]; ok && c.N <= s.n {
			continue
		}
		if chosen[c.Key] {
			// The same key twice in one observation: keep the larger.
			for i := range out {
				if out[i].Key == c.Key && c.N > out[i].N {
					out[i].N = c.N
				}
			}
			continue
		}
		chosen[c.Key] = true
		c.UpdatedMs = nowMs
		out = append(out, c)
	}
	var due []Count
	for k, s := range p.sent {
		if !chosen[k] && nowMs-s.atMs >= p.cfg.Refresh.Milliseconds() {
			due = append(due, Count{Key: k, WindowMs: s.windowMs, N: s.n, UpdatedMs: nowMs})
		}
	}
	sortCounts(due)
	if len(due) > p.cfg.MaxRefreshPerTick {
		// Oldest acknowledgements first, so every key gets its turn.
		sort.SliceStable(due, func(i, j int) bool { return p.sent[due[i].Key].atMs < p.sent[due[j].Key].atMs })
		due = due[:p.cfg.MaxRefreshPerTick]
	}
	out = append(out, due...)
	sortCounts(out)
	return out
}

// Acked records that the bus confirmed counts at now. A count smaller than
// one already acknowledged for its key changes nothing.
func (p *Publisher) Acked(now time.Time, counts []Count) {
	nowMs := now.UnixMilli()
	for _, c := range counts {
		if c.Region != p.cfg.Region || c.EndMs() <= nowMs {
			continue
		}
		s, ok := p.sent[c.Key]
		if ok && c.N < s.n {
			continue
		}
		p.sent[c.Key] = sent{n: c.N, windowMs: c.WindowMs, atMs: nowMs}
	}
}

// Tracked is the number of keys the Publisher remembers.
func (p *Publisher) Tracked() int { return len(p.sent) }

func sortCounts(cs []Count) {
	sort.Slice(cs, func(i, j int) bool { return keyLess(cs[i].Key, cs[j].Key) })
}

func keyLess(a, b Key) bool {
	if a.Subject != b.Subject {
		return a.Subject < b.Subject
	}
	if a.Policy != b.Policy {
		return a.Policy < b.Policy
	}
	if a.StartMs != b.StartMs {
		return a.StartMs < b.StartMs
	}
	return a.Region < b.Region
}
