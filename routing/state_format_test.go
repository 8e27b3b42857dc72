package routing

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/hashx"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// State format versioning (docs/behaviour.md, State): every value starts with a format
// byte, and a filter that meets a value of a format it does not know — an older or newer
// filter's state, or a torn value — treats the key as absent and writes it afresh. The old
// value must never be read as data: a mapping, a load, an ejection or a cursor position
// written in another format is ignored, not misread.

// sfUnknownFormats are format bytes this filter does not know.
var sfUnknownFormats = []byte{0, 2, 7, 0x7f, 0xff}

// sfConvBucket is a conversation bucket of format f holding one entry.
func sfConvBucket(f byte, fp, target uint64) []byte {
	v := []byte{f}
	v = binary.LittleEndian.AppendUint64(v, fp)
	return binary.LittleEndian.AppendUint64(v, target)
}

// sfLedger is a ledger value of format f: one target with one slot. It is written by
// the ledger's own encoder, its format byte then replaced: the format has one encoder.
func sfLedger(f byte, target uint64, epoch, requests, tokens int64) []byte {
	v := encodeLedger([]ledgerEntry{{target: target, slots: []ledgerSlot{{epoch: epoch, requests: requests, tokens: tokens}}}}, nil)
	v[0] = f
	return v
}

// sfHealth is a health value of format f ejecting endpoint until untilMS, written by
// the board's own encoder with its format byte replaced.
func sfHealth(f byte, endpoint uint64, untilMS int64) []byte {
	v := encodeHealth([]healthEntry{{endpoint: endpoint, ejectedUntil: untilMS}})
	v[0] = f
	return v
}

// sfCursor is a cursor value of format f at n.
func sfCursor(f byte, n uint64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{f}, n)
}

func sfStore(t *testing.T, s state.Store, key string, v []byte) {
	t.Helper()
	require.NoError(t, s.Set(key, v, 0))
}

func sfGet(t *testing.T, s state.Store, key string) []byte {
	t.Helper()
	v, _, err := s.Get(key)
	require.NoError(t, err, key)
	return v
}

func TestStateFormatConversationBucket(t *testing.T) {
	cfg := testConfig(t, `,"conversation":{"max_sessions":64}`)
	id := hashx.FingerprintString("conv-a")
	for _, f := range append([]byte{conversationFormat}, sfUnknownFormats...) {
		t.Run(fmt.Sprint("format ", f), func(t *testing.T) {
			store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
			r := NewRouter(cfg, store, clock.now)
			third := r.DecodeTargets()[2]
			key := r.decode.conv.key(id)
			sfStore(t, store, key, sfConvBucket(f, id, third.ID))
			d := r.Decide(convRequest("conv-a"), NoRank)
			require.False(t, d.StateFailed)
			_ = r.Release(d.Ticket)
			if f == conversationFormat {
				assert.Equal(t, KindSticky, d.Kind, "control: the known format is read")
				assert.Equal(t, third.ID, d.Target.ID)
				return
			}
			assert.Equal(t, KindNewConversation, d.Kind, "a mapping in an unknown format is absent")
			assert.Equal(t, r.DecodeTargets()[0].ID, d.Target.ID, "placed by the round robin from its start")
			v := sfGet(t, store, key)
			assert.Equal(t, byte(conversationFormat), v[0])
			assert.Len(t, v, 1+conversationEntryBytes, "the bucket was started afresh: only the new entry")
			d2 := r.Decide(convRequest("conv-a"), NoRank)
			assert.Equal(t, KindSticky, d2.Kind)
			assert.Equal(t, d.Target.ID, d2.Target.ID)
			_ = r.Release(d2.Ticket)
		})
	}
	t.Run("torn value", func(t *testing.T) {
		store := state.NewMemoryStore()
		r := NewRouter(cfg, store, (&fakeClock{ms: 1e6}).now)
		key := r.decode.conv.key(id)
		sfStore(t, store, key, sfConvBucket(conversationFormat, id, r.DecodeTargets()[2].ID)[:12])
		d := r.Decide(convRequest("conv-a"), NoRank)
		assert.Equal(t, KindNewConversation, d.Kind)
		assert.Len(t, sfGet(t, store, key), 1+conversationEntryBytes)
	})
}

func TestStateFormatLedger(t *testing.T) {
	cfg := testConfig(t, `,"prefix":{"enabled":false}`)
	// Formats 1 (no queued prefill tokens), 2 (no prefill progress), 3 (no recent
	// work) and 6 (no decode stays) are older filters': read as unknown.
	for _, f := range []byte{ledgerFormat, 0, 1, 2, 3, 6, 7, 0x7f, 0xff} {
		t.Run(fmt.Sprint("format ", f), func(t *testing.T) {
			store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
			r := NewRouter(cfg, store, clock.now)
			first := r.DecodeTargets()[0]
			key := "kvroute/load/decode"
			epoch := clock.ms / (cfg.State.LeaseMS / ledgerSlots)
			sfStore(t, store, key, sfLedger(f, first.ID, epoch, 1000, 1e6))
			if f == ledgerFormat {
				assert.Equal(t, int64(1000), ledgerTotal(t, r).Requests, "control: the known format is read")
				return
			}
			assert.Equal(t, Load{}, ledgerTotal(t, r), "load in an unknown format is absent")
			d := r.Decide(&extract.Request{Tokens: 10, Identity: 1}, NoRank)
			require.True(t, d.Ticket.Valid)
			require.NoError(t, r.FlushLoad())
			v := sfGet(t, store, key)
			assert.Equal(t, byte(ledgerFormat), v[0])
			assert.Len(t, v, 1+ledgerTargetHeader+ledgerSlotBytes, "rewritten fresh: only the new request")
			err := r.Release(d.Ticket)
			require.NoError(t, err)
			assert.Equal(t, Load{}, ledgerTotal(t, r))
		})
	}
	t.Run("torn value", func(t *testing.T) {
		store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
		r := NewRouter(cfg, store, clock.now)
		v := sfLedger(ledgerFormat, r.DecodeTargets()[0].ID, clock.ms/(cfg.State.LeaseMS/ledgerSlots), 5, 5)
		sfStore(t, store, "kvroute/load/decode", v[:len(v)-3])
		assert.Equal(t, Load{}, ledgerTotal(t, r))
		d := r.Decide(&extract.Request{Tokens: 10, Identity: 1}, NoRank)
		_ = r.Release(d.Ticket)
		assert.Equal(t, Load{}, ledgerTotal(t, r))
	})
}

