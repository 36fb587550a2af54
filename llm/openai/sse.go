package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// maxEventSize bounds one SSE event so a broken server cannot exhaust memory.
const maxEventSize = 32 << 20

var errEventTooLarge = errors.New("SSE event larger than 32 MiB")

// sseEvent is one dispatched server-sent event. Data is valid until the next
// call to Next.
type sseEvent struct {
	Name string
	Data []byte
}

// sseDecoder is a tolerant text/event-stream reader. Unlike go-openai's
// stream reader it accepts LF, CRLF and lone CR line ends, `data:` with or
// without a space, comment and unknown lines in any number, named events
// (`event: error`), and data lines that servers forgot to separate with a
// blank line. It only consumes the bytes the reader has, so an event is
// handed out as soon as its blank line arrives.
type sseDecoder struct {
	r    io.Reader
	buf  []byte
	pos  int
	end  int
	err  error // sticky read error
	line []byte

	sawCR   bool
	started bool // past a possible byte order mark

	name    string
	data    []byte
	hasData bool
	out     []byte // data of the event last returned
	pending []byte // a data line that starts the next event
}

func newSSEDecoder(r io.Reader) *sseDecoder {
	return &sseDecoder{r: r, buf: make([]byte, 32<<10)}
}

// Next returns the next event, io.EOF at the end of the body, or the read
// error that ended it. An event cut off by the end of the body is still
// returned: the caller decides whether its data is usable.
func (d *sseDecoder) Next() (sseEvent, error) {
	if d.pending != nil {
		d.data = append(d.data[:0], d.pending...)
		d.hasData = true
		d.pending = nil
	}
	for {
		if d.pos == d.end {
			if d.err != nil {
				return d.finish()
			}
			n, err := d.r.Read(d.buf)
			d.pos, d.end = 0, n
			if err != nil {
				d.err = err
			}
			continue
		}
		chunk := d.buf[d.pos:d.end]
		if !d.started {
			// Wait for enough bytes to tell a byte order mark from content.
			for len(chunk) < 3 && d.err == nil && bytes.HasPrefix([]byte("\xEF\xBB\xBF"), chunk) {
				d.fill()
				chunk = d.buf[d.pos:d.end]
			}
			d.started = true
			if bytes.HasPrefix(chunk, []byte("\xEF\xBB\xBF")) {
				d.pos += 3
				continue
			}
		}
		if d.sawCR {
			d.sawCR = false
			if chunk[0] == '\n' {
				d.pos++
				continue
			}
		}
		i := bytes.IndexAny(chunk, "\r\n")
		if i < 0 {
			if len(d.line)+len(chunk) > maxEventSize {
				return sseEvent{}, errEventTooLarge
			}
			d.line = append(d.line, chunk...)
			d.pos = d.end
			continue
		}
		if len(d.line)+i > maxEventSize {
			return sseEvent{}, errEventTooLarge
		}
		d.line = append(d.line, chunk[:i]...)
		d.sawCR = chunk[i] == '\r'
		d.pos += i + 1
		ev, ok, err := d.endLine()
		if err != nil {
			return sseEvent{}, err
		}
		if ok {
			return ev, nil
		}
	}
}

// fill reads more bytes after the current ones.
func (d *sseDecoder) fill() {
	rest := append([]byte(nil), d.buf[d.pos:d.end]...)
	copy(d.buf, rest)
	n, err := d.r.Read(d.buf[len(rest):])
	d.pos, d.end = 0, len(rest)+n
	if err != nil {
		d.err = err
	}
}

// finish handles the end of the body: a last unterminated line and event.
func (d *sseDecoder) finish() (sseEvent, error) {
	if len(d.line) > 0 {
		ev, ok, err := d.endLine()
		if err != nil {
			return sseEvent{}, err
		}
		if ok {
			return ev, nil
		}
	}
	if d.hasData {
		return d.dispatch(), nil
	}
	if errors.Is(d.err, io.EOF) {
		return sseEvent{}, io.EOF
	}
	return sseEvent{}, d.err
}

// endLine interprets the line collected so far.
func (d *sseDecoder) endLine() (sseEvent, bool, error) {
	line := d.line
	d.line = d.line[:0]
	if len(line) == 0 {
		if d.hasData {
			return d.dispatch(), true, nil
		}
		d.name = ""
		return sseEvent{}, false, nil
	}
	if line[0] == ':' {
		return sseEvent{}, false, nil // comment / keep-alive
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if d.hasData {
			// A server that forgot the blank line between events: a
			// complete JSON value is an event of its own.
			if len(d.data) < 1<<20 && startsEvent(value) && json.Valid(d.data) {
				d.pending = append([]byte{}, value...)
				return d.dispatch(), true, nil
			}
			if len(d.data)+1+len(value) > maxEventSize {
				return sseEvent{}, false, errEventTooLarge
			}
			d.data = append(d.data, '\n')
		}
		d.data = append(d.data, value...)
		d.hasData = true
	case "event":
		d.name = string(value)
	}
	return sseEvent{}, false, nil
}

func startsEvent(value []byte) bool {
	v := bytes.TrimSpace(value)
	return len(v) > 0 && (v[0] == '{' || bytes.Equal(v, []byte("[DONE]")))
}

func (d *sseDecoder) dispatch() sseEvent {
	d.out = append(d.out[:0], d.data...)
	ev := sseEvent{Name: d.name, Data: d.out}
	d.name, d.data, d.hasData = "", d.data[:0], false
	return ev
}
