package region

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/shares"
)

// metrics implements rebalancer.Observer with Prometheus collectors on
// the Coordinator's own registry. The driver calls it from one goroutine.
type metrics struct {
	regions int

	epochDuration *prometheus.HistogramVec // by phase
	keys          *prometheus.GaugeVec     // by kind
	reportLag     *prometheus.HistogramVec // by region
	reports       *prometheus.CounterVec   // by region, receipt
	published     *prometheus.CounterVec   // by kind (full, delta)
	regionsAlive  prometheus.Gauge
	lastEpoch     *prometheus.GaugeVec // by region
	decisions     *prometheus.CounterVec
	updates       prometheus.Counter
	usageUnknown  prometheus.Counter
	usageIncompl  prometheus.Counter
	again         prometheus.Counter
	held          prometheus.Gauge
	// heldFrom is the epoch after the last one decided with growth or in
	// fallback (-1: none yet); the held gauge counts epochs from it.
	heldFrom int64
	errors   *prometheus.CounterVec // by kind

	// Transfers between decisions (issue 17).
	transferAsks      *prometheus.CounterVec // by direction
	transferGives     *prometheus.CounterVec // by direction, outcome
	transferRefused   *prometheus.CounterVec // by reason
	transferAmount    *prometheus.CounterVec // by direction
	transferMalformed prometheus.Counter
	partsMismatch     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, regions []string) *metrics {
	m := &metrics{
		regions:  len(regions),
		heldFrom: -1,
		epochDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quotient_coordinator_epoch_duration_seconds",
			Help:    "Cost of one epoch in this region, by phase: total (collect start to the decision's writes), read (usage from Redis), publish (pending writes and the Kafka publish), write (the decision's share writes).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10},
		}, []string{"phase"}),
		keys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quotient_coordinator_keys",
			Help: "Keys at the last epoch, by kind: usage (usage entries collected), reported (keys in the published report), state (keys the rebalancer holds), decided (keys computed at the last decision).",
		}, []string{"kind"}),
		reportLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quotient_coordinator_report_lag_seconds",
			Help:    "Time from the end of a report's epoch to its receipt here, by sending region.",
			Buckets: []float64{.1, .25, .5, 1, 1.5, 2, 3, 5, 10, 30},
		}, []string{"region"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotient_coordinator_reports_total",
			Help: "Reports taken from Kafka, by sending region and receipt (accepted, duplicate, conflict, stale, own, future: an epoch after the receiver's, beyond the clock skew the protocol allows, refused; unbased: a delta report whose base report this coordinator does not hold, not applied, as if lost); invalid reports count in quotient_coordinator_errors_total{kind=\"report\"}.",
		}, []string{"region", "receipt"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotient_coordinator_reports_published_total",
			Help: "Reports this region published, by kind: full, or delta (only the keys whose line changed since the last full report; rebalancer.Config.Deltas). Failed publications count in quotient_coordinator_errors_total{kind=\"publish\"}.",
		}, []string{"kind"}),
		regionsAlive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quotient_coordinator_regions_alive",
			Help: "Regions not silent at the last decision (this one included).",
		}),
		lastEpoch: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quotient_coordinator_last_epoch",
			Help: "Last epoch collected (this region) or accepted from a region's report.",
		}, []string{"region"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotient_coordinator_decisions_total",
			Help: "Decisions by mode (grow, hold, fallback), and whether made late (at the next collection).",
		}, []string{"mode", "late"}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotient_coordinator_share_updates_total",
			Help: "Share records written or deleted.",
		}),
		again: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotient_coordinator_again_decisions_total",
			Help: "Second decisions of an epoch, with growth: the first held because a region's report arrived after --max-wait, and it arrived before the next epoch ended (also counted in decisions_total{mode=\"grow\"}).",
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quotient_coordinator_held_epochs",
			Help: "Consecutive epochs, up to the last one decided, decided in mode hold (no growth: some region's report missing or late) with no later decision of the epoch that grew; 0 after a grow or fallback decision. Several in a row mean reports arrive after the next epoch ends: busy regions cannot take idle regions' shares.",
		}),
		usageUnknown: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotient_coordinator_usage_unknown_epochs_total",
			Help: "Epochs collected with their usage unknown (the read failed): smoothed demand and shares were held, not cut to the floor.",
		}),
		usageIncompl: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quotient_coordinator_usage_incomplete_epochs_total",
			Help: "Epochs whose usage a gateway dropped in part (its --usage-max-keys bound, marked in Redis): collected as a lower bound, so no key's smoothed demand fell and no share was given up at collection.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotient_coordinator_errors_total",
			Help: "Failures by kind: usage_read, publish (report not published), share_write, report (invalid report received), transfer (a pressure or own-demand read, or an ask's publication, failed).",
		}, []string{"kind"}),
	}
	m.transferAsks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotient_coordinator_transfer_asks_total",
		Help: "Asks for share between decisions: sent (published by this region; failed publications count in quotient_coordinator_errors_total{kind=\"transfer\"}) and received (other regions' asks answered, with a give or not).",
	}, []string{"direction"})
	m.transferGives = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotient_coordinator_transfer_gives_total",
		Help: "Gives of share between decisions, by direction and outcome: sent/published, sent/dropped_write (the lowered shares were not written, so the give was not sent), sent/dropped_publish (written, not published: the amount is unused until the next decision); received/accepted, received/refused_core (fallback, warm-up, not the expected transfer epoch, duplicate), received/refused_invalid (malformed).",
	}, []string{"direction", "outcome"})
	m.transferRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotient_coordinator_transfer_gives_refused_total",
		Help: "Gives to this region that raised no share, by reason (rebalancer.GiveRefusal): invalid (malformed), other_region (addressed elsewhere), disabled (--transfers=false), warmup (after a start), no_report (none published for the last collected epoch), fallback, duplicate (accepted before), epoch (for another report period), or, every key refused, the cause most keys had: given_here (given from here since the last report), unknown_policy, no_room (at the limit, or nothing left to raise). Each refusal but invalid is logged at debug level with the give's keys and epochs.",
	}, []string{"reason"})
	m.transferAmount = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotient_coordinator_transfer_rate_moved_milli_total",
		Help: "Rate share moved by gives, milli cost units per second summed over keys and gives: given (published by this region) and accepted (raised here; the whole amount of an accepted give, including a part the Core dropped to keep the share on one side of the default).",
	}, []string{"direction"})
	m.transferMalformed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quotient_coordinator_transfer_malformed_total",
		Help: "Messages of the transfer topic skipped: undecodable, neither an ask nor a give, invalid, or of another epoch length.",
	})
	m.partsMismatch = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quotient_coordinator_reports_parts_mismatch_total",
		Help: "Reports refused because their sender splits the key space into another number of parts (--parts must be the same in every region); the first is logged. Counted once per part driver that read it.",
	})
	reg.MustRegister(m.partsMismatch)
	for _, d := range []string{"sent", "received"} {
		m.transferAsks.WithLabelValues(d)
	}
	for _, o := range [][2]string{{"sent", "published"}, {"sent", "dropped_write"}, {"sent", "dropped_publish"}, {"received", "accepted"}, {"received", "refused_core"}, {"received", "refused_invalid"}} {
		m.transferGives.WithLabelValues(o[0], o[1])
	}
	for _, d := range []string{"given", "accepted"} {
		m.transferAmount.WithLabelValues(d)
	}
	for _, r := range rebalancer.GiveRefusals() {
		m.transferRefused.WithLabelValues(r.String())
	}
	reg.MustRegister(m.transferAsks, m.transferGives, m.transferRefused, m.transferAmount, m.transferMalformed)
	reg.MustRegister(m.epochDuration, m.keys, m.reportLag, m.reports, m.published, m.regionsAlive, m.lastEpoch, m.decisions, m.updates, m.usageUnknown, m.usageIncompl, m.again, m.held, m.errors)
	for _, k := range []string{"usage_read", "publish", "share_write", "report", "transfer"} {
		m.errors.WithLabelValues(k)
	}
	return m
}

