package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// respond writes the answer of a request that is served.
func (w *worker) respond(rw http.ResponseWriter, req *request, mock map[string]any) {
	n := w.seq.Add(1)
	tokens := []string{"Hello", " from", " " + w.cfg.Name, "."}
	finish := "stop"
	switch req.leg {
	case legVLLMPre, legTRTContext:
		tokens, finish = tokens[:1], "length"
		if req.leg == legTRTContext && strings.Contains(req.prompt, "FINISH_IN_CONTEXT") {
			finish = "stop"
		}
		req.stream = false // a prefill leg is answered in one JSON body
	default:
		if req.maxToks > 0 && req.maxToks < len(tokens) {
			tokens, finish = tokens[:req.maxToks], "length"
		}
	}
	promptTokens := max(1, len(req.prompt)/4)
	if req.stream {
		w.stream(rw, req, mock, n, tokens, finish, promptTokens)
		return
	}
	text := strings.Join(tokens, "")
	created := time.Now().Unix()
	var body map[string]any
	switch req.api {
	case "/v1/responses":
		body = responsesObject(req, n, created, text, finish, promptTokens, len(tokens))
	default:
		choice := map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil}
		object, id := "text_completion", fmt.Sprintf("cmpl-mock-%d", n)
		if req.api == "/v1/chat/completions" {
			object, id = "chat.completion", fmt.Sprintf("chatcmpl-mock-%d", n)
			choice["message"] = map[string]any{"role": "assistant", "content": text}
		} else {
			choice["text"] = text
		}
		if req.leg == legTRTContext {
			choice["disaggregated_params"] = trtllmContextParams()
		}
		body = map[string]any{
			"id": id, "object": object, "created": created, "model": req.model,
			"choices": []any{choice},
			"usage":   usage(promptTokens, len(tokens)),
		}
		if req.leg == legTRTContext {
			body["prompt_token_ids"] = []int{1, 2, 3}
		}
	}
	if req.leg == legVLLMPre {
		body["kv_transfer_params"] = w.vllmPrefillParams(req)
	}
	body["mock"] = mock
	writeJSON(rw, http.StatusOK, body)
}

func usage(prompt, completion int) map[string]any {
	return map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
}

// responsesObject is a /v1/responses response object.
func responsesObject(req *request, n uint64, created int64, text, finish string, in, out int) map[string]any {
	status := "completed"
	var incomplete any
	if finish == "length" {
		status = "incomplete"
		incomplete = map[string]any{"reason": "max_output_tokens"}
	}
	return map[string]any{
		"id": fmt.Sprintf("resp_mock_%d", n), "object": "response", "created_at": created,
		"status": status, "incomplete_details": incomplete, "model": req.model,
		"output": []any{map[string]any{
			"type": "message", "id": fmt.Sprintf("msg_mock_%d", n), "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}},
		}},
		"usage": map[string]any{"input_tokens": in, "output_tokens": out, "total_tokens": in + out},
	}
}

// stream writes the answer as Server-Sent Events.
func (w *worker) stream(rw http.ResponseWriter, req *request, mock map[string]any, n uint64, tokens []string, finish string, promptTokens int) {
	h := rw.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	rw.WriteHeader(http.StatusOK)
	flusher, _ := rw.(http.Flusher)
	send := func(event string, v any) {
		b, _ := json.Marshal(v)
		if event != "" {
			fmt.Fprintf(rw, "event: %s\n", event)
		}
		fmt.Fprintf(rw, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	created := time.Now().Unix()
	if req.api == "/v1/responses" {
		final := responsesObject(req, n, created, strings.Join(tokens, ""), finish, promptTokens, len(tokens))
		started := map[string]any{"id": final["id"], "object": "response", "created_at": created, "status": "in_progress", "model": req.model, "output": []any{}, "mock": mock}
		send("response.created", map[string]any{"type": "response.created", "sequence_number": 0, "response": started})
		for i, t := range tokens {
			send("response.output_text.delta", map[string]any{
				"type": "response.output_text.delta", "sequence_number": i + 1,
				"item_id": fmt.Sprintf("msg_mock_%d", n), "output_index": 0, "content_index": 0, "delta": t,
			})
		}
		send("response.completed", map[string]any{"type": "response.completed", "sequence_number": len(tokens) + 1, "response": final})
		return
	}
	chat := req.api == "/v1/chat/completions"
	object, id := "text_completion", fmt.Sprintf("cmpl-mock-%d", n)
	if chat {
		object, id = "chat.completion.chunk", fmt.Sprintf("chatcmpl-mock-%d", n)
	}
	chunk := func(choice map[string]any) map[string]any {
		return map[string]any{"id": id, "object": object, "created": created, "model": req.model, "choices": []any{choice}}
	}
	piece := func(text string, reason any) map[string]any {
		c := map[string]any{"index": 0, "finish_reason": reason, "logprobs": nil}
		if chat {
			c["delta"] = map[string]any{"content": text}
			if text == "" {
				c["delta"] = map[string]any{}
			}
		} else {
			c["text"] = text
		}
		return c
	}
	if chat {
		first := chunk(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil, "logprobs": nil})
		first["mock"] = mock
		send("", first)
	}
	for i, t := range tokens {
		c := chunk(piece(t, nil))
		if i == 0 && !chat {
			c["mock"] = mock
		}
		send("", c)
	}
	send("", chunk(piece("", finish)))
	if req.body.Get("stream_options.include_usage").Bool() {
		u := chunk(nil)
		u["choices"] = []any{}
		u["usage"] = usage(promptTokens, len(tokens))
		send("", u)
	}
	fmt.Fprint(rw, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// writeError writes an OpenAI error body (with the mock facts, when there are some).
func writeError(rw http.ResponseWriter, status int, msg string, mock map[string]any) {
	typ := "MockError"
	switch {
	case status == http.StatusBadRequest:
		typ = "BadRequestError"
	case status == http.StatusNotFound:
		typ = "NotFoundError"
	case status >= 500:
		typ = "InternalServerError"
	}
	body := map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}}
	if mock != nil {
		body["mock"] = mock
	}
	writeJSON(rw, status, body)
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"cannot encode the answer","type":"InternalServerError","param":null,"code":500}}`)
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	rw.WriteHeader(status)
	rw.Write(append(b, '\n'))
}

func (w *worker) serveModels(rw http.ResponseWriter, r *http.Request) {
	writeJSON(rw, http.StatusOK, map[string]any{"object": "list", "data": []any{
		map[string]any{"id": w.cfg.Model, "object": "model", "created": 0, "owned_by": "kvroute-mockworker"},
	}})
}
