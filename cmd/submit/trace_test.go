package main

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/agentfleet/agentfleet/bus"
)

// otlpSpan is a span an OTLP/HTTP receiver got, with its service.
type otlpSpan struct {
	service string
	span    *tracepb.Span
}

func (s otlpSpan) attr(key string) *common.AnyValue {
	for _, kv := range s.span.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// otlpReceiver is an OTLP/HTTP traces endpoint that decodes what it gets.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []otlpSpan
	bad   []string
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		o.fail(r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type"))
		http.Error(w, "unexpected", http.StatusNotFound)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			o.fail(err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	data, err := io.ReadAll(body)
	var req collector.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(data, &req)
	}
	if err != nil {
		o.fail(err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				o.spans = append(o.spans, otlpSpan{service, sp})
			}
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&collector.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (o *otlpReceiver) fail(s string) {
	o.mu.Lock()
	o.bad = append(o.bad, s)
	o.mu.Unlock()
}

// waitFor waits until a span matching ok has come.
func (o *otlpReceiver) waitFor(t *testing.T, what string, ok func(otlpSpan) bool) otlpSpan {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		o.mu.Lock()
		for _, s := range o.spans {
			if ok(s) {
				o.mu.Unlock()
				return s
			}
		}
		n := len(o.spans)
		o.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no span %s among %d received", what, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func spanNamed(name string) func(otlpSpan) bool {
	return func(s otlpSpan) bool { return s.span.Name == name }
}

// startTracedWorker starts a worker process (its own embedded NATS) that
// exports every span to a new OTLP/HTTP receiver in the test. It returns
// the receiver, the worker's NATS URL and the OTEL_* environment to give
// submit too.
func startTracedWorker(t *testing.T) (*otlpReceiver, string, []string) {
	t.Helper()
	rcv := &otlpReceiver{}
	hs := httptest.NewServer(rcv)
	t.Cleanup(hs.Close)
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + hs.URL, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_TRACES_SAMPLER=parentbased_always_on"}
	stop, url, err := startWorkerProcess(filepath.Join(t.TempDir(), "worker.log"), otel,
		"--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return rcv, url, otel
}

// A real submit process continues the caller's TRACEPARENT, the request
// carries its context over NATS to a real worker process, and both export
// over OTLP/HTTP (protobuf) to a receiver in the test: the worker's spans
// are children of the submit's, in the caller's trace.
func TestTracePropagatesFromSubmitToWorkerOverOTLP(t *testing.T) {
	t.Parallel()
	rcv, url, otel := startTracedWorker(t)

	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	id := "t-otel-" + bus.NewRunID()[:8]
	q := startWithEnv(t, append(submitEnv("NATS_URL="+url, "TRACEPARENT=00-"+callerTrace+"-"+callerSpan+"-01"), otel...),
		"--otel", "--id", id, "--request", request(t, toolRun), "What is 6*7?")
	if code := q.wait(t); code != 0 {
		t.Fatalf("submit: exit %d\n%s\n%s", code, q.stdout, q.stderr)
	}

	sub := rcv.waitFor(t, "agentfleet.submit", func(s otlpSpan) bool {
		return s.span.Name == "agentfleet.submit" && s.attr("agentfleet.run.id").GetStringValue() == id
	})
	if sub.service != "agentfleet-submit" || hex.EncodeToString(sub.span.TraceId) != callerTrace ||
		hex.EncodeToString(sub.span.ParentSpanId) != callerSpan {
		t.Fatalf("submit span: service %q trace %x parent %x, want the caller's %s/%s", sub.service, sub.span.TraceId, sub.span.ParentSpanId, callerTrace, callerSpan)
	}
	inTrace := func(name string) func(otlpSpan) bool {
		return func(s otlpSpan) bool { return s.span.Name == name && bytes.Equal(s.span.TraceId, sub.span.TraceId) }
	}
	inv := rcv.waitFor(t, "invoke_agent in the caller's trace", inTrace("invoke_agent"))
	if inv.service != "agentfleet-worker" || !bytes.Equal(inv.span.ParentSpanId, sub.span.SpanId) {
		t.Fatalf("invoke_agent: service %q parent %x, want the submit span %x", inv.service, inv.span.ParentSpanId, sub.span.SpanId)
	}
	if v := inv.attr("gen_ai.conversation.id").GetStringValue(); v != id {
		t.Errorf("invoke_agent gen_ai.conversation.id %q", v)
	}
	chat := rcv.waitFor(t, "chat x", inTrace("chat x"))
	tool := rcv.waitFor(t, "execute_tool calculator", inTrace("execute_tool calculator"))
	for _, s := range []otlpSpan{chat, tool} {
		if !bytes.Equal(s.span.ParentSpanId, inv.span.SpanId) {
			t.Errorf("%s: parent %x, want invoke_agent %x", s.span.Name, s.span.ParentSpanId, inv.span.SpanId)
		}
	}
	if chat.span.Kind != tracepb.Span_SPAN_KIND_CLIENT || chat.attr("gen_ai.provider.name").GetStringValue() != "faux" ||
		chat.attr("gen_ai.usage.output_tokens").GetIntValue() <= 0 {
		t.Errorf("chat span %v", chat.span)
	}
	if tool.attr("gen_ai.tool.call.id").GetStringValue() != "c1" {
		t.Errorf("execute_tool span %v", tool.span)
	}
	rcv.waitFor(t, "queue wait", inTrace("agentfleet.queue.wait"))
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if len(rcv.bad) > 0 {
		t.Errorf("receiver got bad requests: %v", rcv.bad)
	}
}

// startWithEnv runs submit in the background with env as its environment.
func startWithEnv(t testing.TB, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(fleet.submit, args...), stdout: newOutBuf(), stderr: newOutBuf(), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// submit approve and deny continue the caller's TRACEPARENT: the answer
// on the control stream carries it to the worker.
func TestTraceApproveAndDenyCarryTheCallersContext(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	run := detach(t, gatedRun(gateCalculator, twoCalls, textReply("done")))
	waitEvent(t, c, run, bus.EventToolApprovalRequested, "c2")
	stream, err := c.JetStream().Stream(ctx(t), c.Names().ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	for i, args := range [][]string{{"approve", run, "c1"}, {"deny", run, "c2", "--reason", "no"}} {
		trace := fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e47%02d", i)
		q := startWithEnv(t, submitEnv("TRACEPARENT=00-"+trace+"-00f067aa0ba902b7-01"), args...)
		if code := q.wait(t); code != 0 {
			t.Fatalf("%s: exit %d\n%s\n%s", args[0], code, q.stdout, q.stderr)
		}
		msg, err := stream.GetLastMsgForSubject(ctx(t), c.Names().Control(run, bus.KindApprove))
		if err != nil {
			t.Fatal(err)
		}
		if tp := msg.Header.Get("traceparent"); !strings.HasPrefix(tp, "00-"+trace+"-") {
			t.Errorf("%s: the answer's traceparent %q, want the caller's trace %s", args[0], tp, trace)
		}
	}
}

// submit bench continues the caller's TRACEPARENT: every request it
// publishes carries it.
func TestTraceBenchCarriesTheCallersContext(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	sub, err := c.Conn().SubscribeSync(c.Names().SubmitFilter(bus.DefaultQueue))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	const callerTrace = "4bf92f3577b34da6a3ce929d0e0e47aa"
	q := startWithEnv(t, submitEnv("TRACEPARENT=00-"+callerTrace+"-00f067aa0ba902b7-01"), "bench", "--runs", "2", "--json")
	if code := q.wait(t); code != 0 {
		t.Fatalf("bench: exit %d\n%s\n%s", code, q.stdout, q.stderr)
	}
	// Other tests (benches too) submit meanwhile: count the requests in
	// the caller's trace.
	for seen := 0; seen < 2; {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%d of bench's 2 requests carry the caller's trace: %v", seen, err)
		}
		if strings.HasPrefix(m.Header.Get("traceparent"), "00-"+callerTrace+"-") {
			seen++
		}
	}
}

// With tracing on, bench's requests carry its one agentfleet.bench span
// (no span per run): each run's invoke_agent and queue.wait are its
// children, in the caller's trace.
func TestTraceBenchRunsAreChildrenOfTheBenchSpan(t *testing.T) {
	t.Parallel()
	rcv, url, otel := startTracedWorker(t)
	const callerTrace = "4bf92f3577b34da6a3ce929d0e0e47bb"
	q := startWithEnv(t, append(submitEnv("NATS_URL="+url, "TRACEPARENT=00-"+callerTrace+"-00f067aa0ba902b7-01"), otel...),
		"--otel", "bench", "--runs", "2", "--json")
	if code := q.wait(t); code != 0 {
		t.Fatalf("bench: exit %d\n%s\n%s", code, q.stdout, q.stderr)
	}
	inTrace := func(s otlpSpan) bool { return hex.EncodeToString(s.span.TraceId) == callerTrace }
	// submit flushed every span it made before exiting, the bench span last.
	bench := rcv.waitFor(t, "agentfleet.bench", func(s otlpSpan) bool { return s.span.Name == "agentfleet.bench" && inTrace(s) })
	children := func(name string) int {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		n := 0
		for _, s := range rcv.spans {
			if s.span.Name == name && inTrace(s) && bytes.Equal(s.span.ParentSpanId, bench.span.SpanId) {
				n++
			}
		}
		return n
	}
	for _, name := range []string{"invoke_agent", "agentfleet.queue.wait"} {
		for deadline := time.Now().Add(30 * time.Second); children(name) < 2; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d %s spans under agentfleet.bench, want 2", children(name), name)
			}
		}
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	for _, s := range rcv.spans {
		if s.span.Name == "agentfleet.submit" && inTrace(s) {
			t.Errorf("bench made a span per run: %v", s.span)
		}
	}
	if len(rcv.bad) > 0 {
		t.Errorf("receiver got bad requests: %v", rcv.bad)
	}
}

// SIGTERM stops submit as Ctrl-C does (it detaches from the run), and
// its span is flushed to the collector on the way out.
func TestTraceSubmitFlushesOnSIGTERM(t *testing.T) {
	t.Parallel()
	rcv := &otlpReceiver{}
	hs := httptest.NewServer(rcv)
	defer hs.Close()
	c := testClient(t)
	id := "t-term-" + bus.NewRunID()[:8]
	q := startWithEnv(t, submitEnv("OTEL_EXPORTER_OTLP_ENDPOINT="+hs.URL),
		"--id", id, "--request", request(t, gatedRun(gateCalculator, calcCall, textReply("done"))), "go")
	waitEvent(t, c, id, bus.EventToolApprovalRequested, "c1")
	if err := q.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := q.wait(t); code != exitDetached {
		t.Fatalf("submit after SIGTERM: exit %d, want %d\n%s", code, exitDetached, q.stderr)
	}
	rcv.waitFor(t, "agentfleet.submit of "+id, func(s otlpSpan) bool {
		return s.span.Name == "agentfleet.submit" && s.attr("agentfleet.run.id").GetStringValue() == id
	})
	if _, errOut, code := submit(t, "abort", id); code != 0 {
		t.Errorf("abort: exit %d %s", code, errOut)
	}
}