var (
	_ rebalancer.Observer         = (*metrics)(nil)
	_ rebalancer.TransferObserver = (*metrics)(nil)
)

// Transferred counts asks and gives.
func (m *metrics) Transferred(t rebalancer.TransferInfo) {
	switch t.Kind {
	case rebalancer.PressureFailed:
		m.errors.WithLabelValues("transfer").Inc()
	case rebalancer.AskSent:
		if t.Err != nil {
			m.errors.WithLabelValues("transfer").Inc()
			return
		}
		m.transferAsks.WithLabelValues("sent").Inc()
	case rebalancer.AskReceived:
		if t.Err != nil {
			m.errors.WithLabelValues("transfer").Inc()
		}
		m.transferAsks.WithLabelValues("received").Inc()
	case rebalancer.GiveSent:
		switch t.Reason {
		case "":
			m.transferGives.WithLabelValues("sent", "published").Inc()
			m.transferAmount.WithLabelValues("given").Add(float64(t.Amount.RateMilli))
		case rebalancer.ReasonWrite:
			m.transferGives.WithLabelValues("sent", "dropped_write").Inc()
		default:
			m.transferGives.WithLabelValues("sent", "dropped_publish").Inc()
		}
	case rebalancer.GiveReceived:
		switch {
		case t.Accepted:
			m.transferGives.WithLabelValues("received", "accepted").Inc()
			m.transferAmount.WithLabelValues("accepted").Add(float64(t.Amount.RateMilli))
		case t.Reason == rebalancer.ReasonError:
			m.transferGives.WithLabelValues("received", "refused_invalid").Inc()
			m.transferRefused.WithLabelValues(rebalancer.RefusedInvalid.String()).Inc()
		default:
			m.transferGives.WithLabelValues("received", "refused_core").Inc()
			m.transferRefused.WithLabelValues(t.Refusal.String()).Inc()
		}
	}
}

