package routing

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/routing/extract"
	"github.com/kvroute/kvroute/routing/state"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regression tests of faults the reliability suite found.

// Token estimates of math.MaxInt64 (a client's content-length) made the ledger's
// token sums wrap to negative, and the cost then drew ordinary traffic to the wrapped
// target. Decisions now bound the estimate; releases bring the ledger back to zero.
func TestLedgerTokensNeverWrap(t *testing.T) {
	clock := &fakeClock{ms: 1e6}
	r := NewRouter(testConfig(t, `,"prefix":{"enabled":false}`), state.NewMemoryStore(), clock.now)
	var tickets []LoadTicket
	for i := 0; i < 8; i++ {
		tickets = append(tickets, r.Decide(&extract.Request{Tokens: math.MaxInt64, Identity: uint64(i)}, NoRank).Ticket)
	}
	for i := 0; i < 30; i++ {
		tickets = append(tickets, r.Decide(&extract.Request{Tokens: 100, Identity: uint64(100 + i)}, NoRank).Ticket)
		loads, err := r.Loads()
		require.NoError(t, err)
		for j, l := range loads {
			require.GreaterOrEqual(t, l.Tokens, int64(0), "target %d after request %d", j, i)
		}
	}
	for _, tk := range tickets {
		require.True(t, tk.Valid)
		err := r.Release(tk)
		require.NoError(t, err)
	}
	assert.Equal(t, Load{}, ledgerTotal(t, r))
}
