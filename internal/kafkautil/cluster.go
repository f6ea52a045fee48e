package kafkautil

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// Errors callers branch on.
var (
	// ErrConfig wraps every configuration error.
	ErrConfig = errors.New("kafkautil: invalid config")
	// ErrUnknownTopic means the cluster does not (yet) know the topic.
	ErrUnknownTopic = errors.New("kafkautil: unknown topic")
)

// Config says how to reach one Kafka cluster. Start from DefaultConfig.
type Config struct {
	// Brokers are bootstrap addresses, host:port. Required.
	Brokers []string
	// ClientID is sent to the brokers with every request. Default "quotient".
	ClientID string
	// TLS, when non-nil, encrypts every connection.
	TLS *tls.Config
	// SASL, when non-nil, authenticates every connection.
	SASL sasl.Mechanism
	// DialTimeout bounds establishing one connection (TLS and SASL
	// included). Default 5 s.
	DialTimeout time.Duration
	// MetadataTTL bounds how stale the shared metadata cache may be, hence how
	// long a topic created by another process can look unknown. Default 1 s.
	MetadataTTL time.Duration
	// RequestTimeout bounds administrative requests (metadata, list offsets,
	// create topics) when the caller's context has no earlier deadline.
	// Default 10 s.
	RequestTimeout time.Duration
	// IdleTimeout is how long the shared Transport keeps an unused
	// connection open. kafka-go gives each request a connection of its own
	// and opens another (dial, then an ApiVersions round trip) when all are
	// busy, so after a burst of concurrent requests its 30 s default leaves
	// the next burst to pay a round trip more per connection: to a far
	// broker, a give that arrives after the asker's next collection and is
	// refused. Default 4 min: under the brokers' connections.max.idle.ms
	// (10 min) and the 350 s idle limit of common NAT gateways and load
	// balancers.
	IdleTimeout time.Duration
}

// DefaultConfig returns the defaults for the given brokers.
func DefaultConfig(brokers ...string) Config {
	return Config{
		Brokers:        brokers,
		ClientID:       "quotient",
		DialTimeout:    5 * time.Second,
		MetadataTTL:    time.Second,
		RequestTimeout: 10 * time.Second,
		IdleTimeout:    4 * time.Minute,
	}
}

// Validate fills zero fields with defaults and rejects bad values.
func (c *Config) Validate() error {
	d := DefaultConfig()
	if len(c.Brokers) == 0 {
		return fmt.Errorf("%w: brokers: at least one host:port is required", ErrConfig)
	}
	for i, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return fmt.Errorf("%w: brokers[%d] %q: want host:port: %v", ErrConfig, i, b, err)
		}
	}
	if c.ClientID == "" {
		c.ClientID = d.ClientID
	}
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"dial timeout", &c.DialTimeout, d.DialTimeout},
		{"metadata TTL", &c.MetadataTTL, d.MetadataTTL},
		{"request timeout", &c.RequestTimeout, d.RequestTimeout},
		{"idle timeout", &c.IdleTimeout, d.IdleTimeout},
	} {
		if *f.v < 0 {
			return fmt.Errorf("%w: %s %v: must not be negative", ErrConfig, f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return nil
}

// Cluster is a handle on one Kafka cluster: a Transport shared by its
// kafka.Client and by every Writer built from it, and a Dialer for readers.
// Construct with New; the zero value is not usable. Safe for concurrent use.
// Close releases idle connections; writers and readers built from it must be
// closed by their owners first.
type Cluster struct {
	cfg       Config
	transport *kafka.Transport
	client    *kafka.Client
	dialer    *kafka.Dialer
}

// New validates cfg and returns a Cluster. It does no I/O: connection
// problems surface on first use.
func New(cfg Config) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Brokers = slices.Clone(cfg.Brokers)
	t := &kafka.Transport{
		DialTimeout: cfg.DialTimeout,
		MetadataTTL: cfg.MetadataTTL,
		IdleTimeout: cfg.IdleTimeout,
		ClientID:    cfg.ClientID,
		TLS:         cfg.TLS,
		SASL:        cfg.SASL,
	}
	return &Cluster{
		cfg:       cfg,
		transport: t,
		client:    &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: cfg.RequestTimeout, Transport: t},
		dialer: &kafka.Dialer{
			ClientID:      cfg.ClientID,
			Timeout:       cfg.DialTimeout,
			DualStack:     true,
			TLS:           cfg.TLS,
			SASLMechanism: cfg.SASL,
		},
	}, nil
}

// Brokers returns a copy of the bootstrap addresses.
func (c *Cluster) Brokers() []string { return slices.Clone(c.cfg.Brokers) }

// Client returns the kafka.Client that shares this cluster's Transport, for
// administrative requests this package does not wrap.
func (c *Cluster) Client() *kafka.Client { return c.client }

