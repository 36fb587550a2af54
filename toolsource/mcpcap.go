package toolsource

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"os/exec"
	"regexp"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An MCP server's message over the cap fails the call it answers, not
// the session. The SDK reads stdio with a line cap and ends the session
// (every call on it) at the first longer line; over HTTP it reads a JSON
// body whole and gives up a stream at an oversized event. So the worker
// reads the bytes first: a message over MaxMessageBytes is skipped
// without being kept, and when it is a reply the SDK gets a JSON-RPC
// error for its id instead.

// sdkSlack is how far above our cap the SDK's own caps (a stdio frame,
// an SSE event) are set: ours fires first, theirs is a backstop.
const sdkSlack = 1 << 20

// withSlack is max plus sdkSlack, without overflowing.
func withSlack(max int) int {
	return max + min(sdkSlack, math.MaxInt-max)
}

// maxSkipped bounds a message being skipped: a server that never ends a
// line past it ends its session.
const maxSkipped = 1 << 30

// CommandTransport runs a stdio MCP server as mcp.CommandTransport does,
// with each message from it bounded by MaxMessageBytes.
type CommandTransport struct {
	Command *exec.Cmd
	// TerminateDuration is how long Close waits for the process after
	// closing its stdin, before SIGTERM (then SIGKILL); default 5s.
	TerminateDuration time.Duration
	// MaxMessageBytes bounds one message the server writes (a JSON
	// value, on one line or many); default the SDK's 16 MiB.
	MaxMessageBytes int
	Logger          *slog.Logger
}

// Connect starts the command and talks to it over its stdin and stdout.
func (t *CommandTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	stdout, err := t.Command.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := t.Command.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := t.Command.Start(); err != nil {
		return nil, err
	}
	max := t.MaxMessageBytes
	if max <= 0 {
		max = mcp.DefaultMaxLineLength
	}
	td := t.TerminateDuration
	if td <= 0 {
		td = 5 * time.Second
	}
	log := t.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &lineCapReader{src: bufio.NewReaderSize(stdout, 64<<10), max: max, log: log}
	// The connection closes by closing stdin (processStdin.Close), not
	// stdout. Our cap comes first; the SDK's, above it, is a backstop.
	return (&mcp.IOTransport{Reader: io.NopCloser(r), Writer: &processStdin{t.Command, stdin, td},
		MaxLineLength: withSlack(max)}).Connect(ctx)
}

// processStdin closes a stdio server as the MCP spec asks: stdin closed,
// then SIGTERM, then SIGKILL, each after a wait (the SDK's pipeRWC).
type processStdin struct {
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	terminate time.Duration
}

func (p *processStdin) Write(b []byte) (int, error) { return p.stdin.Write(b) }

