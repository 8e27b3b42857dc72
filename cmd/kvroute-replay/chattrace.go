package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"

	"github.com/kvroute/kvroute/routing/hashx"
)

// A synthetic multi-turn chat trace in the replayer's OpenAI format, every request
// carrying its conversation id in x-session-id: what a gateway in front of a chat
// product sees, and what the Mooncake trace (no ids) cannot show. Made by
// `go run ./cmd/kvroute-replay -gen-chat -o testdata/replay/chat_sessions.jsonl`
// (deterministic: the same bytes on every run; chatTraceDefaults are the shipped
// file's settings).
//
//   - Conversations start as a Poisson process (StartsPerS); each has Turns turns.
//   - A turn is sent ThinkMinS + an exponential ThinkMeanS seconds after the previous
//     one (the user reads the answer and types: far longer than a reply takes to
//     stream, also at the -speed of the benchmarks).
//   - Each conversation belongs to one of Apps applications, each with its own system
//     prompt of SystemTokens tokens shared by its conversations.
//   - Turn k sends the whole history: the system prompt, the user messages and
//     assistant replies of turns 0..k-1, then user message k (uniform UserMin..UserMax
//     tokens). Its output_tokens (uniform ReplyMin..ReplyMax) is the length of the
//     assistant reply that turn k+1 carries, so the histories grow as they would.
//   - Text is plain words at CharsPerToken characters per token (the replayer's
//     vocabulary, seeded per message), so it needs no JSON escaping.
type chatTraceSpec struct {
	Conversations, Turns int
	StartsPerS           float64
	ThinkMinS            float64
	ThinkMeanS           float64
	Apps                 int
	SystemTokens         int
	UserMin, UserMax     int
	ReplyMin, ReplyMax   int
	CharsPerToken        int
	Seed                 uint64
}

// chatTraceDefaults made testdata/replay/chat_sessions.jsonl: 300 conversations × 6
// turns (1800 requests) over about 10 minutes; 4 applications.
var chatTraceDefaults = chatTraceSpec{
	Conversations: 300, Turns: 6,
	StartsPerS: 1, ThinkMinS: 20, ThinkMeanS: 20,
	Apps: 4, SystemTokens: 256,
	UserMin: 20, UserMax: 100, ReplyMin: 40, ReplyMax: 160,
	CharsPerToken: 4, Seed: 1,
}

// chatRand is a splitmix64 sequence.
type chatRand struct{ s uint64 }

func (r *chatRand) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return hashx.Mix64(r.s)
}

// uniform returns an integer in [lo, hi].
func (r *chatRand) uniform(lo, hi int) int { return lo + int(r.next()%uint64(hi-lo+1)) }

