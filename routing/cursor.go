package routing

import (
	"encoding/binary"

	"github.com/kvroute/kvroute/routing/state"
)

// Cursor is a shared round-robin counter: every VM and every request advances the
// same count, so consecutive placements go to consecutive targets fleet-wide.
type Cursor struct {
	store   state.Store
	key     string
	retries int
}

const cursorFormat = 1

// NewCursor returns the cursor named name under namespace.
func NewCursor(s state.Store, namespace, name string, retries int) *Cursor {
	return &Cursor{store: s, key: namespace + "/rr/" + name, retries: retries}
}

// Next returns the cursor's value before advancing it by one.
func (c *Cursor) Next() (uint64, error) {
	var n uint64
	err := state.Update(c.store, c.key, c.retries, func(old []byte) ([]byte, bool) {
		n = 0
		if len(old) == 9 && old[0] == cursorFormat {
			n = binary.LittleEndian.Uint64(old[1:])
		}
		next := make([]byte, 1, 9)
		next[0] = cursorFormat
		return binary.LittleEndian.AppendUint64(next, n+1), true
	})
	return n, err
}
