package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// produceFaults makes the broker lose or duplicate produce requests, for
// deployed-mode scenarios with message loss and duplication (TCP loses
// nothing, so the faults are the broker's): a lost request is acknowledged
// as written and not stored (the producer believes it delivered, no
// consumer ever sees it); a duplicated one is stored twice, as a retry
// after a lost acknowledgement stores it without idempotence.
type produceFaults struct {
	drop, duplicate float64 // probabilities per produce request, [0, 1]
	topic           string  // only requests that write to this topic; "" every topic
	seed            uint64
}

// dupMarker is the TimeoutMillis of the copies the broker writes to
// itself, so that a copy is not itself lost or duplicated again.
const dupMarker = 29_997

func (f produceFaults) validate() error {
	switch {
	case f.drop < 0 || f.drop > 1:
		return fmt.Errorf("--drop-produce %v: want a probability in [0, 1]", f.drop)
	case f.duplicate < 0 || f.duplicate > 1:
		return fmt.Errorf("--duplicate-produce %v: want a probability in [0, 1]", f.duplicate)
	case f.drop+f.duplicate > 1:
		return fmt.Errorf("--drop-produce %v + --duplicate-produce %v: more than 1", f.drop, f.duplicate)
	}
	return nil
}

func (f produceFaults) active() bool { return f.drop > 0 || f.duplicate > 0 }

// install adds the control function to c, which listens on addr; the
// returned stop ends the duplicating client. It logs what it did to
// stderr every minute and at stop.
func (f produceFaults) install(c *kfake.Cluster, addr string, stderr io.Writer) (stop func(), err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DisableIdempotentWrite(),
		// Produce by topic name, as kafka-go does (v13 and later name
		// topics by ID, which the copied request does not carry).
		kgo.MaxVersions(kversion.V3_6_0()))
	if err != nil {
		return nil, fmt.Errorf("duplicating client: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	dups := make(chan *kmsg.ProduceRequest, 256)
	var wg sync.WaitGroup
	wg.Go(func() {
		for req := range dups {
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			resp, err := cl.Request(rctx, req)
			rcancel()
			if err == nil {
				err = produceError(resp)
			}
			if err != nil && ctx.Err() == nil {
				fmt.Fprintln(stderr, "devkafka: duplicate write failed:", err)
			}
		}
	})
	rng := rand.New(rand.NewPCG(f.seed, 0x9e3779b97f4a7c15))
	var mu sync.Mutex
	var seen, dropped, duplicated int64
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		if req.TimeoutMillis == dupMarker || !f.writes(req) {
			return nil, nil, false
		}
		mu.Lock()
		defer mu.Unlock()
		seen++
		u := rng.Float64()
		switch {
		case u < f.drop:
			dropped++
			return acknowledged(req), nil, true
		case u < f.drop+f.duplicate:
			cp := *req
			cp.TimeoutMillis = dupMarker
			select {
			case dups <- &cp:
				duplicated++
			default: // the copier is behind; this one is not duplicated
			}
		}
		return nil, nil, false
	})
	report := func() {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stderr, "devkafka: produce faults: %d requests to %q, %d lost, %d duplicated\n", seen, f.topic, dropped, duplicated)
	}
	wg.Go(func() {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				report()
			}
		}
	})
	return func() {
		report()
		cancel()
		close(dups)
		wg.Wait()
		cl.Close()
	}, nil
}

// writes reports whether req writes to the faults' topic.
func (f produceFaults) writes(req *kmsg.ProduceRequest) bool {
	if f.topic == "" {
		return true
	}
	for _, t := range req.Topics {
		if t.Topic == f.topic {
			return true
		}
	}
	return false
}

// acknowledged is the response of a write that succeeded, for every
// partition of req (nothing is stored).
func acknowledged(req *kmsg.ProduceRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, t := range req.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = p.Partition
			rt.Partitions = append(rt.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// produceError is the first partition error of a produce response.
func produceError(resp kmsg.Response) error {
	pr, ok := resp.(*kmsg.ProduceResponse)
	if !ok {
		return fmt.Errorf("unexpected response %T", resp)
	}
	for _, t := range pr.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("%s[%d]: %w", t.Topic, p.Partition, err)
			}
		}
	}
	return nil
}
