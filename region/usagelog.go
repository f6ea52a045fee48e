package region

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotientlabs/quotient/rebalancer"
	"github.com/quotientlabs/quotient/rebalancer/redisio"
)

// loggedUsage is the region's usage source with its skipped fields made
// visible: a usage field the source cannot parse (a gateway of another
// version, a subject kind it does not know) is counted in
// quotient_coordinator_usage_bad_fields_total and logged once per epoch
// that has any, with the first such field. Without this the key's usage
// silently counted as none, and its share never grew. Its failures to
// unlink an old epoch's usage (redisio.Source.UnlinkFailures) are counted
// in quotient_coordinator_usage_unlink_failures_total. Safe for concurrent
// use.
type loggedUsage struct {
	src  *redisio.Source
	log  *slog.Logger
	seen atomic.Int64 // bad fields already logged
}

func newLoggedUsage(src *redisio.Source, log *slog.Logger, reg prometheus.Registerer) *loggedUsage {
	return newLoggedUsages([]*redisio.Source{src}, log, reg)[0]
}

// newLoggedUsages is newLoggedUsage for the sources of each key part
// (Config.Parts): one pair of metrics, their sums.
func newLoggedUsages(srcs []*redisio.Source, log *slog.Logger, reg prometheus.Registerer) []*loggedUsage {
	out := make([]*loggedUsage, len(srcs))
	for i, src := range srcs {
		out[i] = &loggedUsage{src: src, log: log}
	}
	sum := func(f func(*redisio.Source) int64) func() float64 {
		return func() float64 {
			var n int64
			for _, s := range srcs {
				n += f(s)
			}
			return float64(n)
		}
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "quotient_coordinator_usage_bad_fields_total",
		Help: "Usage entries read from this region's Redis and skipped because they do not parse (each epoch with any also logs the first one).",
	}, sum((*redisio.Source).BadFields)))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "quotient_coordinator_usage_unlink_failures_total",
		Help: "Collections whose deletion (UNLINK) of the usage hashes and overflow marker of the epoch two before failed: those keys were not freed in the background and will expire by themselves, which frees them on redis-server's main thread unless lazyfree-lazy-expire is yes (README, \"Expiry of usage hashes\").",
	}, sum((*redisio.Source).UnlinkFailures)))
	return out
}

// Usage implements rebalancer.UsageSource.
func (u *loggedUsage) Usage(ctx context.Context, epoch int64) ([]rebalancer.Usage, error) {
	out, err := u.src.Usage(ctx, epoch)
	if n := u.src.BadFields(); n > u.seen.Load() {
		u.log.Warn("region: usage fields skipped (unparsable); their keys' usage counts as none", "epoch", epoch, "skipped_total", n, "err", u.src.LastBadFields())
		u.seen.Store(n)
	}
	return out, err
}