func (p *processStdin) Close() error {
	if err := p.stdin.Close(); err != nil {
		return fmt.Errorf("closing stdin: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	wait := func() (error, bool) {
		t := time.NewTimer(p.terminate)
		defer t.Stop()
		select {
		case err := <-exited:
			return err, true
		case <-t.C:
			return nil, false
		}
	}
	if err, ok := wait(); ok {
		return err
	}
	if p.cmd.Process.Signal(syscall.SIGTERM) == nil {
		if err, ok := wait(); ok {
			return err
		}
	}
	if err := p.cmd.Process.Kill(); err != nil {
		return err
	}
	if err, ok := wait(); ok {
		return err
	}
	return errors.New("unresponsive subprocess")
}

// lineCapReader passes a stdio server's messages through up to max bytes
// each; a longer one is skipped and replaced by an error reply for its id.
// A message is a JSON value, which may span lines (the SDK's decoder reads
// values, not lines): its bytes are counted from its first line to the
// line where its objects and arrays are all closed, so a reply spread
// over many short lines is bounded as one on a single line is. White
// space between messages (blank lines) is dropped, not counted.
type lineCapReader struct {
	src  *bufio.Reader
	max  int
	log  *slog.Logger
	out  []byte // what the next Reads return
	msg  []byte
	scan jsonScan
}

func (r *lineCapReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if err := r.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

func (r *lineCapReader) next() error {
	if cap(r.msg) > 1<<20 {
		r.msg = nil // do not keep a large message's buffer
	}
	r.msg, r.scan = r.msg[:0], jsonScan{}
	for {
		frag, err := r.src.ReadSlice('\n')
		r.scan.feed(frag)
		if !r.scan.started { // white space between messages: dropped
			if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
				return err
			}
			continue
		}
		if len(r.msg)+len(frag)-lineEnd(frag) > r.max {
			return r.skip(frag, err)
		}
		r.msg = append(r.msg, frag...)
		if !r.ended(err) {
			continue
		}
		r.out = r.msg // a last message without newline too; EOF comes next
		return nil
	}
}

// ended reports whether the message read so far ends with the piece just
// read, which came with err: at the end of a line outside its objects and
// arrays (or inside a string, which JSON does not allow: the SDK's
// decoder refuses it there), or at the end of the stream.
func (r *lineCapReader) ended(err error) bool {
	if errors.Is(err, bufio.ErrBufferFull) {
		return false
	}
	return err != nil || r.scan.depth == 0 || r.scan.inString
}

// lineEnd is the length of the line ending frag ends with: the bytes a
// message's size does not count.
func lineEnd(frag []byte) int {
	switch {
	case bytes.HasSuffix(frag, []byte("\r\n")):
		return 2
	case bytes.HasSuffix(frag, []byte("\n")):
		return 1
	}
	return 0
}

// skip reads the rest of an oversized message without keeping it, then
// queues the error reply for it (or nothing, for a request or
// notification of the server's).
func (r *lineCapReader) skip(frag []byte, err error) error {
	m := newSkipped(r.msg)
	m.add(frag)
	for !r.ended(err) {
		if m.size > maxSkipped {
			return fmt.Errorf("an MCP server message of more than %d bytes", maxSkipped)
		}
		frag, err = r.src.ReadSlice('\n')
		r.scan.feed(frag)
		m.add(frag)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	reply, kind := m.reply(nil, r.max)
	switch kind {
	case skippedReply:
		r.log.Warn("MCP server reply over the size limit refused: its call fails, the session goes on", "bytes", m.size, "limit", r.max)
		r.out = append(reply, '\n')
		return nil // an EOF comes again with the next read
	case skippedRequest:
		r.log.Warn("MCP server message over the size limit dropped", "bytes", m.size, "limit", r.max)
		return err // nil: the next message
	}
	// No id to fail: the session ends, as the SDK would end it.
	return fmt.Errorf("an MCP server message of %d bytes without a reply id, over the limit of %d", m.size, r.max)
}

// jsonScan follows a JSON text byte by byte, as far as telling where a
// value ends needs: how deep in objects and arrays, whether inside a
// string (and just after a backslash there), whether anything but
// white space came yet. It checks nothing else: the SDK's decoder does.
type jsonScan struct {
	depth             int
	inString, escaped bool
	started           bool
}

func (s *jsonScan) feed(b []byte) {
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case s.escaped:
			s.escaped = false
		case s.inString:
			// Most of a large message is strings: jump to the next byte
			// that matters in one.
			j := bytes.IndexAny(b[i:], `"\`)
			if j < 0 {
				return
			}
			i += j
			if b[i] == '"' {
				s.inString = false
			} else {
				s.escaped = true
			}
		default:
			switch c {
			case ' ', '\t', '\r', '\n':
				continue
			case '"':
				s.inString = true
			case '{', '[':
				s.depth++
			case '}', ']':
				s.depth = max(s.depth-1, 0)
			}
			s.started = true
		}
	}
}

// skipped is what is kept of an oversized message: its start, its end
// and its size.
type skipped struct {
	head, tail []byte
	size       int
}

const skippedKeep = 4 << 10

func newSkipped(start []byte) *skipped {
	m := &skipped{}
	m.add(start)
	return m
}

func (m *skipped) add(b []byte) {
	m.size += len(b)
	if n := skippedKeep - len(m.head); n > 0 {
		m.head = append(m.head, b[:min(n, len(b))]...)
	}
	m.tail = append(m.tail, b[max(0, len(b)-skippedKeep):]...)
	if len(m.tail) > skippedKeep {
		m.tail = append(m.tail[:0], m.tail[len(m.tail)-skippedKeep:]...)
	}
}

type skippedKind int

const (
	skippedUnknown skippedKind = iota
	skippedReply
	skippedRequest // a request or notification of the server's
)

// tailID finds the id at the end of a reply written id last (the
// TypeScript SDK writes {"result":…,"jsonrpc":"2.0","id":N}).
var tailID = regexp.MustCompile(`"id"\s*:\s*(-?[0-9]{1,20}|"(?:[^"\\]|\\.){0,256}")\s*\}\s*$`)

// reply returns the error reply that replaces the message: for the id it
// names, or for callID (the request an HTTP response answers) when set.
func (m *skipped) reply(callID json.RawMessage, max int) ([]byte, skippedKind) {
	kind, id := scanHead(m.head)
	if kind == skippedRequest {
		return nil, kind
	}
	if callID != nil {
		id = callID
	} else if id == nil {
		if sm := tailID.FindSubmatch(bytes.TrimSpace(m.tail)); sm != nil && json.Valid(sm[1]) {
			id = sm[1]
		}
	}
	if id == nil {
		return nil, skippedUnknown
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{
		"code": -32603, "message": fmt.Sprintf("the server's reply of %d bytes or more was refused: the limit is %d", m.size, max)}})
	return b, skippedReply
}

// scanHead reads the first keys of a JSON-RPC message: a reply has
// "result" or "error", a request or notification "method" or "params";
// the id, when it comes before them.
func scanHead(head []byte) (skippedKind, json.RawMessage) {
	dec := json.NewDecoder(bytes.NewReader(head))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return skippedUnknown, nil
	}
	var id json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			break
		}
		switch t {
		case "result", "error":
			return skippedReply, id
		case "method", "params":
			return skippedRequest, nil
		}
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			break
		}
		if t == "id" {
			id = v
		}
	}
	return skippedUnknown, id
}

