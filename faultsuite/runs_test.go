//go:build fault && linux

package faultsuite

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// runPlan is one run the suite submits: its request and the control
// messages it sends to it.
type runPlan struct {
	id        string
	prompt    string
	req       *bus.RunRequest
	steers    []string
	followUps []string
	// live: send the controls when the run's first tool starts (else right
	// after submitting, before pickup).
	live bool

	mu        sync.Mutex
	triggered bool
	sent      []sentControl
}

type sentControl struct {
	kind, text string
	seq        uint64
	err        error
}

func toolCall(id, name string, args map[string]any) agent.ScriptedResponse {
	return agent.ScriptedResponse{Content: []agent.Content{agent.ToolCall(id, name, args)}, StopReason: agent.StopReasonToolUse}
}

// toolRequest is a tool-using faux run: three tool calls (calculator, sleep,
// calculator), then paced text answers; extra answers serve the turns that
// steering and follow-ups add, and attempts that start the script over.
func toolRequest(r *rand.Rand, prompt string, tps float64, textChars int) *bus.RunRequest {
	resps := []agent.ScriptedResponse{
		toolCall("c1", "calculator", map[string]any{"expression": fmt.Sprintf("%d*%d", r.IntN(90)+10, r.IntN(90)+10)}),
		toolCall("c2", "sleep", map[string]any{"seconds": 0.2 + r.Float64()*0.4}),
		toolCall("c3", "calculator", map[string]any{"expression": "2^10-24"}),
	}
	for i := range 12 {
		text := fmt.Sprintf("Answer %d: ", i+1)
		for len(text) < textChars {
			text += "the result is one thousand, as computed; "
		}
		resps = append(resps, agent.ScriptedResponse{Content: []agent.Content{agent.Text(text[:textChars])}})
	}
	return &bus.RunRequest{Prompt: prompt, Model: &bus.ModelRef{Provider: "faux", ID: "fault"},
		Tools: []string{"calculator", "sleep"},
		Faux:  &bus.FauxScript{Responses: resps, TokenSize: 2, TokensPerSecond: tps}}
}

// driver submits runs, sends their controls and watches their events live.
type driver struct {
	t     *testing.T
	f     *fleet
	plans map[string]*runPlan
	order []string
	sub   *nats.Subscription

	mu     sync.Mutex
	starts map[string]map[int]string // run -> attempt -> worker of run_started
	hooks  []func(*bus.Envelope)
	sends  sync.WaitGroup
}

func newDriver(t *testing.T, f *fleet) *driver {
	d := &driver{t: t, f: f, plans: map[string]*runPlan{}, starts: map[string]map[int]string{}}
	sub, err := f.c.Conn().Subscribe(f.c.Names().Events("*"), d.onEvent)
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, 256<<20)
	d.sub = sub
	t.Cleanup(func() {
		_ = sub.Unsubscribe()
		d.sends.Wait()
	})
	return d
}

// onHook registers a function called with every live envelope.
func (d *driver) onHook(fn func(*bus.Envelope)) {
	d.mu.Lock()
	d.hooks = append(d.hooks, fn)
	d.mu.Unlock()
}

func (d *driver) onEvent(m *nats.Msg) {
	env, err := bus.DecodeEnvelope(m.Data)
	if err != nil {
		return
	}
	d.mu.Lock()
	p := d.plans[env.Run]
	if env.Type == bus.EventRunStarted {
		if d.starts[env.Run] == nil {
			d.starts[env.Run] = map[int]string{}
		}
		d.starts[env.Run][env.Attempt] = env.Worker
	}
	hooks := d.hooks
	d.mu.Unlock()
	for _, h := range hooks {
		h(env)
	}
	if p == nil || !p.live || env.Type != string(agent.EventToolExecutionStart) {
		return
	}
	p.mu.Lock()
	first := !p.triggered
	p.triggered = true
	p.mu.Unlock()
	if first {
		d.sends.Add(1)
		go func() {
			defer d.sends.Done()
			d.sendControls(p)
		}()
	}
}

