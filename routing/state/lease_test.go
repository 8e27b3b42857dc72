package state

import (
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLeaseHolderRenewalExpiry(t *testing.T) {
	s := NewMemoryStore()
	l := NewLease(s, "ns/engine/lease", 8)
	ok, err := l.TryAcquire(1, 1000, 3000)
	require.NoError(t, err)
	require.True(t, ok, "a free lease is taken")
	v, _, err := s.Get("ns/engine/lease")
	require.NoError(t, err)
	require.Len(t, v, leaseSize)
	require.Equal(t, byte(leaseFormat), v[0])

	ok, err = l.TryAcquire(2, 2000, 3000)
	require.NoError(t, err)
	require.False(t, ok, "another VM waits while the lease is held")

	ok, err = l.TryAcquire(1, 3500, 3000)
	require.NoError(t, err)
	require.True(t, ok, "the holder renews (until 6500)")
	ok, err = l.TryAcquire(2, 6499, 3000)
	require.NoError(t, err)
	require.False(t, ok, "renewal moved the expiry")

	ok, err = l.TryAcquire(2, 6500, 3000)
	require.NoError(t, err)
	require.True(t, ok, "an expired lease is taken over")
	ok, err = l.TryAcquire(1, 6600, 3000)
	require.NoError(t, err)
	require.False(t, ok, "the old holder lost it")

	// A holder whose own lease expired untouched takes it back like anyone.
	ok, err = l.TryAcquire(2, 20000, 3000)
	require.NoError(t, err)
	require.True(t, ok)

	// leaseMS <= 0 still excludes others for at least a millisecond.
	ok, err = l.TryAcquire(3, 30000, 0)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = l.TryAcquire(4, 30000, 0)
	require.NoError(t, err)
	require.False(t, ok)
}

func TestLeaseUnknownFormatIsFree(t *testing.T) {
	s := NewMemoryStore()
	require.NoError(t, s.Set("kvroute/engine/lease", []byte{7, 1, 2, 3}, 0))
	ok, err := NewLease(s, "kvroute/engine/lease", 8).TryAcquire(5, 0, 1000)
	require.NoError(t, err)
	require.True(t, ok)
}

func TestLeaseStoreErrors(t *testing.T) {
	hostDown := errors.New("host down")
	for _, bs := range []FailingStore{
		{Inner: NewMemoryStore(), GetErr: hostDown},
		{Inner: NewMemoryStore(), SetErr: hostDown},
		{Inner: NewMemoryStore(), SetErr: ErrCASMismatch},
	} {
		ok, err := NewLease(bs, "kvroute/engine/lease", 2).TryAcquire(1, 0, 1000)
		require.Error(t, err)
		require.False(t, ok, "no lease without a committed write")
	}
}

// leaseLog is a Store that records every successful write of the lease key in commit
// order (its own mutex serialises Set and the record).
type leaseLog struct {
	mu      sync.Mutex
	inner   *MemoryStore
	commits [][]byte
}

func (s *leaseLog) Get(key string) ([]byte, uint32, error) { return s.inner.Get(key) }

func (s *leaseLog) Set(key string, value []byte, cas uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.inner.Set(key, value, cas)
	if err == nil {
		s.commits = append(s.commits, append([]byte(nil), value...))
	}
	return err
}

// Many VMs contend for the lease on a shared clock. Whatever the interleaving, the
// committed history never hands an unexpired lease to another VM (at most one holder
// at any time), every TryAcquire that said yes is backed by its own commit, and the
// lease does change hands once it expires.
func TestLeaseContention(t *testing.T) {
	const (
		vms     = 16
		tries   = 300
		leaseMS = 40
	)
	s := &leaseLog{inner: NewMemoryStore()}
	var clock atomic.Int64
	var granted [vms]atomic.Int64
	var conflicts atomic.Int64
	var wg sync.WaitGroup
	for vm := 0; vm < vms; vm++ {
		wg.Add(1)
		go func(vm int) {
			defer wg.Done()
			l := NewLease(s, "kvroute/engine/lease", 4)
			for i := 0; i < tries; i++ {
				now := clock.Add(1)
				ok, err := l.TryAcquire(uint64(vm+1), now, leaseMS)
				if errors.Is(err, ErrStateConflict) {
					conflicts.Add(1)
					continue
				}
				require.NoError(t, err)
				if ok {
					granted[vm].Add(1)
				}
			}
		}(vm)
	}
	wg.Wait()

	commitsBy := map[uint64]int64{}
	var holder uint64
	var expires int64
	for i, c := range s.commits {
		require.Len(t, c, leaseSize)
		h := leUint64(c[1:])
		exp := int64(leUint64(c[9:]))
		now := exp - leaseMS
		if i > 0 && h != holder {
			require.GreaterOrEqualf(t, now, expires,
				"commit %d: VM %d took the lease at %d while VM %d held it until %d", i, h, now, holder, expires)
		}
		holder, expires = h, exp
		commitsBy[h]++
	}
	var holders []uint64
	for vm := 0; vm < vms; vm++ {
		require.Equal(t, granted[vm].Load(), commitsBy[uint64(vm+1)], "VM %d: grants and commits", vm+1)
		if commitsBy[uint64(vm+1)] > 0 {
			holders = append(holders, uint64(vm+1))
		}
	}
	sort.Slice(holders, func(i, j int) bool { return holders[i] < holders[j] })
	require.NotEmpty(t, holders)
	t.Logf("%d commits, holders %v, %d tries ended in a state conflict", len(s.commits), holders, conflicts.Load())
}

func leUint64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}
