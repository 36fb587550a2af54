package openai

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	goopenai "github.com/sashabaranov/go-openai"
)

const abortedText = "Request was aborted"

// maxJSONBody bounds a response that is a JSON document instead of a stream.
const maxJSONBody = 16 << 20

// Stream is an agent.StreamFn over the chat completions endpoint.
func (p *Provider) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return func(yield func(agent.StreamEvent) bool) {
		p.stream(ctx, model, llm, opts, yield)
	}
}

// call is one run of Stream.
type call struct {
	ctx   context.Context
	yield func(agent.StreamEvent) bool
	keys  []string // redacted from error texts
	a     *assembler
	d     *doer
}

func (p *Provider) stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions, yield func(agent.StreamEvent) bool) {
	if model.API == "" {
		model.API = API
	}
	if model.Provider == "" {
		model.Provider = p.cfg.Provider
	}
	if info, ok := p.models[model.ID]; ok && model.Cost == (agent.ModelCost{}) {
		model.Cost = info.Cost
	}
	key := opts.APIKey
	if key == "" {
		key = p.cfg.APIKey
	}
	header := agent.Message{Role: agent.RoleAssistant, API: model.API, Provider: model.Provider, Model: model.ID,
		StopReason: agent.StopReasonStop, Timestamp: time.Now().UnixMilli()}
	hdr := header
	if !yield(agent.StreamEvent{Type: agent.StreamStart, Message: &hdr}) {
		return
	}
	c := &call{ctx: ctx, yield: yield, keys: []string{key, p.cfg.APIKey}, a: newAssembler(model, header)}
	c.a.maxArgs = p.cfg.MaxToolArgumentBytes
	if ctx.Err() != nil {
		c.end(nil)
		return
	}
	if err := p.checkDeployment(model.ID); err != nil {
		c.finish(agent.StopReasonError, err.Error())
		return
	}
	body, err := p.requestBody(model, llm, opts)
	if err != nil {
		c.finish(agent.StopReasonError, err.Error())
		return
	}

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.d = &doer{p: p, model: model.ID, body: body, redact: c.redact, watch: &watchdog{d: p.cfg.IdleTimeout}}
	defer c.d.watch.stop()
	client := goopenai.NewClientWithConfig(p.clientConfig(key, c.d))
	// Only the model goes to go-openai: its request validators refuse
	// parameters for some model names, and the doer sends our body anyway.
	s, err := client.CreateChatCompletionStream(sctx, goopenai.ChatCompletionRequest{Model: model.ID})
	if err != nil {
		if ctx.Err() != nil {
			c.end(nil)
			return
		}
		c.finish(agent.StopReasonError, c.d.errorMessage(err))
		return
	}
	defer s.Close()
	readErr, ok := c.read(c.d.resp)
	if !ok {
		return // the consumer stopped
	}
	c.end(readErr)
}

// read feeds the body to the assembler and yields what it produces. It
// returns the error that ended reading (nil after [DONE] or a provider
// error) and false if the consumer stopped.
func (c *call) read(resp *http.Response) (error, bool) {
	br := bufio.NewReaderSize(resp.Body, 4096)
	// Sniff the body: a JSON document (a server that ignored stream:true,
	// or an error with status 200) or an HTML page is not an event stream.
	var first byte
	for {
		b, err := br.Peek(1)
		if err != nil {
			if errors.Is(err, io.EOF) && c.ctx.Err() == nil {
				c.a.failed = notStream(resp, []byte("(empty body)"))
			}
			return err, true
		}
		if b[0] != ' ' && b[0] != '\t' && b[0] != '\r' && b[0] != '\n' {
			first = b[0]
			break
		}
		_, _ = br.ReadByte()
	}
	switch first {
	case '{', '[':
		dec := json.NewDecoder(io.LimitReader(br, maxJSONBody))
		for !c.a.ended() {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				if c.a.finish == "" && !c.a.ended() {
					c.a.failed = notStream(resp, raw)
				}
				return nil, c.flush()
			}
			c.a.event(sseEvent{Data: raw})
			if !c.flush() {
				return nil, false
			}
		}
		return nil, true
	case '<':
		head, _ := br.Peek(512)
		c.a.failed = notStream(resp, head)
		return nil, true
	}
	dec := newSSEDecoder(br)
	for !c.a.ended() {
		ev, err := dec.Next()
		if err != nil {
			if !c.a.dataSeen && c.ctx.Err() == nil && errors.Is(err, io.EOF) {
				c.a.failed = notStream(resp, nil)
			}
			return err, true
		}
		c.a.event(ev)
		if !c.flush() {
			return nil, false
		}
	}
	return nil, true
}

func notStream(resp *http.Response, head []byte) string {
	msg := fmt.Sprintf("Server did not send an event stream (status %s, Content-Type %q)", resp.Status, resp.Header.Get("Content-Type"))
	if s := strings.TrimSpace(string(head)); s != "" {
		msg += ": " + capText(s)
	}
	return msg
}

// flush yields the events the assembler collected.
func (c *call) flush() bool {
	for _, ev := range c.a.out {
		if !c.yield(ev) {
			c.a.out = nil
			return false
		}
	}
	c.a.out = c.a.out[:0]
	return true
}

// end closes the blocks and yields the final event. readErr is what ended
// reading the body, if anything did.
func (c *call) end(readErr error) {
	reason, text := c.a.outcome()
	switch {
	case c.ctx.Err() != nil:
		reason, text = agent.StopReasonAborted, abortedText
		if cause := context.Cause(c.ctx); !errors.Is(cause, context.Canceled) {
			text += " (" + cause.Error() + ")"
		}
	case c.a.failed != "":
	case c.d != nil && c.d.watch.hasFired() && c.a.finish == "":
		reason, text = agent.StopReasonError, fmt.Sprintf("Stream stalled: no data from the server for %s", c.d.watch.d)
	case readErr != nil && !errors.Is(readErr, io.EOF) && c.a.finish == "" && !c.a.sawDone:
		reason, text = agent.StopReasonError, "Stream interrupted: "+readErr.Error()
	}
	c.finish(reason, text)
}

func (c *call) finish(reason agent.StopReason, text string) {
	c.a.closeBlocks()
	if !c.flush() {
		return
	}
	msg := c.a.msg
	msg.StopReason = reason
	if text != "" {
		msg.ErrorMessage = c.redact(text)
	}
	typ := agent.StreamDone
	if reason == agent.StopReasonError || reason == agent.StopReasonAborted {
		typ = agent.StreamError
		if msg.ErrorMessage == "" {
			msg.ErrorMessage = "Provider returned an error stop reason"
		}
	}
	c.yield(agent.StreamEvent{Type: typ, Reason: reason, Message: &msg})
}

// redact removes the API key from text that may echo it.
func (c *call) redact(s string) string {
	for _, k := range c.keys {
		if len(k) >= 4 {
			s = strings.ReplaceAll(s, k, "[REDACTED]")
		}
	}
	return s
}
