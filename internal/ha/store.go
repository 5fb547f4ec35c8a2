package ha

import (
	"context"
	"errors"
)

// Store is the lease store: a key-value bucket with compare-and-set writes
// (JetStream KV in production, JetStreamStore; a model of it in the tests).
// Every write may fail three ways, which the leases tell apart:
//
//   - ErrRefused: the store answered and refused the write (the key's
//     revision is not the one expected, or Create found a value);
//   - ErrNoLeader: the store answered that nobody can write now (the stream
//     has no leader: an election). No other instance can write either;
//   - any other error: no answer (a timeout, a lost connection). Nothing is
//     known of what others can do.
type Store interface {
	// Read returns key's last entry as the store's leader has it (not a
	// replica that may lag): ErrNotFound when the key has no entry at all,
	// ErrNoLeader while the store has no leader to answer.
	Read(ctx context.Context, key string) (Entry, error)
	// Create writes key when it has no value (no entry, or a delete
	// marker) and returns the new revision.
	Create(ctx context.Context, key, value string) (uint64, error)
	// Update writes key if its last revision is rev.
	Update(ctx context.Context, key, value string, rev uint64) (uint64, error)
	// Delete leaves a delete marker on key if its last revision is rev:
	// whoever reads it next knows the key was released.
	Delete(ctx context.Context, key string, rev uint64) error
	// Put writes key whatever it holds.
	Put(ctx context.Context, key, value string) (uint64, error)
	// Members returns the value of every key that starts with prefix.
	Members(ctx context.Context, prefix string) (map[string]string, error)
	// Ensure makes the store's resources again when the server lost them
	// (called after a reconnect, or when an operation got no answer).
	Ensure(ctx context.Context) error
}

// Entry is one key's last entry.
type Entry struct {
	Value    string
	Revision uint64
	// Deleted is a delete or purge marker: the key was released.
	Deleted bool
}

// Errors of a Store that the leases branch on.
var (
	// ErrRefused is a write the store answered and refused.
	ErrRefused = errors.New("ha: refused by the lease store")
	// ErrNoLeader is the store's answer that it has no leader now.
	ErrNoLeader = errors.New("ha: the lease store has no leader")
	// ErrNotFound is a read of a key without any entry.
	ErrNotFound = errors.New("ha: no such lease key")
)

// answered reports whether err is an answer of the store (a refusal, or
// "no leader"), as opposed to no answer at all.
func answered(err error) bool {
	return errors.Is(err, ErrRefused) || errors.Is(err, ErrNoLeader) || errors.Is(err, ErrNotFound)
}

// Subscription is a partition's subscription (a *nats.Subscription).
type Subscription interface {
	Unsubscribe() error
	// Dropped is how many messages the subscription dropped because its
	// consumer fell behind.
	Dropped() (int, error)
}
