package routing

import (
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

func TestFairShareCapFormula(t *testing.T) {
	// cap = max(1, ceil(m × ceil((active+1)/n)))
	cases := []struct {
		m      float64
		active int64
		n      int
		want   int64
	}{
		{1.0, 0, 3, 1}, {1.0, 2, 3, 1}, {1.0, 3, 3, 2}, {1.0, 6, 3, 3},
		{2.0, 0, 3, 2}, {2.0, 2, 3, 2}, {2.0, 3, 3, 4}, {1.5, 3, 3, 3}, {1.5, 0, 4, 2},
		{1.0, 0, 0, 1},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, fairShareCap(c.m, c.active, c.n), "%+v", c)
	}
}

// capSequence sends turns of one conversation while every earlier request stays in
// flight, and returns the decision kinds.
func capSequence(t *testing.T, multiplier string, turns int) ([]string, []string) {
	cfg := testConfig(t, `,"balance":{"fair_share_multiplier":`+multiplier+`}`)
	r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	var kinds, targets []string
	for i := 0; i < turns; i++ {
		req := convRequest("a")
		req.Identity = uint64(i)
		d := r.Decide(req, NoRank)
		kinds = append(kinds, d.Kind.String())
		targets = append(targets, d.Target.Address)
	}
	return kinds, targets
}

func TestCapSequenceMultiplierOne(t *testing.T) {
	// Worked by hand, 3 targets, the conversation pinned to 10.0.0.1:
	// active 0: cap 1 → new (T0=1); 1: cap ceil(2/3)=1, T0 at cap → overflow;
	// 2: cap 1 → overflow to the last free target; 3: cap ceil(4/3)=2 → sticky (T0=2);
	// 4: cap 2 → overflow; 5: cap 2 → overflow; 6: cap ceil(7/3)=3 → sticky.
	kinds, targets := capSequence(t, "1.0", 7)
	assert.Equal(t, []string{"new-conversation", "overflow", "overflow", "sticky", "overflow", "overflow", "sticky"}, kinds)
	for _, i := range []int{0, 3, 6} {
		assert.Equal(t, "10.0.0.1:8000", targets[i], "turn %d returns to its mapping", i)
	}
	assert.ElementsMatch(t, []string{"10.0.0.2:8000", "10.0.0.3:8000"}, targets[1:3])
	assert.ElementsMatch(t, []string{"10.0.0.2:8000", "10.0.0.3:8000"}, targets[4:6])
}

func TestCapSequenceMultiplierTwo(t *testing.T) {
	// active 0: cap 2 → new (T0=1); 1: cap 2 → sticky (T0=2); 2: cap 2 → overflow;
	// 3: cap 2×ceil(4/3)=4 → sticky (3); 4: cap 4 → sticky (4); 5: cap 2×2=4 → overflow;
	// 6: cap 2×ceil(7/3)=6 → sticky.
	kinds, _ := capSequence(t, "2.0", 7)
	assert.Equal(t, []string{"new-conversation", "sticky", "overflow", "sticky", "sticky", "overflow", "sticky"}, kinds)
}