// capTransport bounds what a Streamable HTTP server sends: a JSON reply
// body or one SSE event over max is replaced by an error reply for the
// request it answers; an oversized event on a stream of no call (the
// standalone GET stream) is dropped, an oversized JSON body answering no
// call fails to read, and the body of an error status is cut at
// maxErrorBody.
type capTransport struct {
	next http.RoundTripper
	max  int
	log  *slog.Logger
}

// maxErrorBody bounds what is read of an error status's body (the SDK
// reads it whole, for a JSON-RPC error in it).
const maxErrorBody = 64 << 10

func (c *capTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var callID json.RawMessage
	if req.Method == http.MethodPost && req.GetBody != nil {
		if body, err := req.GetBody(); err == nil {
			callID = requestCallID(body)
			_ = body.Close()
		}
	}
	resp, err := c.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, int64(min(c.max, maxErrorBody))), resp.Body}
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return resp, nil
	}
	switch mediaType(resp.Header.Get("Content-Type")) {
	case "application/json":
		body, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.max)+1))
		switch {
		case len(body) > c.max && callID != nil:
			_ = resp.Body.Close()
			m := newSkipped(body)
			body, _ = m.reply(callID, c.max)
			c.log.Warn("MCP server reply over the size limit refused: its call fails, the session goes on", "limit", c.max)
			resp.Body = io.NopCloser(bytes.NewReader(body))
		case len(body) > c.max:
			_ = resp.Body.Close()
			c.log.Warn("MCP server reply over the size limit refused: it answers no call", "limit", c.max)
			resp.Body = io.NopCloser(errReader{fmt.Errorf("an MCP server reply of more than %d bytes, answering no call", c.max)})
		default:
			resp.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(body), errReader{err}), resp.Body}
		}
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	case "text/event-stream":
		resp.Body = &sseCapReader{src: bufio.NewReaderSize(resp.Body, 64<<10), body: resp.Body, max: c.max, callID: callID, log: c.log}
	}
	return resp, nil
}

