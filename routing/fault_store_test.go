package routing

import (
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/routing/config"
	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Fault injection through the Store interface: when shared state fails the request is
// decided without it, and the filter's own faults never fail a request. proxy-wasm
// shared-data errors cannot be injected through the SDK host emulator when the filter runs
// as compiled wasm, so the host's failures are modelled here, one layer down, where the
// filter's store (internal/shareddata) hands them to the Router unchanged.

// errInjected stands for any host error of proxy_get_shared_data/proxy_set_shared_data.
var errInjected = errors.New("injected host error")

// faultStore wraps a Store and fails calls on demand. A failed call never reaches the
// inner store, as a host error leaves shared data unchanged.
type faultStore struct {
	inner state.Store

	mu          sync.Mutex
	getErr      error // returned by every Get while set
	setErr      error // returned by every Set while set
	casConflict bool  // every Set fails with ErrCASMismatch: another VM always wins
	failEvery   int   // > 0: every failEvery-th call (Get or Set) fails with errInjected

	calls, gets, sets, failures int
}

func newFaultStore() *faultStore { return &faultStore{inner: state.NewMemoryStore()} }

func (f *faultStore) Get(key string) ([]byte, uint32, error) {
	f.mu.Lock()
	f.calls++
	f.gets++
	err := f.getErr
	if err == nil && f.failEvery > 0 && f.calls%f.failEvery == 0 {
		err = errInjected
	}
	if err != nil {
		f.failures++
	}
	f.mu.Unlock()
	if err != nil {
		return nil, 0, err
	}
	return f.inner.Get(key)
}

func (f *faultStore) Set(key string, value []byte, cas uint32) error {
	f.mu.Lock()
	f.calls++
	f.sets++
	err := f.setErr
	if err == nil && f.casConflict {
		err = state.ErrCASMismatch
	}
	if err == nil && f.failEvery > 0 && f.calls%f.failEvery == 0 {
		err = errInjected
	}
	if err != nil {
		f.failures++
	}
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.inner.Set(key, value, cas)
}

// heal stops every fault.
func (f *faultStore) heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.getErr, f.setErr, f.casConflict, f.failEvery = nil, nil, false, 0
}

func (f *faultStore) setCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sets
}

// faultConfigs are the router configurations every fault is tried under: prefix
// matching off and on, and each first-turn placement.
var faultConfigs = map[string]string{
	"prefix off":       `,"prefix":{"enabled":false}`,
	"prefix on":        ``,
	"first turn hash":  `,"conversation":{"first_turn":"hash"}`,
	"first turn least": `,"conversation":{"first_turn":"least_loaded"}`,
	"first turn score": `,"conversation":{"first_turn":"score"}`,
}

// faultRequest is request i of a mixed stream: half with one of 20 conversation ids,
// all with a prompt of a few blocks.
func faultRequest(i int) *extract.Request {
	req := &extract.Request{
		Model:      "m",
		Prompt:     []byte(fmt.Sprintf("user:%0200d", i%13)),
		BlockBytes: 64,
		Tokens:     50,
		Identity:   uint64(i) * 0x9e3779b97f4a7c15,
	}
	if i%2 == 0 {
		req.Conversation, req.HasConversation = hashx.FingerprintString(fmt.Sprint("conv-", i%20)), true
	}
	return req
}

// requireInPool fails unless d names a target of r's decode pool.
func requireInPool(t *testing.T, r *Router, d Decision) {
	t.Helper()
	for _, tg := range r.DecodeTargets() {
		if tg == d.Target {
			return
		}
	}
	t.Fatalf("decision %+v names a target outside the decode pool", d)
}

func ledgerTotal(t *testing.T, r *Router) Load {
	t.Helper()
	loads, err := r.Loads()
	require.NoError(t, err)
	return total(loads)
}

// sharedTotal is the load written to the shared ledger, as a fresh VM reads it.
func sharedTotal(t *testing.T, cfg *config.Config, s state.Store) Load {
	t.Helper()
	return ledgerTotal(t, NewRouter(cfg, s, (&fakeClock{ms: 1e6}).now))
}

func TestFaultGetErrorsFallBackWithoutState(t *testing.T) {
	for name, extra := range faultConfigs {
		t.Run(name, func(t *testing.T) {
			store, clock := newFaultStore(), &fakeClock{ms: 1e6}
			r := NewRouter(testConfig(t, extra), store, clock.now)
			store.getErr = errInjected
			spread := map[string]bool{}
			byConv := map[uint64]string{}
			for i := 0; i < 60; i++ {
				req := faultRequest(i)
				d := r.Decide(req, NoRank)
				requireInPool(t, r, d)
				assert.Equal(t, KindFallback, d.Kind)
				assert.True(t, d.StateFailed)
				assert.False(t, d.Ticket.Valid, "no ledger entry without state")
				if req.HasConversation {
					// Rendezvous hashing: every VM and replica agrees with no store.
					if prev, ok := byConv[req.Conversation]; ok {
						assert.Equal(t, prev, d.Target.Address)
					}
					byConv[req.Conversation] = d.Target.Address
				} else {
					spread[d.Target.Address] = true
				}
				err := r.Release(d.Ticket) // an invalid ticket touches nothing
				require.NoError(t, err)
			}
			assert.Len(t, spread, 3, "the VM-local round robin spreads requests without an id")
			_, err := r.ReportHealth(r.DecodeTargets()[0], false, true)
			assert.Error(t, err)
			assert.Error(t, r.FlushLoad())
			store.heal()
			assert.Equal(t, Load{}, ledgerTotal(t, r))
		})
	}
}

