package main

import (
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// maxSlow caps the wait a SLOW_ word asks for.
const maxSlow = 120 * time.Second

var (
	failWord = regexp.MustCompile(`FAIL_(PREFILL_|DECODE_)?([0-9]{3})`)
	slowWord = regexp.MustCompile(`SLOW_(PREFILL_|DECODE_)?([0-9]{1,9})`)
)

// promptText is the text the magic words are looked for in: chat messages, a completions
// prompt, a responses input and instructions.
func promptText(body gjson.Result) string {
	var b strings.Builder
	addContent := func(c gjson.Result) {
		if c.Type == gjson.String {
			b.WriteString(c.Str)
			b.WriteByte('\n')
			return
		}
		c.ForEach(func(_, part gjson.Result) bool {
			if t := part.Get("text"); t.Type == gjson.String {
				b.WriteString(t.Str)
				b.WriteByte('\n')
			} else if part.Type == gjson.String {
				b.WriteString(part.Str)
				b.WriteByte('\n')
			}
			return true
		})
	}
	body.Get("messages").ForEach(func(_, m gjson.Result) bool {
		addContent(m.Get("content"))
		return true
	})
	addContent(body.Get("prompt"))
	addContent(body.Get("instructions"))
	if in := body.Get("input"); in.Type == gjson.String {
		addContent(in)
	} else {
		in.ForEach(func(_, item gjson.Result) bool {
			addContent(item.Get("content"))
			return true
		})
	}
	return b.String()
}

// magicApplies reports whether a magic word's scope (PREFILL_, DECODE_ or none) covers req.
func (req *request) magicApplies(scope string) bool {
	switch scope {
	case "PREFILL_":
		return req.prefill
	case "DECODE_":
		return !req.prefill
	}
	return true
}

// magicFail is the status a FAIL_ word asks for, or 0.
func (req *request) magicFail() int {
	for _, m := range failWord.FindAllStringSubmatch(req.prompt, -1) {
		status, _ := strconv.Atoi(m[2])
		if status >= 400 && status <= 599 && req.magicApplies(m[1]) {
			return status
		}
	}
	return 0
}

// magicSlow is the wait a SLOW_ word asks for, or 0.
func (req *request) magicSlow() time.Duration {
	for _, m := range slowWord.FindAllStringSubmatch(req.prompt, -1) {
		if !req.magicApplies(m[1]) {
			continue
		}
		ms, _ := strconv.Atoi(m[2])
		return min(time.Duration(ms)*time.Millisecond, maxSlow)
	}
	return 0
}