func TestStateFormatHealth(t *testing.T) {
	cfg := testConfig(t, `,"prefix":{"enabled":false},"health":{"failure_threshold":1}`)
	for _, f := range append([]byte{healthFormat}, sfUnknownFormats...) {
		t.Run(fmt.Sprint("format ", f), func(t *testing.T) {
			store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
			r := NewRouter(cfg, store, clock.now)
			first := r.DecodeTargets()[0]
			key := "kvroute/health/decode"
			sfStore(t, store, key, sfHealth(f, hashx.FingerprintString(first.Address), clock.ms+1e6))
			seen := map[string]bool{}
			for i := 0; i < 30; i++ {
				d := r.Decide(&extract.Request{Tokens: 10, Identity: uint64(i)}, NoRank)
				seen[d.Target.Address] = true
				_ = r.Release(d.Ticket)
			}
			if f == healthFormat {
				assert.False(t, seen[first.Address], "control: the known format ejects")
				return
			}
			assert.True(t, seen[first.Address], "an ejection in an unknown format is absent")
			ejected, err := r.ReportHealth(first, false, true)
			require.NoError(t, err)
			assert.True(t, ejected)
			v := sfGet(t, store, key)
			assert.Equal(t, byte(healthFormat), v[0])
			assert.Len(t, v, 1+healthEntryBytes, "rewritten fresh: only the new record")
		})
	}
}

func TestStateFormatCursor(t *testing.T) {
	cfg := testConfig(t, `,"prefix":{"enabled":false}`)
	for _, f := range append([]byte{cursorFormat}, sfUnknownFormats...) {
		t.Run(fmt.Sprint("format ", f), func(t *testing.T) {
			store := state.NewMemoryStore()
			r := NewRouter(cfg, store, (&fakeClock{ms: 1e6}).now)
			key := "kvroute/rr/decode"
			sfStore(t, store, key, sfCursor(f, 2))
			d := r.Decide(convRequest("new"), NoRank)
			require.Equal(t, KindNewConversation, d.Kind)
			_ = r.Release(d.Ticket)
			if f == cursorFormat {
				assert.Equal(t, r.DecodeTargets()[2].ID, d.Target.ID, "control: the known format is read")
				return
			}
			assert.Equal(t, r.DecodeTargets()[0].ID, d.Target.ID, "a cursor in an unknown format starts at 0")
			assert.Equal(t, sfCursor(cursorFormat, 1), sfGet(t, store, key))
		})
	}
	t.Run("wrong length", func(t *testing.T) {
		store := state.NewMemoryStore()
		r := NewRouter(cfg, store, (&fakeClock{ms: 1e6}).now)
		sfStore(t, store, "kvroute/rr/decode", []byte{cursorFormat, 2})
		d := r.Decide(convRequest("new"), NoRank)
		assert.Equal(t, r.DecodeTargets()[0].ID, d.Target.ID)
		assert.Equal(t, sfCursor(cursorFormat, 1), sfGet(t, store, "kvroute/rr/decode"))
	})
}

// Every key of both pools holds a value of an unknown format at once (an upgraded
// filter meeting an old one's state): routing works from the first request, nothing
// old is read, and the ledger ends at zero.
func TestStateFormatEverythingOldAtOnce(t *testing.T) {
	cfg := testConfig(t, `,"conversation":{"max_sessions":64}`)
	store, clock := state.NewMemoryStore(), &fakeClock{ms: 1e6}
	r := NewRouter(cfg, store, clock.now)
	garbage := []byte{0xee, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	for _, pool := range []string{"decode", "prefill"} {
		for _, k := range []string{"load", "health", "rr"} {
			sfStore(t, store, "kvroute/"+k+"/"+pool, garbage)
		}
	}
	for b := uint64(0); b < r.decode.conv.buckets; b++ {
		hiKey := r.decode.conv.prefix + fmt.Sprint(b) // buckets < 10: base 36 = base 10
		sfStore(t, store, hiKey, garbage)
	}
	var tickets []LoadTicket
	for turn := 0; turn < 3; turn++ {
		for c := 0; c < 12; c++ {
			d := r.Decide(convRequest(fmt.Sprint("c", c)), NoRank)
			require.False(t, d.StateFailed)
			if turn == 0 {
				assert.Equal(t, KindNewConversation, d.Kind)
			} else {
				assert.Equal(t, KindSticky, d.Kind)
			}
			tickets = append(tickets, d.Ticket)
		}
	}
	for _, tk := range tickets {
		err := r.Release(tk)
		require.NoError(t, err)
	}
	assert.Equal(t, Load{}, ledgerTotal(t, r))
	for b := uint64(0); b < r.decode.conv.buckets; b++ {
		v := sfGet(t, store, r.decode.conv.prefix+fmt.Sprint(b))
		if v[0] != 0xee {
			assert.Equal(t, byte(conversationFormat), v[0])
			assert.Zero(t, (len(v)-1)%conversationEntryBytes)
		}
	}
}