func TestFaultSetErrorsNeverBlockADecision(t *testing.T) {
	for name, extra := range faultConfigs {
		t.Run(name, func(t *testing.T) {
			store, clock := newFaultStore(), &fakeClock{ms: 1e6}
			cfg := testConfig(t, extra)
			r := NewRouter(cfg, store, clock.now)
			// Some state exists before the host starts refusing writes.
			for i := 0; i < 10; i++ {
				d := r.Decide(faultRequest(i), NoRank)
				require.NoError(t, r.Release(d.Ticket))
			}
			store.setErr = errInjected
			var held []LoadTicket
			failed := 0
			for i := 0; i < 60; i++ {
				req := faultRequest(i)
				d := r.Decide(req, NoRank)
				requireInPool(t, r, d)
				if d.StateFailed {
					failed++
				}
				if d.Kind == KindFallback {
					assert.True(t, d.StateFailed)
					assert.False(t, d.Ticket.Valid, "no load without state")
				} else {
					// Placed from what could be read; the load is held in the VM's batch.
					assert.Contains(t, []Kind{KindSticky, KindOverflow, KindLoad, KindPrefix, KindContinuation}, d.Kind)
					assert.True(t, d.Ticket.Valid)
					held = append(held, d.Ticket)
				}
				clock.ms++
			}
			assert.NotZero(t, failed, "refused writes are state failures")
			assert.Equal(t, int64(len(held)), ledgerTotal(t, r).Requests, "the VM counts what it could not write")
			// Writes work again: the kept batch lands, then the releases, exactly once.
			store.heal()
			require.NoError(t, r.FlushLoad())
			assert.Equal(t, int64(len(held)), sharedTotal(t, cfg, store).Requests)
			for _, tk := range held {
				_ = r.Release(tk)
			}
			require.NoError(t, r.FlushLoad())
			assert.Equal(t, Load{}, sharedTotal(t, cfg, store))
		})
	}
}

func TestFaultCASConflictOnEveryTry(t *testing.T) {
	for name, extra := range faultConfigs {
		t.Run(name, func(t *testing.T) {
			store, clock := newFaultStore(), &fakeClock{ms: 1e6}
			cfg := testConfig(t, extra)
			r := NewRouter(cfg, store, clock.now)
			var held []LoadTicket
			for i := 0; i < 10; i++ {
				d := r.Decide(faultRequest(i), NoRank)
				require.True(t, d.Ticket.Valid)
				held = append(held, d.Ticket)
			}
			store.casConflict = true
			retries := cfg.State.MaxCASRetries
			for i := 0; i < 40; i++ {
				before := store.setCalls()
				d := r.Decide(faultRequest(i), NoRank)
				requireInPool(t, r, d)
				if d.Ticket.Valid {
					held = append(held, d.Ticket)
				}
				// Bounded work: a decision makes a handful of updates, each giving up
				// after max_cas_retries.
				assert.LessOrEqual(t, store.setCalls()-before, 4*(retries+1), "request %d", i)
			}
			conflicts := 0
			for _, tk := range held {
				if err := r.Release(tk); err != nil {
					assert.ErrorIs(t, err, state.ErrStateConflict)
					conflicts++
				}
			}
			assert.NotZero(t, conflicts, "a full batch that cannot be written says so")
			assert.Equal(t, Load{}, ledgerTotal(t, r), "the VM's own view has every release")
			// The conflicts stop: the kept batch lands, each release exactly once.
			store.heal()
			require.NoError(t, r.FlushLoad())
			assert.Equal(t, Load{}, sharedTotal(t, cfg, store))
		})
	}
}

