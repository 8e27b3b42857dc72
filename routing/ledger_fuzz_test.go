package routing

import (
	"testing"

	"github.com/kvroute/kvroute/routing/state"
)

// FuzzLedgerValue feeds arbitrary bytes to a VM as the shared ledger key (a torn or
// foreign value): reading it, flushing a batch into it and reading back never panic,
// a first chunk reads the progress the view shows, and what a flush writes decodes,
// with this VM's sighting in it unless the value fed carried one of its own.
func FuzzLedgerValue(f *testing.F) {
	full := encodeLedger([]ledgerEntry{{target: 7, written: 512, since: 1e6, chunk: 1e6, rateTok: 900,
		rateMS: 100, recent: 512, recentSent: 3, recentEpoch: 15, cache: 4096, fullRunning: 16, fullAt: 1e6,
		slots: []ledgerSlot{{epoch: 13, requests: 2, prefills: 1, tokens: 300, prefill: 40}}}}, nil)
	f.Add(full)
	f.Add(full[:len(full)-5])
	f.Add([]byte{ledgerFormat})
	f.Add([]byte{ledgerFormat - 1, 1, 2, 3})
	f.Fuzz(func(t *testing.T, v []byte) {
		const now = 1_000_000
		store := state.NewMemoryStore()
		if err := store.Set("ns/load/decode", v, 0); err != nil {
			t.Skip()
		}
		l := NewLoadLedger(store, "ns", "decode", 600000, 8)
		index := func(id uint64) int {
			if id == 7 {
				return 0
			}
			return -1
		}
		got := make([]Load, 1)
		if err := l.LoadsInto(now, index, got); err != nil {
			t.Fatal(err)
		}
		if chunk, rateTok, rateMS, cache := l.progressOf(7); chunk != got[0].Chunk || rateTok != got[0].RateTokens || rateMS != got[0].RateMS || cache != got[0].Cache {
			t.Fatalf("a first chunk reads %d %d/%d cache %d where the view shows %d %d/%d cache %d",
				chunk, rateTok, rateMS, cache, got[0].Chunk, got[0].RateTokens, got[0].RateMS, got[0].Cache)
		}
		if _, err := l.SeenFull(7, 16, now), l.SeenFull(7, 17, now+1); err != nil {
			t.Fatal(err)
		}
		if _, err := l.AcquireQueued(7, 100, 50, now, now); err != nil {
			t.Fatal(err)
		}
		if err := l.Flush(now + 1); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Snapshot(now + 1); err != nil {
			t.Fatal(err)
		}
		written, _, err := store.Get("ns/load/decode")
		if err != nil {
			t.Fatal(err)
		}
		entries := decodeLedger(written, l.oldestLiveEpoch(now+1), now+1)
		if len(entries) == 0 {
			t.Fatalf("the flush wrote %x, which decodes to nothing", written)
		}
		if len(v) > 0 && v[0] == ledgerFormat {
			return // a value of this format may carry a later sighting of its own
		}
		for _, e := range entries {
			if e.target == 7 && e.fullRunning != 17 {
				t.Fatalf("target 7 seen full at %d running, want the later sighting's 17", e.fullRunning)
			}
		}
	})
}