func TestLeastLoadedFirstTurnAvoidsBusyTarget(t *testing.T) {
	for _, metric := range []string{"requests", "tokens"} {
		t.Run(metric, func(t *testing.T) {
			cfg := testConfig(t, `,"conversation":{"first_turn":"least_loaded"},"balance":{"load_metric":"`+metric+`","fair_share_multiplier":100}`)
			r := NewRouter(cfg, state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
			// Load 10.0.0.1 with anonymous work pinned there through a trusted id.
			busy := NewPoolTargets(cfg.Pools.Decode).Targets[0]
			for i := 0; i < 5; i++ {
				_, err := r.decode.ledger.Acquire(busy.ID, 1000, 1e6)
				require.NoError(t, err)
			}
			for i := 0; i < 20; i++ {
				d := r.Decide(convRequest(fmt.Sprint("n", i)), NoRank)
				assert.Equal(t, KindNewConversation, d.Kind)
				assert.NotEqual(t, busy.Address, d.Target.Address, "conversation %d", i)
				err := r.Release(d.Ticket)
				require.NoError(t, err)
			}
		})
	}
}

func TestTieBreakIsDeterministicAcrossRouters(t *testing.T) {
	// Same inputs, separate stores (two gateway replicas): the same choice.
	a := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	b := NewRouter(testConfig(t, ""), state.NewMemoryStore(), (&fakeClock{ms: 1e6}).now)
	spread := map[string]bool{}
	for i := 0; i < 50; i++ {
		req := &extract.Request{Tokens: 100, Identity: hashx.FingerprintString(fmt.Sprint("req-", i))}
		da, db := a.Decide(req, NoRank), b.Decide(req, NoRank)
		assert.Equal(t, da.Target.ID, db.Target.ID)
		spread[da.Target.Address] = true
		_ = a.Release(da.Ticket)
		_ = b.Release(db.Ticket)
	}
	assert.Len(t, spread, 3, "the seeded shuffle spreads idle-fleet ties")
}

func TestLedgerReleaseAndLeaseExpiry(t *testing.T) {
	clock := &fakeClock{ms: 1_000_000}
	cfg := testConfig(t, `,"state":{"lease_ms":8000}`)
	r := NewRouter(cfg, state.NewMemoryStore(), clock.now)
	d1 := r.Decide(&extract.Request{Tokens: 40, Identity: 1}, NoRank)
	d2 := r.Decide(&extract.Request{Tokens: 60, Identity: 2}, NoRank)
	loads, err := r.Loads()
	require.NoError(t, err)
	assert.Equal(t, int64(2), total(loads).Requests)
	assert.Equal(t, int64(100), total(loads).Tokens)
	require.NoError(t, r.Release(d1.Ticket))
	loads, err = r.Loads()
	require.NoError(t, err)
	assert.Equal(t, int64(1), total(loads).Requests)
	// d2's completion is lost: after the lease it no longer counts.
	clock.ms += 8000 + 1000
	loads, err = r.Loads()
	require.NoError(t, err)
	assert.Equal(t, Load{}, total(loads))
	require.NoError(t, r.FlushLoad())
	// A late release of an expired ticket takes nothing from newer load.
	d3 := r.Decide(&extract.Request{Tokens: 7, Identity: 3}, NoRank)
	err = r.Release(d2.Ticket)
	require.NoError(t, err)
	loads, _ = r.Loads()
	assert.Equal(t, Load{Requests: 1, Tokens: 7}, total(loads))
	_ = r.Release(d3.Ticket)
	loads, _ = r.Loads()
	assert.Equal(t, Load{}, total(loads))
}

func total(loads []Load) Load {
	var t Load
	for _, l := range loads {
		t.Requests += l.Requests
		t.Tokens += l.Tokens
	}
	return t
}

func TestLedgerHasNoLostUpdatesUnderConcurrency(t *testing.T) {
	store := state.NewMemoryStore()
	cfg := testConfig(t, `,"state":{"max_cas_retries":1000}`)
	const workers, each, kept = 8, 200, 5
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	var open []LoadTicket
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := NewRouter(cfg, store, (&fakeClock{ms: 1e6}).now) // one Router per VM
			var tickets []LoadTicket
			for i := 0; i < each; i++ {
				d := r.Decide(&extract.Request{Tokens: 10, Identity: uint64(w*each + i), Conversation: uint64(i), HasConversation: i%2 == 0}, NoRank)
				if !d.Ticket.Valid {
					mu.Lock()
					failed++
					mu.Unlock()
					continue
				}
				tickets = append(tickets, d.Ticket)
				if len(tickets) > kept {
					if err := r.Release(tickets[0]); err != nil {
						panic(err)
					}
					tickets = tickets[1:]
				}
			}
			if err := r.FlushLoad(); err != nil { // the tick
				panic(err)
			}
			mu.Lock()
			open = append(open, tickets...)
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	assert.Zero(t, failed)
	shared := func() Load {
		loads, err := NewRouter(cfg, store, (&fakeClock{ms: 1e6}).now).Loads()
		require.NoError(t, err)
		return total(loads)
	}
	assert.Equal(t, Load{Requests: workers * kept, Tokens: workers * kept * 10}, shared(),
		"every VM's batches landed: exactly the load still open")
	r := NewRouter(cfg, store, (&fakeClock{ms: 1e6}).now)
	for _, tk := range open {
		require.NoError(t, r.Release(tk))
	}
	require.NoError(t, r.FlushLoad())
	assert.Equal(t, Load{}, shared(), "every acquire was released exactly once")
}

func TestHealthEjectsAndRecovers(t *testing.T) {
	clock := &fakeClock{ms: 1_000_000}
	cfg := testConfig(t, `,"health":{"failure_threshold":3,"cooldown_ms":5000}`)
	r := NewRouter(cfg, state.NewMemoryStore(), clock.now)
	d := r.Decide(convRequest("pinned"), NoRank)
	bad := d.Target
	_ = r.Release(d.Ticket)
	for i := 0; i < 2; i++ {
		ej, err := r.ReportHealth(bad, false, true)
		require.NoError(t, err)
		assert.False(t, ej)
	}
	// A success resets the count.
	_, _ = r.ReportHealth(bad, false, false)
	for i := 0; i < 2; i++ {
		ej, _ := r.ReportHealth(bad, false, true)
		assert.False(t, ej)
	}
	ej, err := r.ReportHealth(bad, false, true)
	require.NoError(t, err)
	assert.True(t, ej, "third consecutive failure ejects")
	ej, _ = r.ReportHealth(bad, false, true)
	assert.False(t, ej, "an ejected endpoint is not ejected twice")

	// Its conversation is placed afresh; nothing new lands on it.
	d = r.Decide(convRequest("pinned"), NoRank)
	assert.Equal(t, KindNewConversation, d.Kind)
	assert.NotEqual(t, bad.Address, d.Target.Address)
	moved := d.Target
	_ = r.Release(d.Ticket)
	for i := 0; i < 30; i++ {
		d := r.Decide(&extract.Request{Tokens: 5, Identity: uint64(i)}, NoRank)
		assert.NotEqual(t, bad.Address, d.Target.Address)
		_ = r.Release(d.Ticket)
	}
	// The new mapping holds after the cooldown.
	clock.ms += 5001
	d = r.Decide(convRequest("pinned"), NoRank)
	assert.Equal(t, KindSticky, d.Kind)
	assert.Equal(t, moved.Address, d.Target.Address)
	seen := map[string]bool{}
	for i := 0; i < 30; i++ {
		d := r.Decide(&extract.Request{Tokens: 5, Identity: uint64(i)}, NoRank)
		seen[d.Target.Address] = true
		_ = r.Release(d.Ticket)
	}
	assert.True(t, seen[bad.Address], "after the cooldown the endpoint takes traffic again")
}

// A VM whose copy of the board is clean answers from it only while it is recent: an
// ejection another VM made is seen once the copy is older than healthCacheMS, as
// the read of a board with records is; a success on a clean board writes nothing.
func TestACleanBoardIsReadAgainWhenOld(t *testing.T) {
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1_000_000}
	cfg := testConfig(t, `,"health":{"failure_threshold":1}`)
	a, b := NewRouter(cfg, store, clock.now), NewRouter(cfg, store, clock.now)
	bad := a.DecodeTargets()[0]
	ej, err := a.ReportHealth(bad, false, false)
	require.NoError(t, err)
	require.False(t, ej)
	_, _, err = store.Get(a.decode.health.key)
	require.ErrorIs(t, err, state.ErrNotFound, "a success on a clean board writes nothing")
	d := a.Decide(&extract.Request{Tokens: 5}, NoRank) // a's copy: clean, recent
	_ = a.Release(d.Ticket)

	ej, err = b.ReportHealth(bad, false, true)
	require.NoError(t, err)
	require.True(t, ej)
	seen := func() bool {
		for i := 0; i < 12; i++ {
			d := a.Decide(&extract.Request{Tokens: 5, Identity: uint64(i)}, NoRank)
			_ = a.Release(d.Ticket)
			if d.Target.Address == bad.Address {
				return true
			}
		}
		return false
	}
	require.True(t, seen(), "within healthCacheMS a's clean copy stands")
	clock.ms += healthCacheMS
	require.False(t, seen(), "then a reads the board again and sees the ejection")
}