// A store that fails every Nth call, over a long mixed stream with releases
// interleaved: every decision names a pool target, a decision that reports no state
// failure carries a ticket, and once the faults stop, the kept batches land so the
// shared ledger ends at exactly zero — a failed write loses no change.
func TestFaultEveryNthCall(t *testing.T) {
	for _, n := range []int{2, 3, 5, 7, 11} {
		for name, extra := range faultConfigs {
			t.Run(fmt.Sprintf("every %d/%s", n, name), func(t *testing.T) {
				store, clock := newFaultStore(), &fakeClock{ms: 1e6}
				cfg := testConfig(t, extra+`,"state":{"lease_ms":8000,"max_cas_retries":2}`)
				r := NewRouter(cfg, store, clock.now)
				var held []LoadTicket
				for i := 0; i < 5; i++ { // acquired before the faults start
					d := r.Decide(faultRequest(i), NoRank)
					require.True(t, d.Ticket.Valid)
					held = append(held, d.Ticket)
				}
				store.failEvery = n
				rng := rand.New(rand.NewSource(int64(n)))
				var open []LoadTicket
				kinds := map[Kind]int{}
				for i := 0; i < 400; i++ {
					d := r.Decide(faultRequest(rng.Intn(1000)), NoRank)
					requireInPool(t, r, d)
					kinds[d.Kind]++
					if !d.StateFailed {
						assert.True(t, d.Ticket.Valid, "a decision without a state failure holds load")
					}
					if d.Kind == KindFallback {
						assert.True(t, d.StateFailed)
					}
					if d.Ticket.Valid {
						open = append(open, d.Ticket)
					}
					for len(open) > 0 && rng.Intn(3) == 0 {
						k := rng.Intn(len(open))
						tk := open[k]
						open = append(open[:k], open[k+1:]...)
						_ = r.Release(tk) // an error leaves the release in the batch
					}
					if i%50 == 0 {
						_ = r.FlushLoad()
						_, _ = r.ReportHealth(d.Target, false, rng.Intn(4) == 0)
					}
				}
				assert.NotZero(t, kinds[KindFallback], "some decisions fell back: %v", kinds)
				assert.NotZero(t, store.failures)
				store.heal()
				for _, tk := range append(held, open...) {
					_ = r.Release(tk)
				}
				require.NoError(t, r.FlushLoad())
				assert.Equal(t, Load{}, ledgerTotal(t, r))
				assert.Equal(t, Load{}, sharedTotal(t, cfg, store), "no change was lost to a failed write")
			})
		}
	}
}

// Faults that come and go: each fault kind in turn, between healthy phases, over one
// store. After the last, the ledger is back to zero.
func TestFaultPhasesLedgerReturnsToZero(t *testing.T) {
	store, clock := newFaultStore(), &fakeClock{ms: 1e6}
	cfg := testConfig(t, "")
	r := NewRouter(cfg, store, clock.now)
	phases := []func(){
		func() { store.getErr = errInjected },
		func() { store.setErr = errInjected },
		func() { store.casConflict = true },
		func() { store.failEvery = 4 },
	}
	var held []LoadTicket
	for p, start := range phases {
		for i := 0; i < 20; i++ { // healthy
			d := r.Decide(faultRequest(p*100+i), NoRank)
			require.True(t, d.Ticket.Valid)
			held = append(held, d.Ticket)
		}
		start()
		for i := 0; i < 20; i++ {
			d := r.Decide(faultRequest(p*100+i), NoRank)
			requireInPool(t, r, d)
			if d.Ticket.Valid {
				held = append(held, d.Ticket)
			}
		}
		store.heal()
	}
	for _, tk := range held {
		_ = r.Release(tk)
	}
	require.NoError(t, r.FlushLoad())
	assert.Equal(t, Load{}, ledgerTotal(t, r))
	assert.Equal(t, Load{}, sharedTotal(t, cfg, store))
}

// Several VMs over one faulty store at once (run with -race): once the faults stop
// and each VM has flushed its batch, the shared ledger holds exactly the load still
// open, and zero after its release.
func TestFaultConcurrentRoutersOverOneFaultyStore(t *testing.T) {
	store := newFaultStore()
	store.failEvery = 5
	cfg := testConfig(t, `,"state":{"max_cas_retries":2}`)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var survivors []LoadTicket
	routers := make([]*Router, 4)
	for w := range routers {
		routers[w] = NewRouter(cfg, store, (&fakeClock{ms: 1e6}).now)
		wg.Add(1)
		go func(w int, r *Router) {
			defer wg.Done()
			var open []LoadTicket
			for i := 0; i < 200; i++ {
				d := r.Decide(faultRequest(w*1000+i), NoRank)
				ok := false
				for _, tg := range r.DecodeTargets() {
					ok = ok || tg == d.Target
				}
				if !ok {
					panic(fmt.Sprintf("target outside the pool: %+v", d.Target))
				}
				if d.Ticket.Valid {
					open = append(open, d.Ticket)
				}
				if len(open) > 3 {
					_ = r.Release(open[0])
					open = open[1:]
				}
			}
			mu.Lock()
			survivors = append(survivors, open...)
			mu.Unlock()
		}(w, routers[w])
	}
	wg.Wait()
	store.heal()
	for _, r := range routers {
		require.NoError(t, r.FlushLoad())
	}
	assert.Equal(t, int64(len(survivors)), sharedTotal(t, cfg, store).Requests)
	r := NewRouter(cfg, store, (&fakeClock{ms: 1e6}).now)
	for _, tk := range survivors {
		_ = r.Release(tk)
	}
	require.NoError(t, r.FlushLoad())
	assert.Equal(t, Load{}, sharedTotal(t, cfg, store))
}
