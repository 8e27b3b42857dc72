package main

import (
	"bytes"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readShape generates shape with seed and reads it back as the replayer does.
func readShape(t *testing.T, shape string, seed uint64) ([]MooncakeRecord, []byte) {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, writeShape(&buf, shape, seed))
	recs, err := ReadMooncake(bytes.NewReader(buf.Bytes()), 0)
	require.NoError(t, err)
	for i := 1; i < len(recs); i++ {
		require.LessOrEqual(t, recs[i-1].Timestamp, recs[i].Timestamp, "arrival order")
	}
	return recs, buf.Bytes()
}

// byPrefix groups records by their first hash id.
func byPrefix(recs []MooncakeRecord) map[uint64][]MooncakeRecord {
	out := map[uint64][]MooncakeRecord{}
	for _, r := range recs {
		out[r.HashIDs[0]] = append(out[r.HashIDs[0]], r)
	}
	return out
}

func TestShapesAreDeterministicPerSeed(t *testing.T) {
	for shape := range shapes {
		_, a := readShape(t, shape, 1)
		_, b := readShape(t, shape, 1)
		_, c := readShape(t, shape, 2)
		assert.Equal(t, a, b, shape)
		assert.NotEqual(t, a, c, shape)
	}
	assert.Error(t, writeShape(&bytes.Buffer{}, "storms", 1))
}

func TestBurstsShareOnePrefixWithinTwoSeconds(t *testing.T) {
	recs, _ := readShape(t, "bursts", 3)
	bursts := 0
	for _, group := range byPrefix(recs) {
		if len(group) == 1 {
			assert.LessOrEqual(t, group[0].InputLength, 4000, "the background shares nothing")
			continue
		}
		bursts++
		require.Len(t, group, 80)
		first, last := group[0], group[len(group)-1]
		assert.Less(t, last.Timestamp-first.Timestamp, 2000.0)
		shared := 0
		for shared < len(first.HashIDs) && first.HashIDs[shared] == last.HashIDs[shared] {
			shared++
		}
		assert.GreaterOrEqual(t, shared, 8)
		assert.LessOrEqual(t, shared, 29)
	}
	assert.Equal(t, 10, bursts)
}

func TestDocumentsAndAppsShareTheirPrefixes(t *testing.T) {
	recs, _ := readShape(t, "documents", 4)
	docs := byPrefix(recs)
	require.Len(t, docs, 3)
	for _, qs := range docs {
		assert.Equal(t, qs[0].HashIDs[:196], qs[len(qs)-1].HashIDs[:196])
		assert.Greater(t, len(qs), 700)
	}
	recs, _ = readShape(t, "apps", 5)
	apps := byPrefix(recs)
	require.Len(t, apps, 20)
	counts := []int{}
	for _, qs := range apps {
		assert.Equal(t, qs[0].HashIDs[:16], qs[len(qs)-1].HashIDs[:16])
		counts = append(counts, len(qs))
	}
	// The most asked application is about 20 × the least (1/1 against 1/20).
	lo, hi := counts[0], counts[0]
	for _, c := range counts {
		lo, hi = min(lo, c), max(hi, c)
	}
	assert.Greater(t, hi, 10*lo)
}

func TestALibraryPublishesADocumentAMinute(t *testing.T) {
	recs, _ := readShape(t, "library", 3)
	require.Len(t, recs, 3000)
	docs := byPrefix(recs)
	require.Len(t, docs, 6)
	firsts := []float64{}
	for _, qs := range docs {
		first := qs[0].Timestamp
		for _, q := range qs {
			assert.Equal(t, qs[0].HashIDs[:150], q.HashIDs[:150])
			assert.GreaterOrEqual(t, q.Timestamp, first)
		}
		firsts = append(firsts, first)
	}
	sort.Float64s(firsts)
	// The k-th document is asked about only once published, at 60·k s, and a few
	// seconds after at most (7 questions a second over the k+1 published).
	for k, at := range firsts {
		assert.GreaterOrEqual(t, at, float64(60000*k), "document %d", k)
		assert.Less(t, at, float64(60000*k+10000), "document %d", k)
	}
}

func TestAgentsGrowTheirHistoryOnAFewToolPrompts(t *testing.T) {
	recs, _ := readShape(t, "agents", 6)
	tools := byPrefix(recs)
	require.Len(t, tools, 4, "every session starts with one of the 4 tool prompts")
	// The tool prompt is what every record of its group shares.
	toolLen := map[uint64]int{}
	for first, group := range tools {
		n := len(group[0].HashIDs)
		for _, r := range group {
			for n > 0 && (len(r.HashIDs) < n || r.HashIDs[n-1] != group[0].HashIDs[n-1]) {
				n--
			}
		}
		assert.GreaterOrEqual(t, n, 8)
		assert.LessOrEqual(t, n, 20)
		toolLen[first] = n
	}
	// A later turn's prompt holds an earlier turn's whole: the earlier prompt's
	// next-to-last block (its last may be partial) is at the same place in it.
	type at struct {
		pos int
		id  uint64
	}
	earlier := map[at]bool{}
	grown := 0
	for _, r := range recs {
		for p := toolLen[r.HashIDs[0]]; p < len(r.HashIDs); p++ {
			if earlier[at{p, r.HashIDs[p]}] {
				grown++
				break
			}
		}
		if n := len(r.HashIDs) - 2; n >= toolLen[r.HashIDs[0]] {
			earlier[at{n, r.HashIDs[n]}] = true
		}
	}
	// Sessions of 3–8 turns: about four in five turns follow one, fewer counted here
	// (a first turn with under two blocks of its own leaves no block to find).
	assert.Greater(t, grown, len(recs)*6/10, "turns that continue a history")
	assert.Less(t, grown, len(recs)*9/10)
}