func (m *metrics) Collected(c rebalancer.CollectInfo) {
	m.epochDuration.WithLabelValues("read").Observe(c.Read.Seconds())
	m.epochDuration.WithLabelValues("publish").Observe(c.Publish.Seconds())
	m.keys.WithLabelValues("usage").Set(float64(c.UsageKeys))
	m.keys.WithLabelValues("reported").Set(float64(c.ReportKeys))
	m.keys.WithLabelValues("state").Set(float64(c.CoreKeys))
	if c.UsageErr != nil && !c.UsageIncomplete {
		m.errors.WithLabelValues("usage_read").Inc()
	}
	if c.UsageUnknown {
		m.usageUnknown.Inc()
	}
	if c.UsageIncomplete {
		m.usageIncompl.Inc()
	}
	if c.PublishErr != nil {
		m.errors.WithLabelValues("publish").Inc()
	}
	if c.Published {
		kind := "full"
		if c.ReportBase > 0 {
			kind = "delta"
		}
		m.published.WithLabelValues(kind).Inc()
	}
}

func (m *metrics) Decided(d rebalancer.DecideInfo) {
	m.epochDuration.WithLabelValues("total").Observe(d.Duration.Seconds())
	m.epochDuration.WithLabelValues("write").Observe(d.Write.Seconds())
	m.keys.WithLabelValues("decided").Set(float64(d.Decision.Keys))
	m.regionsAlive.Set(float64(m.regions - len(d.Decision.Silent)))
	m.decisions.WithLabelValues(d.Decision.Mode.String(), strconv.FormatBool(d.Late)).Inc()
	if d.Decision.Again {
		m.again.Inc()
	}
	if d.Decision.Mode == shares.Hold {
		if m.heldFrom < 0 {
			m.heldFrom = d.Decision.Epoch
		}
		m.held.Set(float64(d.Decision.Epoch - m.heldFrom + 1))
	} else {
		m.heldFrom = d.Decision.Epoch + 1
		m.held.Set(0)
	}
	if d.WriteErr != nil {
		m.errors.WithLabelValues("share_write").Inc()
	} else {
		m.updates.Add(float64(len(d.Decision.Updates)))
	}
}

func (m *metrics) Received(r rebalancer.ReceiveInfo) {
	if r.Err != nil {
		// Not labelled by region: an invalid report's region may be
		// anything, and labels must stay bounded.
		m.errors.WithLabelValues("report").Inc()
		return
	}
	m.reports.WithLabelValues(r.Region, r.Receipt.String()).Inc()
	if r.Receipt != rebalancer.Own && r.Receipt != rebalancer.Future {
		m.reportLag.WithLabelValues(r.Region).Observe(r.Lag.Seconds())
	}
	if r.Receipt == rebalancer.Accepted || r.Receipt == rebalancer.Own {
		m.lastEpoch.WithLabelValues(r.Region).Set(float64(r.Epoch))
	}
}

// registerRole exposes this replica's role and the policy log's state:
// quotient_coordinator_leader (1 while it runs the epoch loop),
// quotient_coordinator_members (live replicas in its gossip view; 1
// without gossip), and with the policy log quotient_coordinator_policy_generation
// and quotient_coordinator_policy_records_bad_total.
func (c *Coordinator) registerRole() {
	c.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quotient_coordinator_leader", Help: "1 while this replica leads its region's epoch loop and daily-quota replication, else 0."},
			func() float64 {
				if c.Leading() {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quotient_coordinator_members", Help: "Live coordinator replicas of this region in this replica's gossip view (1 without gossip)."},
			func() float64 {
				if c.member == nil {
					return 1
				}
				return float64(len(c.member.Alive()))
			}),
	)
	if c.catalog != nil {
		c.registry.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quotient_coordinator_policy_generation", Help: "Generation of the policy catalog replayed from the policy log (sum of the highest versions)."},
				func() float64 { return float64(c.catalog.Generation()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "quotient_coordinator_policy_records_bad_total", Help: "Policy log records refused (undecodable or invalid); they are skipped."},
				func() float64 { return float64(c.follower.Bad()) }),
		)
	}
}