func TestAllEjectedStillRoutes(t *testing.T) {
	clock := &fakeClock{ms: 1_000_000}
	cfg := testConfig(t, `,"health":{"failure_threshold":1}`)
	r := NewRouter(cfg, state.NewMemoryStore(), clock.now)
	for _, tg := range r.DecodeTargets() {
		_, _ = r.ReportHealth(tg, false, true)
	}
	d := r.Decide(&extract.Request{Tokens: 5}, NoRank)
	assert.Equal(t, KindLoad, d.Kind)
	assert.NotEmpty(t, d.Target.Address)
}

// A VM sees its own changes at once; another VM sees them once they are written — at
// the tick's flush, or when the batch fills.
func TestLedgerBatchesChangesPerVM(t *testing.T) {
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	cfg := testConfig(t, "")
	a, b := NewRouter(cfg, store, clock.now), NewRouter(cfg, store, clock.now)
	target := a.DecodeTargets()[0].ID
	tk, err := a.decode.ledger.Acquire(target, 100, clock.ms)
	require.NoError(t, err)
	assert.Equal(t, Load{Requests: 1, Tokens: 100}, ledgerTotal(t, a), "a VM's own change counts at once")
	assert.Equal(t, Load{}, ledgerTotal(t, b), "another VM sees it only once written")
	require.NoError(t, a.FlushLoad())
	require.NoError(t, b.FlushLoad())
	assert.Equal(t, Load{Requests: 1, Tokens: 100}, ledgerTotal(t, b))

	// A full batch is written without waiting for the tick.
	var tickets []LoadTicket
	for i := 1; i < ledgerBatch; i++ {
		tk, err := a.decode.ledger.Acquire(target, 1, clock.ms)
		require.NoError(t, err)
		tickets = append(tickets, tk)
	}
	require.NoError(t, b.FlushLoad())
	assert.Equal(t, int64(1), ledgerTotal(t, b).Requests, "one short of a full batch: not yet written")
	_, err = a.decode.ledger.Acquire(target, 1, clock.ms)
	require.NoError(t, err)
	require.NoError(t, b.FlushLoad())
	assert.Equal(t, int64(1+ledgerBatch), ledgerTotal(t, b).Requests, "a full batch is written at once")

	// Releases merge with acquires of the same slot in the batch.
	require.NoError(t, a.decode.ledger.Release(tk, clock.now))
	for _, tk := range tickets {
		require.NoError(t, a.decode.ledger.Release(tk, clock.now))
	}
	assert.Equal(t, Load{Requests: 1, Tokens: 1}, ledgerTotal(t, a))
	require.NoError(t, a.FlushLoad())
	require.NoError(t, b.FlushLoad())
	assert.Equal(t, Load{Requests: 1, Tokens: 1}, ledgerTotal(t, b))
}