// startedBy returns the worker of a run's attempt's run_started, or "".
func (d *driver) startedBy(run string, attempt int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts[run][attempt]
}

// submit stores the runs' requests; controls of runs that are not live go
// right after each submit.
func (d *driver) submit(plans ...*runPlan) {
	d.t.Helper()
	for _, p := range plans {
		d.mu.Lock()
		d.plans[p.id] = p
		d.order = append(d.order, p.id)
		d.mu.Unlock()
		p.req.ID = p.id
		ctx, cancel := d.f.ctx(20 * time.Second)
		_, err := d.f.c.Submit(ctx, "", p.req)
		cancel()
		if err != nil {
			d.t.Fatalf("submit %s: %v", p.id, err)
		}
		if !p.live {
			d.sendControls(p)
		}
	}
}

// sendControls sends a plan's steers and follow-ups, interleaved, each kind
// in order. A failed publish (NATS restarting) is retried for 30s with the
// same message id (bus.WithControlID): a kill -9 may have stored it with
// its ack lost, and a blind retry would store a second copy, delivered as
// a second message.
func (d *driver) sendControls(p *runPlan) {
	n := max(len(p.steers), len(p.followUps))
	for i := range n {
		for _, kc := range []struct {
			kind  string
			texts []string
		}{{bus.KindSteer, p.steers}, {bus.KindFollowUp, p.followUps}} {
			if i >= len(kc.texts) {
				continue
			}
			sc := sentControl{kind: kc.kind, text: kc.texts[i]}
			deadline := time.Now().Add(30 * time.Second)
			for {
				ctx, cancel := d.f.ctx(5 * time.Second)
				sc.seq, sc.err = d.f.c.SendControl(ctx, p.id, kc.kind, bus.Control{Text: sc.text}, bus.WithControlID(strconv.Itoa(i)))
				cancel()
				if sc.err == nil || errors.Is(sc.err, bus.ErrRunFinished) || time.Now().After(deadline) {
					break
				}
				time.Sleep(300 * time.Millisecond)
			}
			p.mu.Lock()
			p.sent = append(p.sent, sc)
			p.mu.Unlock()
		}
	}
}

