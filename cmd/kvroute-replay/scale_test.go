package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseScale(t *testing.T) {
	sp, err := parseScale("start=2, at=50%:+2, at=90s:-1")
	require.NoError(t, err)
	s, err := sp.resolve(100_000)
	require.NoError(t, err)
	assert.Equal(t, &Schedule{Start: 2, Steps: []ScaleStep{{50_000, 4}, {90_000, 3}}}, s)
	assert.Equal(t, 4, s.Max())
	assert.Equal(t, 2, s.At(49_999))
	assert.Equal(t, 4, s.At(50_000))
	assert.Equal(t, 3, s.At(95_000))

	for _, bad := range []string{"", "start=0,at=1:+1", "start=2", "start=2,at=10:3", "start=2,at=150%:+1", "start=2,at=x:+1", "size=2"} {
		_, err := parseScale(bad)
		assert.Error(t, err, bad)
	}
	sp, err = parseScale("start=2,at=10:-2")
	require.NoError(t, err)
	_, err = sp.resolve(100)
	assert.ErrorContains(t, err, "shrinks to 0")
}

// scaledTestReplay replays the first n requests of the Mooncake trace on a fleet that
// starts with 2 endpoints × dp 2 and gains 2 at half the replay, through kvroute.
func scaledTestReplay(t *testing.T, n int, discover, instant bool) ([]*Request, FleetConfig, *Schedule, *Result, *discoveryHost) {
	t.Helper()
	wasm, err := os.ReadFile(testWasm)
	require.NoError(t, err, "run `make build` first")
	reqs, _, err := loadTrace(testTrace, "auto", n, 4, 1)
	require.NoError(t, err)
	sp, err := parseScale("start=2,at=50%:+2")
	require.NoError(t, err)
	sched, err := sp.resolve(reqs[len(reqs)-1].ArrivalMS)
	require.NoError(t, err)
	fleet := FleetConfig{Endpoints: sched.Max(), DPSize: 2, CacheTokens: 64 * MooncakeBlockTokens,
		PrefillMSPerToken: defaultPrefillMS, DecodeMSPerToken: defaultDecodeMS, MaxRunning: defaultMaxRunning}
	start := fleet
	start.Endpoints = sched.Start
	config, err := replayConfig(testConfig, start)
	require.NoError(t, err)
	if discover {
		config, err = discoveryConfig(config, fleet, 1000)
		require.NoError(t, err)
	}
	res, d, err := replayKVRouteScaled(reqs, fleet, sched, wasm, config, "", discover, instant, 1000)
	require.NoError(t, err)
	assert.Empty(t, res.Notes, "nothing failed, leaked or failed open")
	return reqs, fleet, sched, res, d
}

// TestScaledReplayRoutesToJoiningPodsAfterThePoll: kvroute with discovery and no
// static endpoint sends nothing to the pods that join before they join, and sends
// them requests once its first poll after the join has found them — and a static
// configuration never does.
func TestScaledReplayRoutesToJoiningPodsAfterThePoll(t *testing.T) {
	reqs, fleet, sched, res, d := scaledTestReplay(t, 400, true, false)
	at := sched.Steps[0].AtMS
	firstPoll := -1.0
	for _, p := range d.PollAt {
		if p >= at {
			firstPoll = p
			break
		}
	}
	require.GreaterOrEqual(t, firstPoll, at, "a poll after the join: %v", d.PollAt)
	assert.Less(t, firstPoll, at+2000, "polls keep the interval in replay time")
	assert.Zero(t, d.LatePolls)
	joining, afterPoll := 0, 0
	for _, r := range reqs {
		tg := res.Choices[r.Index]
		if tg < sched.Start*fleet.DPSize {
			continue
		}
		require.GreaterOrEqual(t, r.ArrivalMS, firstPoll, "request %d went to joining target %d before the poll found it", r.Index, tg)
		joining++
		if r.ArrivalMS < firstPoll+60_000 {
			afterPoll++
		}
	}
	assert.Greater(t, afterPoll, 0, "the joining pods get requests within a minute of the poll")
	assert.Greater(t, joining, len(reqs)/10, "the joining pods take a share of the second half")
	assert.Zero(t, res.Departed)

	// Without discovery the filter keeps its start pods.
	_, _, _, static, _ := scaledTestReplay(t, 400, false, false)
	for i, tg := range static.Choices {
		assert.Less(t, tg, sched.Start*fleet.DPSize, "request %d: a static kvroute knows only its start pods", i)
	}

	// Told at once, the first request after the join may already go there.
	reqs, fleet, sched, res, _ = scaledTestReplay(t, 400, true, true)
	lag, early := joinLag(reqs, res, fleet, sched)
	assert.Zero(t, early)
	assert.GreaterOrEqual(t, lag, 0.0)
}
