package deploy

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// violationLines is every violation the server logged, for failure messages.
func violationLines(l *logBuf) string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, "Violation") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// lastStreamSeq is the stream sequence of the last message on subject.
func lastStreamSeq(t *testing.T, c *bus.Client, stream, subject string) uint64 {
	t.Helper()
	ctx, cancel := short()
	defer cancel()
	s, err := c.JetStream().Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	return m.Sequence
}

// fleetQueue is a queue of the console's GET /api/fleet.
type fleetQueue struct {
	Queue    string `json:"queue"`
	Consumer string `json:"consumer"`
}

// consoleProcess is the console binary connected as one NATS user.
type consoleProcess struct {
	base   string
	stderr *logBuf
}

var consoleAddr = regexp.MustCompile(`msg="console started" addr=(http://\S+)`)

// startConsole builds cmd/console and runs it against url as user, with
// --allow-control, until the test ends.
func startConsole(t *testing.T, url, user, password string) *consoleProcess {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "console")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/console").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--nats", url, "--addr", "127.0.0.1:0", "--allow-control")
	// The password from the environment, as deployed.
	cmd.Env = append(os.Environ(), "NATS_URL=", "NATS_USER="+user, "NATS_PASSWORD="+password)
	p := &consoleProcess{stderr: &logBuf{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		m := consoleAddr.FindStringSubmatch(p.stderr.String())
		if m != nil {
			p.base = m[1]
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the console never started:\n%s", p.stderr.String())
	return nil
}

func (p *consoleProcess) getJSON(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := http.Get(p.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, b)
	}
}

func (p *consoleProcess) post(t *testing.T, path, csrf, body string) (int, string) {
	t.Helper()
	return p.postWith(t, path, csrf, body, nil)
}

// postWith is post with more headers.
func (p *consoleProcess) postWith(t *testing.T, path, csrf, body string, h http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.base+path, strings.NewReader(body))
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-CSRF-Token", csrf)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitRun polls the console's runs list until the run's record satisfies ok.
func (p *consoleProcess) waitRun(t *testing.T, id string, ok func(bus.RunRecord) bool) bus.RunRecord {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var version *uint64
	for time.Now().Before(deadline) {
		path := "/api/runs?q=" + id
		if version != nil {
			b, _ := json.Marshal(*version)
			path += "&after=" + string(b)
		}
		var page struct {
			Version uint64          `json:"version"`
			Runs    []bus.RunRecord `json:"runs"`
		}
		p.getJSON(t, path, &page)
		for _, r := range page.Runs {
			if r.ID == id && ok(r) {
				return r
			}
		}
		version = &page.Version
	}
	t.Fatalf("the console never listed run %s in the state the test waits for", id)
	return bus.RunRecord{}
}

// events reads a run's event stream from the console up to its end.
func (p *consoleProcess) events(t *testing.T, id string) []*bus.Envelope {
	t.Helper()
	// Bounded: a refused pull leaves the stream waiting.
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(p.base + "/api/runs/" + id + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("events of %s: %d %s", id, resp.StatusCode, b)
	}
	var out []*bus.Envelope
	r := bufio.NewReader(resp.Body)
	event := ""
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("events of %s: %v after %d envelopes", id, err, len(out))
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "event: "):
			event = line[len("event: "):]
			if event == "end" {
				return out
			}
		case strings.HasPrefix(line, "data: ") && event == "envelope":
			env, err := bus.DecodeEnvelope([]byte(line[len("data: "):]))
			if err != nil {
				t.Fatalf("events of %s: %v", id, err)
			}
			out = append(out, env)
		}
	}
}