// The flush drops expired slots from the stored value even when the VM has nothing
// to write, also from a target that still has live load.
func TestLedgerFlushDropsExpiredSlots(t *testing.T) {
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	cfg := testConfig(t, `,"state":{"lease_ms":8000}`)
	r := NewRouter(cfg, store, clock.now)
	target := r.DecodeTargets()[0].ID
	_, err := r.decode.ledger.Acquire(target, 5, clock.ms) // never released: its slot expires
	require.NoError(t, err)
	require.NoError(t, r.FlushLoad())
	clock.ms += 7000
	_, err = r.decode.ledger.Acquire(target, 7, clock.ms) // a live slot of the same target
	require.NoError(t, err)
	require.NoError(t, r.FlushLoad())
	full, _, err := store.Get("kvroute/load/decode")
	require.NoError(t, err)
	assert.Len(t, full, 1+ledgerTargetHeader+2*ledgerSlotBytes)
	clock.ms += 2000 // the first slot is now past the lease
	require.NoError(t, r.FlushLoad())
	swept, _, err := store.Get("kvroute/load/decode")
	require.NoError(t, err)
	assert.Len(t, swept, 1+ledgerTargetHeader+ledgerSlotBytes, "the expired slot is gone, the live one kept")
	assert.Equal(t, Load{Requests: 1, Tokens: 7}, ledgerTotal(t, r))
}

