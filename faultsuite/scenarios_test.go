//go:build fault && linux

package faultsuite

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// Scenario 1: kill -9 a worker at random points of 50 tool-using runs, with
// a second worker running (each killed worker is restarted at once, so two
// are always up). All 50 succeed; every transcript is complete and in
// order; no prompt, steer or follow-up is missing or doubled.
func TestKill9Workers(t *testing.T) {
	start := time.Now()
	r := seed(t)
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	procs := []*proc{f.startWorker("a1"), f.startWorker("b1")}
	gen := map[string]int{"a": 1, "b": 1}
	d := newDriver(t, f)
	// 40 runs get their controls while running, 10 before pickup.
	plans := makePlans(r, "k9", 50, func(i int) bool { return i%5 != 0 }, 160)
	d.submit(plans...)
	const maxKills = 10
	kills := 0
	var killLog []string
	for kills < maxKills {
		time.Sleep(time.Duration(1500+r.IntN(2500)) * time.Millisecond)
		name := []string{"a", "b"}[r.IntN(2)]
		id := fmt.Sprintf("%s%d", name, gen[name])
		p := f.worker(id)
		p.kill()
		kills++
		killLog = append(killLog, fmt.Sprintf("%s@%.1fs", id, time.Since(start).Seconds()))
		gen[name]++
		procs = append(procs, f.startWorker(fmt.Sprintf("%s%d", name, gen[name])))
	}
	t.Logf("kill -9: %d kills (%s)", kills, strings.Join(killLog, " "))
	d.waitAll(5 * time.Minute)
	d.report("scenario 1 (kill -9)", bus.StatusSucceeded, fmt.Sprintf("with %d kill -9 of workers; %d runs handed back by log", kills,
		countLines(procs, "handed back")))
	t.Logf("scenario 1 took %s", time.Since(start).Round(time.Second))
}

// Scenario 2: SIGTERM every worker in turn (rolling restart, two rounds over
// three workers) during 100 runs: each worker exits 0 within its drain
// budget, its runs continue elsewhere, and all 100 finish.
func TestRollingRestart(t *testing.T) {
	start := time.Now()
	r := seed(t)
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	f.drain = time.Second
	names := []string{"a", "b", "c"}
	gen := map[string]int{}
	var procs []*proc
	for _, n := range names {
		gen[n] = 1
		procs = append(procs, f.startWorker(n+"1"))
	}
	d := newDriver(t, f)
	plans := makePlans(r, "roll", 100, func(i int) bool { return i%2 == 0 }, 120)
	d.submit(plans...)
	restarts := 0
	for round := range 2 {
		for _, n := range names {
			time.Sleep(time.Duration(1500+r.IntN(1500)) * time.Millisecond)
			id := fmt.Sprintf("%s%d", n, gen[n])
			p := f.worker(id)
			sent := time.Now()
			p.signal(syscall.SIGTERM)
			code, err := p.waitExit(f.drain + 30*time.Second)
			if err != nil {
				t.Errorf("FAIL round %d: worker %s: %v", round, id, err)
				p.kill()
			} else if code != 0 {
				t.Errorf("FAIL round %d: worker %s exited %d after SIGTERM; last lines:\n%s", round, id, code, p.tail(20))
			}
			took := time.Since(sent)
			if took > f.drain+15*time.Second {
				t.Errorf("FAIL: worker %s took %s to exit after SIGTERM (drain timeout %s)", id, took, f.drain)
			}
			restarts++
			gen[n]++
			procs = append(procs, f.startWorker(fmt.Sprintf("%s%d", n, gen[n])))
			t.Logf("rolling: %s stopped in %s (exit %d), replaced by %s%d", id, took.Round(time.Millisecond), code, n, gen[n])
		}
	}
	d.waitAll(5 * time.Minute)
	d.report("scenario 2 (rolling restart)", bus.StatusSucceeded, fmt.Sprintf("with %d SIGTERM restarts; %d runs handed back by log", restarts,
		countLines(procs, "handed back")))
	t.Logf("scenario 2 took %s", time.Since(start).Round(time.Second))
}