// Close closes the Transport's idle connections. It never fails.
func (c *Cluster) Close() error {
	c.transport.CloseIdleConnections()
	return nil
}

// Partitions returns the sorted partition IDs of topic. It returns an error
// wrapping ErrUnknownTopic when the cluster does not know the topic (as seen
// through the metadata cache, at most Config.MetadataTTL old).
func (c *Cluster) Partitions(ctx context.Context, topic string) ([]int, error) {
	resp, err := c.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("kafkautil: metadata for topic %q: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.Name != topic {
			continue
		}
		if errors.Is(t.Error, kafka.UnknownTopicOrPartition) || (t.Error == nil && len(t.Partitions) == 0) {
			return nil, fmt.Errorf("%w: %q", ErrUnknownTopic, topic)
		}
		if t.Error != nil {
			return nil, fmt.Errorf("kafkautil: metadata for topic %q: %w", topic, t.Error)
		}
		ids := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ids = append(ids, p.ID)
		}
		slices.Sort(ids)
		return ids, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownTopic, topic)
}

// OffsetsAt returns, for each given partition of topic, the offset of the
// first record whose timestamp is at or after t; a partition with no such
// record maps to its end offset (the offset the next record will get), read
// before the timestamp lookup so that no record produced in between is
// skipped.
func (c *Cluster) OffsetsAt(ctx context.Context, topic string, partitions []int, t time.Time) (map[int]int64, error) {
	ends := make([]kafka.OffsetRequest, len(partitions))
	ats := make([]kafka.OffsetRequest, len(partitions))
	for i, p := range partitions {
		ends[i] = kafka.LastOffsetOf(p)
		ats[i] = kafka.TimeOffsetOf(p, t)
	}
	endResp, err := c.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: ends}})
	if err != nil {
		return nil, fmt.Errorf("kafkautil: end offsets of %q: %w", topic, err)
	}
	atResp, err := c.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: ats}})
	if err != nil {
		return nil, fmt.Errorf("kafkautil: offsets of %q at %s: %w", topic, t.UTC().Format(time.RFC3339Nano), err)
	}
	out := make(map[int]int64, len(partitions))
	for _, po := range endResp.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("kafkautil: end offset of %q partition %d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = po.LastOffset
	}
	for _, po := range atResp.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("kafkautil: offset of %q partition %d at %s: %w", topic, po.Partition, t.UTC().Format(time.RFC3339Nano), po.Error)
		}
		for off := range po.Offsets { // at most one entry: the record found
			if off >= 0 {
				out[po.Partition] = off
			}
		}
	}
	for _, p := range partitions {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("kafkautil: no offset for %q partition %d in the broker's answer", topic, p)
		}
	}
	return out, nil
}

// Fetch waits of partition readers (ReaderConfig.MaxWait).
const (
	// DefaultFetchWait is the default ReaderConfig.MaxWait: long enough that
	// the broker always holds a fetch to answer the moment a record lands,
	// and that a broker up to 1 s away answers inside kafka-go's deadline.
	DefaultFetchWait = 5 * time.Second
	// MinFetchWait is the shortest ReaderConfig.MaxWait accepted: kafka-go
	// keeps min(1 s, MaxWait/4) of it for the round trip, and below 2 s
	// that margin shrinks under 500 ms (125 ms at the former 500 ms wait,
	// 25 ms at 100 ms), so a broker farther away than it never answers an
	// idle fetch in time.
	MinFetchWait = 2 * time.Second
)

// ReaderConfig tunes NewPartitionReader and the readers of ConsumeTopics.
type ReaderConfig struct {
	// MaxBytes is the most one fetch may return, bytes; it must exceed the
	// largest record batch on the topic. Default 4 MiB.
	MaxBytes int
	// MaxWait bounds how long the broker holds a fetch open waiting for new
	// records. Default DefaultFetchWait (5 s); at least MinFetchWait (2 s),
	// a shorter (or negative) wait is an error wrapping ErrConfig. kafka-go
	// also makes it the reader's deadline for the whole fetch and asks the
	// broker to hold it MaxWait minus min(1 s, MaxWait/4), so a round trip
	// to the broker longer than that difference (1 s from MaxWait 4 s on)
	// turns every fetch that finds nothing into a timeout and a
	// reconnection, and the reader reads nothing. A reader does not wait
	// for an idle fetch to end when it is closed (see PartitionReader).
	MaxWait time.Duration
}