// candidates answers without its loop when no target is at the cap: it must give
// what the loop gives, whatever the loads and the cap.
func TestCandidatesAreTheTargetsUnderTheCap(t *testing.T) {
	for _, multiplier := range []string{"1", "1.5", "2"} {
		clock := &fakeClock{ms: 1e6}
		cfg := testConfig(t, `,"balance":{"fair_share_multiplier":`+multiplier+`},"prefix":{"enabled":false}`)
		r := NewRouter(cfg, state.NewMemoryStore(), clock.now)
		rng := rand.New(rand.NewSource(9))
		var open []LoadTicket
		for step := 0; step < 300; step++ {
			if len(open) > 0 && rng.Intn(3) == 0 {
				k := rng.Intn(len(open))
				require.NoError(t, r.Release(open[k]))
				open = append(open[:k], open[k+1:]...)
			} else {
				tg := r.DecodeTargets()[rng.Intn(len(r.DecodeTargets()))]
				tk, err := r.decode.ledger.Acquire(tg.ID, 10, clock.ms)
				require.NoError(t, err)
				open = append(open, tk)
			}
			v, err := r.view(r.decode, NoRank, clock.ms)
			require.NoError(t, err)
			var want []int
			for _, i := range v.eligible {
				if v.loads[i].Requests < v.cap {
					want = append(want, i)
				}
			}
			got, capped := v.candidates()
			if len(want) == 0 {
				require.True(t, capped, "step %d", step)
				require.Equal(t, v.eligible, got)
			} else {
				require.False(t, capped, "step %d", step)
				require.Equal(t, want, got, "step %d", step)
			}
		}
	}
}

func TestTheCapTightensWhileATargetWithFullSlotsHasStalled(t *testing.T) {
	// One endpoint, three ranks, each computing 10 tokens a ms. Ranks 0 and 1 each run
	// 16 requests past their first chunk, rank 2 has one request with 3000 tokens
	// queued: the cap is 24, the fair share 12. A small prompt costs least on rank 0 or
	// 1, where nothing is queued. When one more request on rank 1 has waited ten times
	// as long as its prefill takes, rank 1 has stalled with 16 running
	// (slotsFullRunning): the cap is the fair share, ranks 0 and 1 are past it, and the
	// prompt goes to rank 2. A rank that stalls running 15, or rank 2 stalled with its
	// one request, leaves the cap as it is.
	cases := []struct {
		name     string
		running1 int    // requests running on rank 1
		stalled  string // "": none
	}{
		{"nothing stalled", 16, ""},
		{"rank 1 stalled running 16", 16, "1"},
		{"rank 1 stalled running 15", 15, "1"},
		{"rank 2 stalled with one request", 16, "2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := config.ParseConfig([]byte(`{"pools":{"decode":{"endpoints":[{"address":"10.0.0.1:8000","dp_size":3}]}}}`))
			require.NoError(t, err)
			clock := &fakeClock{ms: 1e6}
			r := NewRouter(&cfg, state.NewMemoryStore(), clock.now)
			rng := rand.New(rand.NewSource(11))
			id := uint64(0)
			send := func(tokens, rank int) Decision {
				id++
				d := r.Decide(textRequest(words(rng, 4*tokens), id), rank)
				require.Equal(t, rank, d.Target.Rank)
				return d
			}
			for rank := 0; rank < 3; rank++ {
				d := send(1000, rank)
				clock.ms += 100
				require.NoError(t, r.FirstChunk(&d.Ticket))
				require.NoError(t, r.Release(d.Ticket))
			}
			if c.stalled == "2" {
				send(3000, 2)
				clock.ms += 3000
			}
			for rank, running := range []int{16, c.running1} {
				for i := 0; i < running; i++ {
					d := send(100, rank)
					clock.ms += 10
					require.NoError(t, r.FirstChunk(&d.Ticket))
				}
			}
			if c.stalled == "1" {
				send(100, 1)
			}
			clock.ms += 100
			if c.stalled != "2" {
				send(3000, 2)
			}
			clock.ms++
			d := r.Decide(textRequest(words(rng, 400), 100), NoRank)
			if c.stalled == "1" && c.running1 >= slotsFullRunning {
				assert.Equal(t, 2, d.Target.Rank, "ranks 0 and 1 are past the fair share")
				assert.Equal(t, KindLoad, d.Kind)
				return
			}
			assert.NotEqual(t, 2, d.Target.Rank, "the cap stays at twice the fair share")
		})
	}
}