// Scenario 3: restart the NATS server (file storage) mid-run, twice: a kill
// -9 with a 1s outage (shorter than AckWait: workers keep their runs) and
// a graceful stop with an outage longer than AckWait (runs are redelivered
// and resume). All runs finish.
func TestNATSRestart(t *testing.T) {
	start := time.Now()
	r := seed(t)
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	procs := []*proc{f.startWorker("a1"), f.startWorker("b1")}
	d := newDriver(t, f)
	plans := makePlans(r, "nrs", 40, func(i int) bool { return i%2 == 0 }, 200)
	d.submit(plans...)

	time.Sleep(3 * time.Second)
	nc.kill(0)
	t.Logf("nats: kill -9 at %.1fs", time.Since(start).Seconds())
	time.Sleep(time.Second)
	nc.start(0)
	t.Logf("nats: restarted at %.1fs (outage 1s < AckWait %s)", time.Since(start).Seconds(), f.ackWait)

	time.Sleep(4 * time.Second)
	nc.nodes[0].p.signal(syscall.SIGTERM)
	if _, err := nc.nodes[0].p.waitExit(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	down := f.ackWait + 2*time.Second
	t.Logf("nats: stopped (SIGTERM) at %.1fs for %s (> AckWait)", time.Since(start).Seconds(), down)
	time.Sleep(down)
	nc.start(0)
	t.Logf("nats: restarted at %.1fs", time.Since(start).Seconds())

	d.waitAll(5 * time.Minute)
	for _, p := range procs {
		if p.exited() {
			t.Errorf("FAIL: worker %s exited during the NATS restarts; last lines:\n%s", p.name, p.tail(20))
		}
	}
	d.report("scenario 3 (NATS restart)", bus.StatusSucceeded, fmt.Sprintf("with 2 NATS restarts; %d reconnects by log, %d runs handed back",
		countLines(procs, "nats reconnected"), countLines(procs, "handed back")))
	t.Logf("scenario 3 took %s", time.Since(start).Round(time.Second))
}

// Scenario 4: a 3-node cluster with R3 streams; the node leading
// AGENTS_EVENTS is killed mid-run. All runs finish.
func TestClusterNodeLoss(t *testing.T) {
	start := time.Now()
	r := seed(t)
	dir := workDir(t)
	nc := startNATS(t, dir, 3, "")
	f := newFleet(t, dir, nc)
	streams := bus.StreamsConfig{Queues: []string{"default"}, Replicas: 3, AckWait: f.ackWait, MaxDeliver: f.maxDeliver}
	// R3 streams first; then a worker WITHOUT a replicas setting, which must
	// not scale them down, and one with it.
	ctx0, cancel0 := f.ctx(60 * time.Second)
	err0 := f.c.EnsureStreams(ctx0, streams)
	cancel0()
	if err0 != nil {
		t.Fatalf("EnsureStreams R3: %v", err0)
	}
	procs := []*proc{f.startWorker("a1")}
	if bins.replicasFlag != "" {
		f.extraArgs = []string{bins.replicasFlag, "3"}
	}
	procs = append(procs, f.startWorker("b1"))
	if bad := replicaCounts(t, f); len(bad) > 0 {
		t.Errorf("FAIL: after the workers started, these are not R3: %s. A worker without a replicas setting scaled existing R3 "+
			"streams down; restoring R3 from the test to go on", strings.Join(bad, ", "))
		ctx, cancel := f.ctx(60 * time.Second)
		err := f.c.EnsureStreams(ctx, streams)
		cancel()
		if err != nil {
			t.Fatalf("EnsureStreams R3: %v", err)
		}
		if bad := replicaCounts(t, f); len(bad) > 0 {
			t.Fatalf("still not R3: %s", strings.Join(bad, ", "))
		}
	}
	d := newDriver(t, f)
	plans := makePlans(r, "r3", 40, func(i int) bool { return i%2 == 0 }, 200)
	d.submit(plans...)
	time.Sleep(3 * time.Second)
	// First a graceful leader change of the events stream while the runs
	// publish (their open event batches are the old leader's), then the
	// new leader killed.
	old := eventsLeader(t, f)
	stepDown(t, f, f.c.Names().EventsStream())
	leader := old
	for deadline := time.Now().Add(30 * time.Second); leader == old || leader == ""; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still led by %q 30 s after a step-down", f.c.Names().EventsStream(), leader)
		}
		leader = eventsLeader(t, f)
	}
	t.Logf("cluster: %s stepped down from %q to %q at %.1fs", f.c.Names().EventsStream(), old, leader, time.Since(start).Seconds())
	time.Sleep(3 * time.Second)
	if leader = eventsLeader(t, f); leader == "" {
		t.Fatalf("%s has no leader 3 s after its step-down", f.c.Names().EventsStream())
	}
	victim := 0
	for i, nd := range nc.nodes {
		if nd.name == leader {
			victim = i
		}
	}
	nc.kill(victim)
	t.Logf("cluster: killed %s (leader of %s: %q) at %.1fs", nc.nodes[victim].name, f.c.Names().EventsStream(), leader, time.Since(start).Seconds())
	d.waitAll(5 * time.Minute)
	d.report("scenario 4 (3-node cluster, node killed)", bus.StatusSucceeded, fmt.Sprintf("with node %s killed; %d runs handed back by log",
		nc.nodes[victim].name, countLines(procs, "handed back")))
	t.Logf("scenario 4 took %s", time.Since(start).Round(time.Second))
}