// waitAll waits until every run has a finished record, printing progress;
// while waiting, tick (if set) is called every 100ms and may return false to
// stop calling it.
func (d *driver) waitAll(timeout time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	lastLog := time.Now()
	pending := append([]string(nil), d.order...)
	for {
		var still []string
		states := map[string]int{}
		for _, id := range pending {
			ctx, cancel := d.f.ctx(5 * time.Second)
			rec, err := d.f.c.Status(ctx, id)
			cancel()
			switch {
			case err != nil:
				states["unknown"]++
				still = append(still, id)
			case rec.Finished():
			default:
				states[rec.State]++
				still = append(still, id)
			}
		}
		pending = still
		if len(pending) == 0 {
			d.sends.Wait()
			return
		}
		if time.Since(lastLog) > 10*time.Second {
			d.t.Logf("waiting: %d of %d runs not finished %v", len(pending), len(d.order), states)
			lastLog = time.Now()
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for i, id := range pending {
				if i == 20 {
					fmt.Fprintf(&b, "\n    … and %d more", len(pending)-20)
					break
				}
				ctx, cancel := d.f.ctx(5 * time.Second)
				rec, err := d.f.c.Status(ctx, id)
				cancel()
				if err != nil {
					fmt.Fprintf(&b, "\n    %s: %v", id, err)
				} else {
					fmt.Fprintf(&b, "\n    %s: state %s attempt %d worker %s heartbeat %s ago", id, rec.State, rec.Attempt,
						rec.Worker, time.Since(rec.HeartbeatAt).Round(time.Millisecond))
				}
			}
			d.t.Fatalf("FAIL: %d of %d runs did not finish within %s:%s", len(pending), len(d.order), timeout, b.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// checks

// runCheck is what was checked of one run.
type runCheck struct {
	id           string
	finalAttempt int
	attempts     int
	resumed      bool
	restored     int
	stale        int
	resent       int // agent events stored twice (re-sent after a lost ack)
	messages     int
	prompts      int
	steers       int
	followUps    int
	finishes     int
	worker       string // of run_finished
	problems     []string
}

func (rc *runCheck) problem(kind, format string, args ...any) {
	rc.problems = append(rc.problems, fmt.Sprintf("[%s] %s: %s", kind, rc.id, fmt.Sprintf(format, args...)))
}

// checkRun verifies one finished run: exactly one run_finished (status
// want), the record agrees, the newest attempt's events are gapless, every
// redelivered attempt resumed, the transcript is complete and in order, and
// the prompt and every control message are in it exactly once, in the
// order sent.
func (d *driver) checkRun(p *runPlan, want string) *runCheck {
	rc := &runCheck{id: p.id}
	ctx, cancel := d.f.ctx(60 * time.Second)
	defer cancel()
	raw, err := rawEvents(ctx, d.f.c, p.id)
	if err != nil {
		rc.problem("events", "reading events: %v", err)
		return rc
	}
	// Raw analysis: attempts, gaps, stale events, run_finished count.
	seqs := map[int][]uint64{}
	// Protocol 1.4: an agent event re-sent after a lost ack may be stored
	// twice; the copy must be the same envelope (readers drop it by seq).
	first := map[[2]uint64]*bus.Envelope{}
	newest := 0
	for _, env := range raw {
		if env.Type == bus.EventRunStarted {
			newest = max(newest, env.Attempt)
		}
		if env.Attempt < newest {
			rc.stale++
		}
		key := [2]uint64{uint64(env.Attempt), env.Seq}
		if orig, ok := first[key]; ok {
			if env.Type == bus.EventRunStarted || env.Type == bus.EventRunResumed || env.Type == bus.EventRunFinished {
				rc.problem("events", "attempt %d: %s (seq %d) stored twice: lifecycle events carry a Nats-Msg-Id", env.Attempt, env.Type, env.Seq)
			} else if orig.TS != env.TS || orig.Type != env.Type || string(orig.Event) != string(env.Event) || orig.Worker != env.Worker {
				rc.problem("events", "attempt %d: seq %d stored twice with different contents (%s, %s)", env.Attempt, env.Seq, orig.Type, env.Type)
			}
			rc.resent++
			continue
		}
		first[key] = env
		seqs[env.Attempt] = append(seqs[env.Attempt], env.Seq)
		if env.Type == bus.EventRunFinished {
			rc.finishes++
			rc.worker = env.Worker
			if env.Attempt < newest {
				rc.problem("lease", "run_finished of stale attempt %d by %s stored after attempt %d started", env.Attempt, env.Worker, newest)
			}
		}
	}
	rc.attempts = len(seqs)
	if rc.finishes != 1 {
		rc.problem("events", "%d run_finished events, want exactly 1", rc.finishes)
	}
	if newest > 0 {
		for i, s := range seqs[newest] {
			if s != uint64(i+1) {
				rc.problem("events", "attempt %d: envelope %d has seq %d (gap or reorder)", newest, i+1, s)
				break
			}
		}
	}
	// The follower's view.
	tr, err := d.f.c.LoadTranscript(ctx, p.id)
	if err != nil {
		rc.problem("events", "LoadTranscript: %v", err)
		return rc
	}
	var mine bus.Transcript
	for _, env := range raw {
		_ = mine.Apply(env)
	}
	if len(mine.Messages) != len(tr.Messages) {
		rc.problem("events", "LoadTranscript has %d messages, the raw events %d", len(tr.Messages), len(mine.Messages))
	}
	rc.finalAttempt = tr.Attempt
	rc.messages = len(tr.Messages)
	if tr.Finished == nil {
		rc.problem("status", "no run_finished in the newest attempt %d", tr.Attempt)
		return rc
	}
	if tr.Finished.Status != want {
		rc.problem("status", "status %s (%s: %s), want %s", tr.Finished.Status, tr.Finished.Reason, clip(tr.Finished.Error, 200), want)
	}
	rec, err := d.f.c.Status(ctx, p.id)
	if err != nil {
		rc.problem("record", "status: %v", err)
	} else if rec.State != tr.Finished.Status || rec.Attempt != tr.Attempt {
		rc.problem("record", "record says %s attempt %d (worker %s), events say %s attempt %d", rec.State, rec.Attempt, rec.Worker, tr.Finished.Status, tr.Attempt)
	}
	if tr.Attempt > 1 {
		if tr.Resumed == nil {
			rc.problem("resume", "attempt %d started the run over: no run_resumed", tr.Attempt)
		} else {
			rc.resumed = true
			rc.restored = tr.Resumed.MessagesRestored
		}
	}
	if want != bus.StatusSucceeded {
		return rc
	}
	checkTranscript(rc, p, tr)
	return rc
}

// checkTranscript checks a succeeded run's transcript.
func checkTranscript(rc *runCheck, p *runPlan, tr *bus.Transcript) {
	msgs := tr.Messages
	if len(msgs) == 0 {
		rc.problem("transcript", "empty transcript")
		return
	}
	// Tool calls are answered before anything else happens, and every
	// result answers a call.
	var open map[string]bool
	for i, m := range msgs {
		switch m.Role {
		case agent.RoleAssistant:
			if len(open) > 0 {
				rc.problem("transcript", "message %d: assistant message while tool calls %v have no result", i, keys(open))
			}
			if m.StopReason == agent.StopReasonAborted || m.StopReason == agent.StopReasonError {
				rc.problem("transcript", "message %d: assistant message with stopReason %s (%s)", i, m.StopReason, clip(m.ErrorMessage, 100))
			}
			open = map[string]bool{}
			for _, c := range m.ToolCalls() {
				open[c.ID] = true
			}
		case agent.RoleToolResult:
			if !open[m.ToolCallID] {
				rc.problem("transcript", "message %d: tool result for %q answers no open call", i, m.ToolCallID)
			}
			delete(open, m.ToolCallID)
		case agent.RoleUser:
			if len(open) > 0 {
				rc.problem("transcript", "message %d: user message while tool calls %v have no result", i, keys(open))
			}
		}
	}
	last := msgs[len(msgs)-1]
	if last.Role != agent.RoleAssistant || last.StopReason != agent.StopReasonStop || last.TextOf() == "" {
		rc.problem("transcript", "does not end with a final answer: last message %s stopReason %q", last.Role, last.StopReason)
	}
	// User messages: the prompt first and once, each control once, in
	// the order sent, with its controlSeq.
	p.mu.Lock()
	sent := append([]sentControl(nil), p.sent...)
	p.mu.Unlock()
	seqOf := map[string]uint64{}
	order := map[string][]string{}
	for _, s := range sent {
		if s.err != nil {
			rc.problem("controls", "%s %q was not sent: %v", s.kind, s.text, s.err)
			continue
		}
		if s.seq > tr.Finished.LastControlSeq {
			rc.problem("controls", "%s %q (seq %d) came after the run's last control seq %d", s.kind, s.text, s.seq, tr.Finished.LastControlSeq)
		}
		seqOf[s.text] = s.seq
		order[s.kind] = append(order[s.kind], s.text)
	}
	count := map[string]int{}
	var users []string
	for i, m := range msgs {
		if m.Role != agent.RoleUser {
			continue
		}
		text := m.TextOf()
		count[text]++
		if text == p.prompt {
			rc.prompts++
			if i != 0 {
				rc.problem("transcript", "the prompt is message %d, not the first", i)
			}
			continue
		}
		users = append(users, text)
	}
	if count[p.prompt] != 1 {
		rc.problem("user", "the prompt is in the transcript %d times", count[p.prompt])
	}
	for text := range seqOf {
		if count[text] != 1 {
			rc.problem("user", "control message %q is in the transcript %d times", text, count[text])
		}
	}
	var gotSeqs, wantSeqs []uint64
	pos := map[string]int{}
	for i, text := range users {
		s, ok := seqOf[text]
		if !ok {
			rc.problem("user", "unexpected user message %q", clip(text, 80))
			continue
		}
		if _, seen := pos[text]; !seen {
			pos[text] = i
		}
		wantSeqs = append(wantSeqs, s)
	}
	gotSeqs = tr.ControlSeqs()
	if fmt.Sprint(gotSeqs) != fmt.Sprint(wantSeqs) {
		rc.problem("controls", "controlSeqs in the events %v, want %v (the seqs of the user messages in transcript order)", gotSeqs, wantSeqs)
	}
	for kind, texts := range order {
		for i := 1; i < len(texts); i++ {
			a, aok := pos[texts[i-1]]
			b, bok := pos[texts[i]]
			if aok && bok && a > b {
				rc.problem("user", "%s %q came before %q, sent in the other order", kind, texts[i], texts[i-1])
			}
		}
		if kind == bus.KindSteer {
			rc.steers += len(texts)
		} else {
			rc.followUps += len(texts)
		}
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// report checks every run, prints what was checked and fails the test with
// every problem found.
func (d *driver) report(scenario string, want string, extra string) []*runCheck {
	d.t.Helper()
	var problems []string
	kinds := map[string]int{}
	attempts := map[int]int{}
	var resumed, restored, stale, resent, messages, prompts, steers, followUps int
	// Checked eight at a time: thousands of runs one by one take minutes.
	checks := make([]*runCheck, len(d.order))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				checks[i] = d.checkRun(d.plans[d.order[i]], want)
			}
		})
	}
	for i := range d.order {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, rc := range checks {
		attempts[rc.finalAttempt]++
		if rc.resumed {
			resumed++
		}
		restored += rc.restored
		stale += rc.stale
		resent += rc.resent
		messages += rc.messages
		prompts += rc.prompts
		steers += rc.steers
		followUps += rc.followUps
		for _, pr := range rc.problems {
			kinds[pr[1:strings.IndexByte(pr, ']')]]++
		}
		problems = append(problems, rc.problems...)
	}
	var hist []string
	for _, a := range sortedInts(attempts) {
		hist = append(hist, fmt.Sprintf("attempt %d: %d", a, attempts[a]))
	}
	d.t.Logf("%s: CHECKED %d runs (want %s) %s; final attempts {%s}; %d resumed (%d messages restored); "+
		"%d stale-attempt events ignored; %d re-sent agent events stored twice (identical); %d transcript messages compared: %d prompts, %d steers, %d follow-ups each exactly once and in order",
		scenario, len(checks), want, extra, strings.Join(hist, ", "), resumed, restored, stale, resent, messages, prompts, steers, followUps)
	if len(problems) > 0 {
		var kk []string
		for k, n := range kinds {
			kk = append(kk, fmt.Sprintf("%s: %d", k, n))
		}
		sort.Strings(kk)
		shown := problems
		if len(shown) > 40 {
			shown = shown[:40]
		}
		d.t.Errorf("FAIL %s: %d problems (%s):\n  %s", scenario, len(problems), strings.Join(kk, ", "), strings.Join(shown, "\n  "))
	}
	return checks
}

func sortedInts(m map[int]int) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// plans makes n tool-using run plans with two steers and two follow-ups
// each; live ones send their controls when their first tool starts.
func makePlans(r *rand.Rand, prefix string, n int, live func(i int) bool, textChars int) []*runPlan {
	var out []*runPlan
	for i := range n {
		id := fmt.Sprintf("%s-%03d-%s", prefix, i, bus.NewRunID()[:6])
		p := &runPlan{id: id, prompt: "prompt of " + id, live: live(i),
			steers:    []string{"steer 1 of " + id, "steer 2 of " + id},
			followUps: []string{"follow-up 1 of " + id, "follow-up 2 of " + id}}
		p.req = toolRequest(r, p.prompt, 30+r.Float64()*30, textChars)
		out = append(out, p)
	}
	return out
}

// countLines counts output lines of the processes matching substr.
func countLines(ps []*proc, substr string) int {
	n := 0
	for _, p := range ps {
		for _, l := range p.output() {
			if strings.Contains(l, substr) {
				n++
			}
		}
	}
	return n
}