// check fills defaults and rejects bad values, naming the field.
func (rc *ReaderConfig) check() error {
	if rc.MaxBytes < 0 {
		return fmt.Errorf("%w: reader max bytes %d: must not be negative", ErrConfig, rc.MaxBytes)
	}
	if rc.MaxBytes == 0 {
		rc.MaxBytes = 4 << 20
	}
	if rc.MaxWait == 0 {
		rc.MaxWait = DefaultFetchWait
	}
	if rc.MaxWait < MinFetchWait {
		return fmt.Errorf("%w: reader fetch wait (max wait) %v: want at least %v (kafka-go keeps min(1 s, wait/4) of it for the round trip to the broker)", ErrConfig, rc.MaxWait, MinFetchWait)
	}
	return nil
}

// PartitionReader is a kafka-go Reader of one partition whose Close does
// not wait for a fetch the broker holds open: it closes the reader's
// connections first (kafka.Reader.Close alone waits for the fetch in
// flight, up to ReaderConfig.MaxWait). Every method of kafka.Reader is
// available; the same goroutine-safety rules apply.
type PartitionReader struct {
	*kafka.Reader
	conns *readerConns
}

// Close closes the reader's connections, then the reader; it returns
// kafka.Reader.Close's error. A ReadMessage in progress fails.
func (r *PartitionReader) Close() error {
	r.conns.closeAll()
	return r.Reader.Close()
}

// NewPartitionReader returns a reader of one partition, starting at offset
// (kafka.FirstOffset and kafka.LastOffset are allowed). No consumer group,
// no commits. A bad rc is an error wrapping ErrConfig. The caller owns the
// reader and must Close it; Close returns promptly (see PartitionReader).
func (c *Cluster) NewPartitionReader(topic string, partition int, offset int64, rc ReaderConfig) (*PartitionReader, error) {
	if err := rc.check(); err != nil {
		return nil, err
	}
	conns := &readerConns{}
	r, err := c.newPartitionReader(topic, partition, offset, rc, conns.dialer(c.dialer))
	if err != nil {
		return nil, err
	}
	return &PartitionReader{Reader: r, conns: conns}, nil
}

// newPartitionReader is NewPartitionReader with the reader's Dialer and a
// checked rc.
func (c *Cluster) newPartitionReader(topic string, partition int, offset int64, rc ReaderConfig, dialer *kafka.Dialer) (*kafka.Reader, error) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:         c.Brokers(),
		Topic:           topic,
		Partition:       partition,
		Dialer:          dialer,
		MinBytes:        1,
		MaxBytes:        rc.MaxBytes,
		MaxWait:         rc.MaxWait,
		ReadLagInterval: -1,
		ReadBackoffMin:  20 * time.Millisecond,
		ReadBackoffMax:  500 * time.Millisecond,
		// Report an offset that retention has removed instead of retrying
		// forever, so the caller can restart from a valid offset.
		OffsetOutOfRangeError: true,
	})
	if err := r.SetOffset(offset); err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("kafkautil: reader of %q partition %d at offset %d: %w", topic, partition, offset, err)
	}
	return r, nil
}

// readerConns tracks the connections one partition reader dials, so that
// closeAll can end a fetch the broker holds open: kafka.Reader.Close waits
// for the fetch in flight, up to ReaderConfig.MaxWait, and a consumer that
// stops should not. Safe for concurrent use.
type readerConns struct {
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

// dialer returns a copy of base that dials through rc.
func (rc *readerConns) dialer(base *kafka.Dialer) *kafka.Dialer {
	d := *base
	d.DialFunc = rc.dial
	return &d
}

func (rc *readerConns) dial(ctx context.Context, network, address string) (net.Conn, error) {
	nc, err := (&net.Dialer{}).DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: nc, rc: rc}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.closed {
		_ = nc.Close()
		return nil, fmt.Errorf("kafkautil: dial %s: consumer stopped: %w", address, net.ErrClosed)
	}
	if rc.conns == nil {
		rc.conns = map[*trackedConn]struct{}{}
	}
	rc.conns[tc] = struct{}{}
	return tc, nil
}

// closeAll closes every open connection and refuses new ones.
func (rc *readerConns) closeAll() {
	rc.mu.Lock()
	rc.closed = true
	conns := rc.conns
	rc.conns = nil
	rc.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
}

// trackedConn leaves its readerConns when closed.
type trackedConn struct {
	net.Conn
	rc *readerConns
}

func (c *trackedConn) Close() error {
	c.rc.mu.Lock()
	delete(c.rc.conns, c)
	c.rc.mu.Unlock()
	return c.Conn.Close()
}

func joinErrs(errs map[string]error) error {
	var parts []string
	var wrapped []error
	for name, err := range errs {
		parts = append(parts, fmt.Sprintf("%s: %v", name, err))
		wrapped = append(wrapped, err)
	}
	slices.Sort(parts)
	return fmt.Errorf("%s: %w", strings.Join(parts, "; "), errors.Join(wrapped...))
}