// eventsLeader returns the node leading the events stream ("" if none
// is known now).
func eventsLeader(t *testing.T, f *fleet) string {
	ctx, cancel := f.ctx(10 * time.Second)
	defer cancel()
	s, err := f.c.JetStream().Stream(ctx, f.c.Names().EventsStream())
	if err != nil {
		return ""
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}

// stepDown asks a stream's leader to step down (nats stream cluster
// step-down).
func stepDown(t *testing.T, f *fleet, stream string) {
	t.Helper()
	m, err := f.c.Conn().Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil, 10*time.Second)
	if err != nil {
		t.Fatalf("step-down of %s: %v", stream, err)
	}
	if strings.Contains(string(m.Data), `"error"`) {
		t.Fatalf("step-down of %s: %s", stream, m.Data)
	}
}

// replicaCounts returns the streams, consumer and bucket that are not R3.
func replicaCounts(t *testing.T, f *fleet) []string {
	ctx, cancel := f.ctx(20 * time.Second)
	defer cancel()
	n := f.c.Names()
	var bad []string
	for _, name := range []string{n.RunsStream(), n.EventsStream(), n.ControlStream(), "KV_" + n.RecordsBucket()} {
		s, err := f.c.JetStream().Stream(ctx, name)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s (%v)", name, err))
			continue
		}
		info, err := s.Info(ctx)
		if err != nil || info.Config.Replicas != 3 {
			bad = append(bad, fmt.Sprintf("stream %s R%d", name, info.Config.Replicas))
		}
		if name == n.RunsStream() {
			ci, err := s.Consumer(ctx, n.Consumer("default"))
			if err == nil {
				cinfo, err := ci.Info(ctx)
				if err == nil && cinfo.Config.Replicas != 3 && cinfo.Config.Replicas != 0 {
					bad = append(bad, fmt.Sprintf("consumer %s R%d", n.Consumer("default"), cinfo.Config.Replicas))
				}
			}
		}
	}
	return bad
}