// requestCallID is the id of the call a request body makes (a JSON-RPC
// request with a method and an id), or nil. It reads the body's top-level
// keys as tokens and stops when it has both, so large arguments (after
// them, as the SDK writes a request) cost nothing and bound nothing.
func requestCallID(body io.Reader) json.RawMessage {
	dec := json.NewDecoder(body)
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var id json.RawMessage
	method := false
	for dec.More() && !(method && id != nil) {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		switch t {
		case "id":
			if dec.Decode(&id) != nil {
				return nil
			}
		case "method":
			var m string
			if dec.Decode(&m) != nil {
				return nil
			}
			method = m != ""
		default:
			if skipValue(dec) != nil {
				return nil
			}
		}
	}
	if !method || len(id) == 0 || string(id) == "null" {
		return nil
	}
	return id
}

// skipValue reads the next value's tokens.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		switch t {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}

// mediaType is the media type of a Content-Type as the SDK reads it
// (mime.ParseMediaType: lower case, parameters off; "" when it does not
// parse, which the SDK refuses).
func mediaType(ct string) string {
	t, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return ""
	}
	return t
}

// sseCapReader passes an SSE stream through event by event; an event
// whose lines exceed max is skipped and, on a call's stream, replaced by
// an error reply for the call.
type sseCapReader struct {
	src    *bufio.Reader
	body   io.Closer
	max    int
	callID json.RawMessage
	log    *slog.Logger
	out    []byte
	event  []byte
	err    error
}

func (r *sseCapReader) Close() error { return r.body.Close() }

func (r *sseCapReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.next()
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// next reads one event (lines up to a blank one) into out, or sets err.
func (r *sseCapReader) next() {
	if cap(r.event) > 1<<20 {
		r.event = nil
	}
	r.event = r.event[:0]
	var m *skipped
	lineStart := true // the next piece starts a line
	for {
		line, err := r.readLine(m != nil)
		// A blank line ends the event; a lone newline that ends a long
		// line read in pieces does not.
		blank := lineStart && len(bytes.TrimRight(line, "\r\n")) == 0
		lineStart = bytes.HasSuffix(line, []byte("\n"))
		if m == nil && len(r.event)+len(line) > r.max {
			m = newSkipped(nil)
			m.add(eventData(r.event))
			r.event = r.event[:0]
		}
		if m != nil {
			m.add(eventData(line))
		} else {
			r.event = append(r.event, line...)
		}
		if err != nil {
			r.err = err // after what this event gives
			break
		}
		if blank { // the event's end
			break
		}
		if m != nil && m.size > maxSkipped {
			r.err = fmt.Errorf("an MCP server event of more than %d bytes", maxSkipped)
			return
		}
	}
	if m == nil {
		r.out = r.event
		return
	}
	reply, kind := m.reply(r.callID, r.max)
	if kind == skippedReply && r.callID != nil {
		r.log.Warn("MCP server reply over the size limit refused: its call fails, the session goes on", "bytes", m.size, "limit", r.max)
		r.out = []byte("event: message\ndata: " + string(reply) + "\n\n")
		return
	}
	r.log.Warn("MCP server event over the size limit dropped", "bytes", m.size, "limit", r.max)
}

// readLine reads a line; while skipping, a long line comes in pieces
// (the data: prefix only on the first, which is all eventData needs).
func (r *sseCapReader) readLine(skipping bool) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.src.ReadSlice('\n')
		line = append(line, frag...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
		if skipping || len(line) > r.max {
			return line, nil
		}
	}
}

// eventData keeps what follows "data:" on SSE lines (the JSON-RPC
// message, for scanHead), or the bytes as they are for a piece of one.
func eventData(b []byte) []byte {
	var out []byte
	for line := range bytes.Lines(b) {
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			out = append(out, bytes.TrimPrefix(bytes.TrimRight(d, "\r\n"), []byte(" "))...)
		} else if !bytes.HasPrefix(line, []byte("event:")) && !bytes.HasPrefix(line, []byte("id:")) && !bytes.HasPrefix(line, []byte("retry:")) {
			out = append(out, bytes.TrimRight(line, "\r\n")...)
		}
	}
	return out
}