// TestAccountsConsole proves the console role of deploy/nats/accounts.conf:
// the console binary, connected as user console next to a worker
// connected as worker, lists runs, streams a run's events, shows the
// queues and workers and steers a running run, with no permissions
// violation; and the console user cannot publish events, write records or
// presence, take requests off the queue or read another account.
func TestAccountsConsole(t *testing.T) {
	url, pw, serverLog := accountsServerLog(t)
	wc := connectAs(t, url, "worker", pw["worker"])
	sub := connectAs(t, url, "submitter", pw["submitter"])
	cons := connectAs(t, url, "console", pw["console"])
	other := connectAs(t, url, "other", pw["other"])
	names := wc.Names()
	ctx := fleettest.Context(t)
	// Queue "idle" is declared, and no worker serves it.
	if err := wc.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{bus.DefaultQueue, "idle"}}); err != nil {
		t.Fatal(err)
	}
	fleettest.RunWorker(t, worker.Config{Client: wc, DrainTimeout: 2 * time.Second, WorkerID: "acl-console-worker"})

	// A finished run, before the console starts (it pages through the records).
	done := fauxRun("what is 6*7?", fleettest.ToolCall("c1", "calculator", map[string]any{"expression": "6*7"}), fleettest.Text("It is 42."))
	done.ID = "acl-console-done"
	if _, err := sub.Submit(ctx, "", done); err != nil {
		t.Fatalf("submitter: submit: %v", err)
	}
	if tr, err := sub.LoadTranscript(ctx, done.ID); err != nil || !tr.Done() || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run %s: %v %+v", done.ID, err, tr)
	}

	p := startConsole(t, url, "console", pw["console"])

	// GET /api/runs lists the finished run.
	p.waitRun(t, done.ID, func(r bus.RunRecord) bool { return r.State == bus.StatusSucceeded })

	// GET /api/runs/{id}/events streams its envelopes, as stored.
	envs := p.events(t, done.ID)
	fleettest.CheckEnvelopes(t, envs)
	var direct []*bus.Envelope
	for env, err := range sub.Follow(ctx, done.ID) {
		if err != nil {
			t.Fatal(err)
		}
		direct = append(direct, env)
	}
	if fleettest.Dump(envs) != fleettest.Dump(direct) {
		t.Errorf("the console's events of %s differ from the stored ones:\n%s\nstored:\n%s", done.ID, fleettest.Dump(envs), fleettest.Dump(direct))
	}

	// A page that reconnects after the end gets only the end (the last
	// event of the run, read by subject).
	{
		req, _ := http.NewRequest(http.MethodGet, p.base+"/api/runs/"+done.ID+"/events", nil)
		req.Header.Set("Last-Event-ID", strconv.FormatUint(lastStreamSeq(t, wc, names.EventsStream(), names.Events(done.ID)), 10))
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Errorf("resumed after the end: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Contains(string(b), "event: envelope") || !strings.Contains(string(b), "event: end") {
			t.Errorf("resumed after the end: %d %s", resp.StatusCode, b)
		}
	}

	// A run no worker takes (no worker serves queue "idle"): the console
	// finds its request on the work queue.
	{
		idle := fauxRun("wait", fleettest.Text("never"))
		idle.ID = "acl-console-idle"
		if _, err := sub.Submit(ctx, "idle", idle); err != nil {
			t.Fatalf("submitter: submit to queue idle: %v", err)
		}
		var rec bus.RunRecord
		p.getJSON(t, "/api/runs/"+idle.ID, &rec)
		if rec.State != bus.StateQueued || rec.Queue != "idle" {
			t.Errorf("/api/runs/%s: %+v, want queued on idle", idle.ID, rec)
		}
	}

	// GET /api/fleet answers with the queue and the worker.
	{
		var fl struct {
			Queues  []fleetQueue         `json:"queues"`
			Workers []bus.WorkerPresence `json:"workers"`
			Errors  []string             `json:"errors"`
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			p.getJSON(t, "/api/fleet", &fl)
			if len(fl.Workers) > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(fl.Errors) > 0 {
			t.Errorf("/api/fleet errors: %q", fl.Errors)
		}
		if !slices.ContainsFunc(fl.Queues, func(q fleetQueue) bool {
			return q.Queue == bus.DefaultQueue && q.Consumer == names.Consumer(bus.DefaultQueue)
		}) {
			t.Errorf("/api/fleet queues: %+v", fl.Queues)
		}
		if len(fl.Workers) != 1 || fl.Workers[0].Worker != "acl-console-worker" {
			t.Errorf("/api/fleet workers: %+v", fl.Workers)
		}
	}

	// Control: the page's CSRF token, a submit and a steer of the running run.
	var session struct {
		CSRF         string `json:"csrf"`
		AllowControl bool   `json:"allowControl"`
	}
	p.getJSON(t, "/api/session", &session)
	running := "acl-console-running"
	body, _ := json.Marshal(map[string]any{"id": running, "prompt": "tell a story", "model": fleettest.FauxModel(),
		"faux": &bus.FauxScript{TokenSize: 1, TokensPerSecond: 50, Responses: []agent.ScriptedResponse{
			fleettest.Text(strings.Repeat("once upon a time ", 10)), fleettest.Text("and they turned left."), fleettest.Text("The end.")}}})
	if code, b := p.post(t, "/api/runs", session.CSRF, string(body)); code != http.StatusCreated {
		t.Fatalf("console: submit: %d %s", code, b)
	}
	p.waitRun(t, running, func(r bus.RunRecord) bool { return r.State == bus.StateRunning })
	keyed := http.Header{"Idempotency-Key": {"left-1"}}
	code, steered := p.postWith(t, "/api/runs/"+running+"/steer", session.CSRF, `{"text":"turn left"}`, keyed)
	if code != http.StatusAccepted {
		t.Fatalf("console: steer: %d %s", code, steered)
	}
	if code, b := p.post(t, "/api/runs/"+running+"/followup", session.CSRF, `{"text":"and then?"}`); code != http.StatusAccepted {
		t.Fatalf("console: follow-up: %d %s", code, b)
	}
	p.waitRun(t, running, func(r bus.RunRecord) bool { return r.State == bus.StatusSucceeded })
	// The steer retried with its key after the run finished: the same
	// answer (the role may read the first copy).
	if code, again := p.postWith(t, "/api/runs/"+running+"/steer", session.CSRF, `{"text":"turn left"}`, keyed); code != http.StatusAccepted || again != steered {
		t.Errorf("console: steer retried after the finish: %d %s, first %s", code, again, steered)
	}
	tr, err := sub.LoadTranscript(ctx, running)
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, m := range tr.Messages {
		if m.Role == agent.RoleUser {
			users = append(users, m.TextOf())
		}
	}
	if strings.Join(users, "|") != "tell a story|turn left|and then?" {
		t.Errorf("the steered run's user messages: %q", users)
	}

	// Abort of the queued run: the control message waits in AGENTS_CONTROL
	// for the run's pickup.
	if code, b := p.post(t, "/api/runs/acl-console-idle/abort", session.CSRF, `{"reason":"not needed"}`); code != http.StatusAccepted {
		t.Fatalf("console: abort: %d %s", code, b)
	}
	{
		st, err := wc.JetStream().Stream(ctx, names.ControlStream())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.GetLastMsgForSubject(ctx, names.Control("acl-console-idle", bus.KindAbort)); err != nil {
			t.Errorf("the console's abort is not stored: %v", err)
		}
	}

	// Approvals: a submitter's run whose call waits; the console lists it
	// (a bounded listing of the records and the run's events) and answers
	// it with edited arguments; the answer as stored is the edit.
	{
		gated := "acl-console-gated"
		req := `{"prompt":"what is 6*7?","tools":["calculator"],"approval":{"tools":["calculator"]},"model":{"provider":"faux","id":"scripted"},
		 "faux":{"responses":[{"content":[{"type":"toolCall","id":"c1","name":"calculator","arguments":{"expression":"6*7"}}],"stopReason":"toolUse"},
		 {"content":[{"type":"text","text":"done"}]}]}}`
		if _, err := sub.SubmitRaw(ctx, "", gated, []byte(req)); err != nil {
			t.Fatalf("submitter: submit: %v", err)
		}
		var page struct {
			Calls []bus.PendingCall `json:"calls"`
		}
		for deadline := time.Now().Add(30 * time.Second); len(page.Calls) == 0 && time.Now().Before(deadline); {
			p.getJSON(t, "/api/approvals", &page)
			time.Sleep(50 * time.Millisecond)
		}
		if len(page.Calls) != 1 || page.Calls[0].Run != gated || page.Calls[0].ToolName != "calculator" || len(page.Calls[0].Parameters) == 0 {
			t.Fatalf("console: approvals %+v", page.Calls)
		}
		code, body := p.post(t, "/api/runs/"+gated+"/approve", session.CSRF, `{"toolCallId":"c1","decision":"approve","arguments":{"expression":"6*8"}}`)
		if code != http.StatusAccepted {
			t.Fatalf("console: approve: %d %s", code, body)
		}
		var ack struct {
			ControlSeq uint64 `json:"controlSeq"`
		}
		_ = json.Unmarshal([]byte(body), &ack)
		tr, err := sub.LoadTranscript(ctx, gated)
		if err != nil || !tr.Done() {
			t.Fatalf("the gated run: %v", err)
		}
		for _, m := range tr.Messages {
			if m.Role == agent.RoleToolResult && m.TextOf() != "48" {
				t.Errorf("the approved call ran with %q, want the edit's 48", m.TextOf())
			}
		}
		var answer struct {
			Arguments map[string]any `json:"arguments"`
			By        string         `json:"by"`
		}
		p.getJSON(t, "/api/runs/"+gated+"/answers/"+strconv.FormatUint(ack.ControlSeq, 10), &answer)
		if answer.Arguments["expression"] != "6*8" || answer.By != "console" {
			t.Errorf("console: the stored answer %+v", answer)
		}
	}

	// The fleet page's history: the console made its stream and stores a
	// sample every 10 s.
	{
		var h struct {
			Samples []json.RawMessage `json:"samples"`
			Problem string            `json:"problem"`
		}
		for deadline := time.Now().Add(30 * time.Second); len(h.Samples) == 0 && h.Problem == "" && time.Now().Before(deadline); {
			p.getJSON(t, "/api/fleet/history", &h)
			time.Sleep(100 * time.Millisecond)
		}
		if h.Problem != "" || len(h.Samples) == 0 {
			t.Errorf("console: history %d samples, problem %q", len(h.Samples), h.Problem)
		}
		sctx, scancel := short()
		defer scancel()
		st, err := cons.JetStream().Stream(sctx, "AGENTS_CONSOLE") // the role reads its own stream
		if err != nil {
			t.Fatalf("the console's history stream: %v", err)
		}
		if _, err := st.GetLastMsgForSubject(sctx, "agents.console.samples"); err != nil {
			t.Errorf("no sample stored: %v", err)
		}
	}

	// The Schedules page (protocol 1.10): a submitter's paused schedule
	// is listed, then triggered and resumed through the console.
	{
		req, err := json.Marshal(fauxRun("tick", fleettest.Text("tock")))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sub.CreateSchedule(ctx, &bus.Schedule{Name: "acl-console-tick", Queue: bus.DefaultQueue, Every: "1h", Paused: true, Request: req}, false); err != nil {
			t.Fatalf("submitter: schedule: %v", err)
		}
		var list struct {
			Schedules []bus.ScheduleInfo `json:"schedules"`
		}
		p.getJSON(t, "/api/schedules", &list)
		if len(list.Schedules) != 1 || list.Schedules[0].Name != "acl-console-tick" || !list.Schedules[0].Paused {
			t.Errorf("console: /api/schedules %+v", list.Schedules)
		}
		for _, action := range []string{"trigger", "resume"} {
			if code, b := p.post(t, "/api/schedules/acl-console-tick/"+action, session.CSRF, `{}`); code != http.StatusOK {
				t.Errorf("console: schedule %s: %d %s", action, code, b)
			}
		}
	}

	// All of that within the role: no violation by the console.
	if v := serverLog.Lines("Violation", `"AGENTS/user:console"`); len(v) > 0 {
		t.Errorf("the console's work caused permissions violations:\n%s", strings.Join(v, "\n"))
	}
	if logs := p.stderr.String(); strings.Contains(logs, "Violation") {
		t.Errorf("the console logged a permissions violation:\n%s", logs)
	}

	// What the console user must not do.
	refused := func(what, subject string, err error) {
		t.Helper()
		denied(t, cons, what, subject, err)
		if !serverLog.Violation("console", subject) {
			t.Errorf("%s: the server logged no permissions violation of user console on %s; its violations:\n%s", what, subject, violationLines(serverLog))
		}
	}
	forged := []byte(`{"run":"acl-console-forged","seq":1,"attempt":1,"worker":"evil","ts":1,"event":{"type":"run_finished","status":"failed"}}`)
	{
		c, cl := deny()
		_, err := cons.JetStream().Publish(c, names.Events("acl-console-forged"), forged)
		cl()
		refused("console publishes an event", names.Events("acl-console-forged"), err)
		noMsg(t, wc, names.EventsStream(), names.Events("acl-console-forged"), "console's forged event")
	}
	{
		c, cl := deny()
		_, err := cons.JetStream().Publish(c, names.Record(done.ID), []byte(`{"id":"acl-console-done","state":"failed"}`))
		cl()
		refused("console writes a record", names.Record(done.ID), err)
		if rec, err := sub.Status(ctx, done.ID); err != nil || rec.State != bus.StatusSucceeded {
			t.Errorf("the record after the console's write: %v %+v", err, rec)
		}
		c, cl = deny()
		_, err = cons.JetStream().Publish(c, names.Record("acl-console-forged"), []byte(`{"id":"acl-console-forged","state":"succeeded"}`))
		cl()
		refused("console writes a new record", names.Record("acl-console-forged"), err)
		if _, err := sub.Status(ctx, "acl-console-forged"); !errors.Is(err, bus.ErrRunNotFound) {
			t.Errorf("the console's forged record: status says %v", err)
		}
	}
	{
		c, cl := deny()
		_, err := cons.JetStream().Publish(c, "$KV.agents_workers.forged", []byte(`{"worker":"forged"}`))
		cl()
		refused("console forges a worker's presence", "$KV.agents_workers.forged", err)
	}
	// Taking requests off the queue: pulling from the workers' consumer,
	// or making a consumer of its own.
	{
		next := "$JS.API.CONSUMER.MSG.NEXT." + names.RunsStream() + "." + names.Consumer(bus.DefaultQueue)
		c, cl := deny()
		_, err := cons.Conn().RequestWithContext(c, next, []byte(`{"batch":1}`))
		cl()
		refused("console pulls requests off the work queue", next, err)
		create := "$JS.API.CONSUMER.CREATE." + names.RunsStream() + ".thief"
		c, cl = deny()
		_, err = cons.Conn().RequestWithContext(c, create, []byte(`{"stream_name":"`+names.RunsStream()+`","config":{"name":"thief","ack_policy":"explicit"}}`))
		cl()
		refused("console makes a consumer on the work queue", create, err)
		ack := "$JS.ACK." + names.RunsStream() + ".workers-default.1.1.1.1.0"
		c, cl = deny()
		_, err = cons.Conn().RequestWithContext(c, ack, nil)
		cl()
		refused("console acknowledges a request", ack, err)
		del := "$JS.API.STREAM.MSG.DELETE." + names.RunsStream()
		c, cl = deny()
		_, err = cons.Conn().RequestWithContext(c, del, []byte(`{"seq":1}`))
		cl()
		refused("console deletes a request", del, err)
	}
	// Its own stream is the only one it may make, and it may not remove it
	// (nor any other).
	{
		create := "$JS.API.STREAM.CREATE.AGENTS_EVIL"
		c, cl := deny()
		_, err := cons.Conn().RequestWithContext(c, create, []byte(`{"name":"AGENTS_EVIL","subjects":["evil.>"]}`))
		cl()
		refused("console creates another stream", create, err)
		for _, del := range []string{"$JS.API.STREAM.DELETE.AGENTS_CONSOLE", "$JS.API.STREAM.PURGE.AGENTS_EVENTS", "$JS.API.STREAM.UPDATE.AGENTS_CONSOLE"} {
			c, cl = deny()
			_, err = cons.Conn().RequestWithContext(c, del, nil)
			cl()
			refused("console: "+del, del, err)
		}
	}
	// Another account: its streams are not there for the console, and the
	// console cannot reach them by name either.
	{
		c, cl := short()
		_, err := other.JetStream().CreateStream(c, jetstream.StreamConfig{Name: "OTHER_SECRETS", Subjects: []string{"secrets.>"}})
		cl()
		if err != nil {
			t.Fatalf("other account: create stream: %v", err)
		}
		c, cl = short()
		_, err = other.JetStream().Publish(c, "secrets.a", []byte("other account's secret"))
		cl()
		if err != nil {
			t.Fatalf("other account: publish: %v", err)
		}
		c, cl = deny()
		_, err = cons.JetStream().Stream(c, "OTHER_SECRETS")
		cl()
		refused("console reads another account's stream", "$JS.API.STREAM.INFO.OTHER_SECRETS", err)
		if _, err := cons.Conn().SubscribeSync("secrets.>"); err == nil {
			_ = cons.Conn().Flush()
			if !serverLog.Violation("console", "secrets.>") {
				t.Errorf("console subscribed to secrets.> without a permissions violation")
			}
		}
	}

	// The console kept serving after its user's refusals, and the records
	// are as the worker wrote them.
	p.waitRun(t, done.ID, func(r bus.RunRecord) bool { return r.State == bus.StatusSucceeded })
}
