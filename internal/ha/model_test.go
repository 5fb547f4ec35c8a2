package ha

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// modelStore is a model of the JetStream lease bucket, for the tests:
// keys with revisions from one sequence, compare-and-set, delete markers
// and a max age, and the failures that matter:
//
//   - an election (noLeader): writes and leader reads are answered
//     ErrNoLeader at once, as nats-server answers while the stream has no
//     leader (no responders, or JSClusterNotAvailErr); a member listing
//     (a stream info request) gets no answer;
//   - an outage (down): every call hangs until its context ends, as a
//     request to a server that is gone;
//   - one client cut off (cut): the same, for that client only.
//
// Keys age out only while the store has a leader (the stream's leader
// expires them), maxAge after their last write.
type modelStore struct {
	mu       sync.Mutex
	seq      uint64
	keys     map[string]*modelEntry
	maxAge   time.Duration
	noLeader bool
	down     bool
	cut      map[string]bool
	// wake is closed when the store changes state, so that hanging calls
	// look again.
	wake chan struct{}
}

// noLeaderRetries is how long nats.go takes to answer a write "no
// response from stream" (jetstream.DefaultPubRetryAttempts x
// DefaultPubRetryWait).
const noLeaderRetries = 500 * time.Millisecond

type modelEntry struct {
	value   string
	rev     uint64
	deleted bool
	at      time.Time
}

func newModelStore(maxAge time.Duration) *modelStore {
	return &modelStore{keys: map[string]*modelEntry{}, maxAge: maxAge, cut: map[string]bool{}, wake: make(chan struct{})}
}

// client is one instance's connection to the store.
func (s *modelStore) client(name string) *modelClient { return &modelClient{s: s, name: name} }

func (s *modelStore) set(f func()) {
	s.mu.Lock()
	f()
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
}

func (s *modelStore) election(on bool) { s.set(func() { s.noLeader = on }) }
func (s *modelStore) outage(on bool)   { s.set(func() { s.down = on }) }
func (s *modelStore) cutOff(name string, on bool) {
	s.set(func() { s.cut[name] = on })
}

// lose empties the bucket, as a server that came back without its store;
// the revisions go on above the floor.
func (s *modelStore) lose() { s.set(func() { s.keys = map[string]*modelEntry{}; s.seq += 1000 }) }

// remove deletes key as an operator would (a delete marker).
func (s *modelStore) remove(key string) {
	s.set(func() {
		s.seq++
		s.keys[key] = &modelEntry{rev: s.seq, deleted: true, at: time.Now()}
	})
}

func (s *modelStore) holder(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.keys[key]; e != nil && !e.deleted {
		return e.value
	}
	return ""
}

type modelClient struct {
	s    *modelStore
	name string
}

// enter waits while the client cannot reach the store and returns with
// the store locked, or the context's error; it expires what aged out.
func (c *modelClient) enter(ctx context.Context) error {
	for {
		c.s.mu.Lock()
		if !c.s.down && !c.s.cut[c.name] {
			if !c.s.noLeader && c.s.maxAge > 0 {
				now := time.Now()
				for k, e := range c.s.keys {
					if now.Sub(e.at) > c.s.maxAge {
						delete(c.s.keys, k)
					}
				}
			}
			return nil
		}
		wake := c.s.wake
		c.s.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("model: %w", ctx.Err())
		case <-wake:
		}
	}
}

func (c *modelClient) write(ctx context.Context, key, value string, check func(e *modelEntry) error, deleted bool) (uint64, error) {
	if err := c.enter(ctx); err != nil {
		return 0, err
	}
	if c.s.noLeader {
		// nats.go tries a publish that found no responders twice more,
		// 250 ms apart, before it answers "no response from stream".
		c.s.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("model: %w", ctx.Err())
		case <-time.After(noLeaderRetries):
		}
		return 0, ErrNoLeader
	}
	defer c.s.mu.Unlock()
	if err := check(c.s.keys[key]); err != nil {
		return 0, err
	}
	c.s.seq++
	c.s.keys[key] = &modelEntry{value: value, rev: c.s.seq, deleted: deleted, at: time.Now()}
	return c.s.seq, nil
}

func (c *modelClient) Read(ctx context.Context, key string) (Entry, error) {
	if err := c.enter(ctx); err != nil {
		return Entry{}, err
	}
	defer c.s.mu.Unlock()
	if c.s.noLeader {
		return Entry{}, ErrNoLeader
	}
	e := c.s.keys[key]
	if e == nil {
		return Entry{}, ErrNotFound
	}
	return Entry{Value: e.value, Revision: e.rev, Deleted: e.deleted}, nil
}

func (c *modelClient) Create(ctx context.Context, key, value string) (uint64, error) {
	return c.write(ctx, key, value, func(e *modelEntry) error {
		if e != nil && !e.deleted {
			return fmt.Errorf("%w: key exists", ErrRefused)
		}
		return nil
	}, false)
}

func (c *modelClient) Update(ctx context.Context, key, value string, rev uint64) (uint64, error) {
	return c.write(ctx, key, value, func(e *modelEntry) error {
		if e == nil || e.rev != rev {
			last := uint64(0)
			if e != nil {
				last = e.rev
			}
			return fmt.Errorf("%w: wrong last sequence: %d", ErrRefused, last)
		}
		return nil
	}, false)
}

func (c *modelClient) Delete(ctx context.Context, key string, rev uint64) error {
	_, err := c.write(ctx, key, "", func(e *modelEntry) error {
		if rev != 0 && (e == nil || e.rev != rev) {
			return fmt.Errorf("%w: wrong last sequence", ErrRefused)
		}
		return nil
	}, true)
	return err
}

func (c *modelClient) Put(ctx context.Context, key, value string) (uint64, error) {
	return c.write(ctx, key, value, func(*modelEntry) error { return nil }, false)
}

// Members waits out an election, as the stream info request behind it
// does (nobody answers it without a stream leader).
func (c *modelClient) Members(ctx context.Context, prefix string) (map[string]string, error) {
	for {
		if err := c.enter(ctx); err != nil {
			return nil, err
		}
		if !c.s.noLeader {
			break
		}
		wake := c.s.wake
		c.s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("model: %w", ctx.Err())
		case <-wake:
		}
	}
	defer c.s.mu.Unlock()
	out := map[string]string{}
	for k, e := range c.s.keys {
		if strings.HasPrefix(k, prefix) && !e.deleted {
			out[k] = e.value
		}
	}
	return out, nil
}

func (c *modelClient) Ensure(context.Context) error { return nil }