// Scenario 5: the worker running a run is frozen (SIGSTOP) past AckWait,
// the request is redelivered to the other worker, then the frozen one is
// resumed (SIGCONT). The run finishes once (one run_finished, by the second
// worker, attempt 2, no third delivery), and the frozen worker stops its
// copy: it publishes nothing once it can know it lost the lease (one
// heartbeat after SIGCONT), and never writes the record again.
func TestFrozenWorker(t *testing.T) {
	start := time.Now()
	r := seed(t)
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	f.startWorker("fa")
	f.startWorker("fb")
	d := newDriver(t, f)
	plans := makePlans(r, "frz", 1, func(int) bool { return true }, 600)
	p := plans[0]
	p.req.Faux.TokensPerSecond = 40
	streaming := make(chan struct{})
	var once sync.Once
	d.onHook(func(env *bus.Envelope) {
		if env.Run == p.id && env.Attempt == 1 && env.Type == string(agent.EventMessageUpdate) {
			once.Do(func() { close(streaming) })
		}
	})
	d.submit(p)
	select {
	case <-streaming:
	case <-time.After(60 * time.Second):
		t.Fatal("the run never streamed")
	}
	// Freeze once the answer text streams (after the tool calls).
	time.Sleep(1500 * time.Millisecond)
	frozenID := d.startedBy(p.id, 1)
	frozen := f.worker(frozenID)
	if frozen == nil {
		t.Fatalf("attempt 1 was started by unknown worker %q", frozenID)
	}
	frozen.signal(syscall.SIGSTOP)
	t.Cleanup(func() { frozen.signal(syscall.SIGCONT) })
	tStop := time.Now()
	t.Logf("froze %s (SIGSTOP) at %.1fs", frozenID, time.Since(start).Seconds())
	deadline := time.Now().Add(3*f.ackWait + 15*time.Second)
	var other string
	for other == "" && time.Now().Before(deadline) {
		other = d.startedBy(p.id, 2)
		time.Sleep(100 * time.Millisecond)
	}
	if other == "" {
		frozen.signal(syscall.SIGCONT)
		t.Fatalf("FAIL: no attempt 2 within %s of freezing %s (AckWait %s)", time.Since(tStop).Round(time.Millisecond), frozenID, f.ackWait)
	}
	t.Logf("attempt 2 started by %s %.1fs after the freeze", other, time.Since(tStop).Seconds())
	time.Sleep(1500 * time.Millisecond)
	frozen.signal(syscall.SIGCONT)
	tCont := time.Now()
	t.Logf("resumed %s (SIGCONT) after %.1fs frozen", frozenID, tCont.Sub(tStop).Seconds())
	d.waitAll(2 * time.Minute)
	hb := f.ackWait / 4
	time.Sleep(3 * hb) // let the resumed worker do whatever it does
	checks := d.report("scenario 5 (frozen worker)", bus.StatusSucceeded, fmt.Sprintf("with %s frozen %.1fs", frozenID, tCont.Sub(tStop).Seconds()))

	ctx, cancel := f.ctx(30 * time.Second)
	defer cancel()
	raw, err := rawEvents(ctx, f.c, p.id)
	if err != nil {
		t.Fatal(err)
	}
	grace := tCont.Add(hb + time.Second).UnixMilli()
	var late, afterNewer []string
	newest, maxAttempt := 0, 0
	for _, env := range raw {
		maxAttempt = max(maxAttempt, env.Attempt)
		if env.Type == bus.EventRunStarted {
			newest = max(newest, env.Attempt)
		}
		if env.Worker != frozenID {
			continue
		}
		if env.Attempt < newest {
			afterNewer = append(afterNewer, fmt.Sprintf("%d:%s", env.Seq, env.Type))
		}
		if env.TS > grace {
			late = append(late, fmt.Sprintf("%d:%s@+%dms", env.Seq, env.Type, env.TS-tCont.UnixMilli()))
		}
	}
	t.Logf("frozen worker %s: %d events stored after attempt 2 started (ignored by followers): %s", frozenID, len(afterNewer), clip(strings.Join(afterNewer, " "), 600))
	if len(late) > 0 {
		t.Errorf("FAIL [lease]: frozen worker %s published %d events more than one heartbeat (%s) + 1s after SIGCONT, when it must have known it lost the lease: %s",
			frozenID, len(late), hb, clip(strings.Join(late, " "), 800))
	}
	if maxAttempt != 2 {
		t.Errorf("FAIL [lease]: the run had %d attempts, want 2 (the frozen worker must not hand the request back or ack it)", maxAttempt)
	}
	rec, err := f.c.Status(ctx, p.id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Worker != other || rec.State != bus.StatusSucceeded || rec.Attempt != 2 {
		t.Errorf("FAIL [lease]: final record is %s attempt %d by %s, want succeeded attempt 2 by %s", rec.State, rec.Attempt, rec.Worker, other)
	}
	if len(checks) == 1 && checks[0].worker != other {
		t.Errorf("FAIL [lease]: run_finished published by %s, want %s", checks[0].worker, other)
	}
	if frozen.exited() {
		t.Errorf("FAIL: the frozen worker exited after SIGCONT; last lines:\n%s", frozen.tail(20))
	}
	var said []string
	for _, l := range frozen.linesSince(tCont) {
		if strings.Contains(l, p.id) {
			said = append(said, l)
		}
	}
	t.Logf("frozen worker's log about the run after SIGCONT:\n    %s", strings.Join(said, "\n    "))
	t.Logf("scenario 5 took %s", time.Since(start).Round(time.Second))
}