// exp returns an exponential variate of the given mean.
func (r *chatRand) exp(mean float64) float64 {
	u := (float64(r.next()>>11) + 0.5) / (1 << 53) // (0, 1)
	return -mean * math.Log(u)
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatBody struct {
	Model     string        `json:"model"`
	Messages  []chatMessage `json:"messages"`
	MaxTokens int           `json:"max_tokens"`
	Stream    bool          `json:"stream"`
}

type chatLine struct {
	TimestampMS  int64             `json:"timestamp_ms"`
	Path         string            `json:"path"`
	Headers      map[string]string `json:"headers"`
	Body         chatBody          `json:"body"`
	OutputTokens int               `json:"output_tokens"`
}

// chatWords is n tokens of words seeded by seed.
func chatWords(seed uint64, tokens, charsPerToken int) string {
	b := make([]byte, tokens*charsPerToken)
	fillWords(b, seed)
	return string(b)
}

// writeChatTrace writes the trace s describes, in arrival order.
func writeChatTrace(w io.Writer, s chatTraceSpec) error {
	if s.Conversations < 1 || s.Turns < 1 || s.Apps < 1 || !(s.StartsPerS > 0) || s.CharsPerToken < 1 ||
		s.UserMin < 1 || s.UserMax < s.UserMin || s.ReplyMin < 1 || s.ReplyMax < s.ReplyMin || s.SystemTokens < 0 {
		return fmt.Errorf("chat trace: bad settings %+v", s)
	}
	rng := &chatRand{s: s.Seed}
	systems := make([]string, s.Apps)
	for a := range systems {
		systems[a] = fmt.Sprintf("You are the assistant of application %d. ", a) +
			chatWords(hashString(s.Seed, fmt.Sprintf("system-%d", a)), s.SystemTokens, s.CharsPerToken)
	}
	var lines []chatLine
	start := 0.0
	for c := 0; c < s.Conversations; c++ {
		start += rng.exp(1 / s.StartsPerS)
		app := int(rng.next() % uint64(s.Apps))
		id := fmt.Sprintf("chat-%03d", c)
		history := []chatMessage{{Role: "system", Content: systems[app]}}
		at := start
		for k := 0; k < s.Turns; k++ {
			if k > 0 {
				at += s.ThinkMinS + rng.exp(s.ThinkMeanS)
			}
			user := chatWords(hashString(s.Seed, fmt.Sprintf("%s/user/%d", id, k)), rng.uniform(s.UserMin, s.UserMax), s.CharsPerToken)
			reply := rng.uniform(s.ReplyMin, s.ReplyMax)
			history = append(history, chatMessage{Role: "user", Content: user})
			lines = append(lines, chatLine{
				TimestampMS:  int64(math.Round(at * 1000)),
				Path:         "/v1/chat/completions",
				Headers:      map[string]string{"x-session-id": id},
				Body:         chatBody{Model: "llama-3-8b", Messages: append([]chatMessage(nil), history...), MaxTokens: reply, Stream: true},
				OutputTokens: reply,
			})
			answer := chatWords(hashString(s.Seed, fmt.Sprintf("%s/assistant/%d", id, k)), reply, s.CharsPerToken)
			history = append(history, chatMessage{Role: "assistant", Content: answer})
		}
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].TimestampMS < lines[j].TimestampMS })
	return writeJSONLines(w, lines)
}

// writeJSONLines writes each item as one line of JSON: the form of every trace the
// replayer generates.
func writeJSONLines[T any](w io.Writer, items []T) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range items {
		if err := enc.Encode(&items[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// chatTraceMain is `kvroute-replay -gen-chat [-o file] [-conversations n] [-turns n]
// [-starts-per-s r] [-think-mean-s s] [-apps n] [-system-tokens n] [-seed n]`: it
// writes the chat trace and returns the exit code.
func chatTraceMain(args []string) int {
	s := chatTraceDefaults
	fs := flag.NewFlagSet("kvroute-replay -gen-chat", flag.ContinueOnError)
	out := fs.String("o", "testdata/replay/chat_sessions.jsonl", "write the trace here")
	fs.IntVar(&s.Conversations, "conversations", s.Conversations, "conversations")
	fs.IntVar(&s.Turns, "turns", s.Turns, "turns per conversation")
	fs.Float64Var(&s.StartsPerS, "starts-per-s", s.StartsPerS, "new conversations per second (Poisson)")
	fs.Float64Var(&s.ThinkMeanS, "think-mean-s", s.ThinkMeanS, "mean of the exponential part of the time between a conversation's turns, seconds")
	fs.IntVar(&s.Apps, "apps", s.Apps, "applications, each with its own system prompt")
	fs.IntVar(&s.SystemTokens, "system-tokens", s.SystemTokens, "tokens of each application's system prompt")
	fs.Uint64Var(&s.Seed, "seed", s.Seed, "seed")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if err := writeFile(*out, func(w io.Writer) error { return writeChatTrace(w, s) }); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute-replay -gen-chat:", err)
		return 1
	}
	fmt.Printf("wrote %s: %d conversations × %d turns\n", *out, s.Conversations, s.Turns)
	return 0
}
