package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

const scheduleUsage = `submit schedule create NAME (--cron "S M H DOM MON DOW" [--tz ZONE] | --every 1h | --at TIME) [run flags] "prompt"
submit schedule list [--json]
submit schedule show NAME [--runs N] [--lateness] [--json]
submit schedule pause|resume|delete|trigger NAME`

// cmdSchedule runs the schedule subcommands (protocol 1.10, docs/protocol.md §12).
func cmdSchedule(ctx context.Context, e *env, args []string) int {
	sub := ""
	if i := firstPositional(args); i >= 0 {
		sub = args[i]
		args = append(append([]string{}, args[:i]...), args[i+1:]...)
	}
	switch sub {
	case "create":
		return cmdScheduleCreate(ctx, e, args)
	case "list":
		return cmdScheduleList(ctx, e, args)
	case "show":
		return cmdScheduleShow(ctx, e, args)
	case "pause", "resume", "delete", "trigger":
		return cmdScheduleAct(ctx, e, sub, args)
	case "", "help":
		fmt.Fprintf(e.stdout, "Usage:\n  %s\n", strings.ReplaceAll(scheduleUsage, "\n", "\n  "))
		if sub == "" && !slices.Contains(args, "--help") && !slices.Contains(args, "-h") {
			return exitUsage
		}
		return exitOK
	}
	return fail(e, usagef("schedule %q: use create, list, show, pause, resume, delete or trigger", sub))
}

func cmdScheduleCreate(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "schedule create", strings.Split(scheduleUsage, "\n")[0])
	var cf conn
	var rf runFlags
	var cron, tz, every, at, overlap, catchUp string
	var replace, paused bool
	cf.register(fs.FlagSet, e)
	rf.register(fs.FlagSet, e)
	fs.StringVar(&cron, "cron", "", `six-field cron, seconds first ("0 0 9 * * MON")`)
	fs.StringVar(&tz, "tz", "", "time zone of --cron (IANA, e.g. Europe/Berlin); not with --every or --at")
	fs.StringVar(&every, "every", "", "fire every interval (whole seconds, at least 1s: 90s, 1h)")
	fs.StringVar(&at, "at", "", "fire once at this time (RFC 3339)")
	fs.StringVar(&overlap, "overlap", bus.OverlapSkip, "while the previous run still goes: skip the fire, allow it, or abort the previous run")
	fs.StringVar(&catchUp, "catch-up", bus.CatchUpOnce, "late fires after an outage: once (the newest runs) or none")
	fs.BoolVar(&replace, "replace", false, "replace a schedule of the same name")
	fs.BoolVar(&paused, "paused", false, "create it paused (resume starts it)")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) == 0 {
		return fail(e, usagef("schedule create needs a NAME"))
	}
	name := pos[0]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["id"] {
		return fail(e, usagef("--id: each fire gets its own run id (a hash of the schedule and the fire's planned time)"))
	}
	req, err := rf.build(e, fs.FlagSet, pos[1:])
	if err != nil {
		return fail(e, err)
	}
	req.ID = ""
	body, err := agent.MarshalJSON(req)
	if err != nil {
		return fail(e, err)
	}
	s := &bus.Schedule{Name: name, Queue: rf.queue, Cron: cron, TimeZone: tz, Every: every,
		Overlap: overlap, CatchUp: catchUp, Paused: paused, Request: body}
	var problems []string
	if at != "" {
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			problems = append(problems, fmt.Sprintf("--at %q: use RFC 3339 (2027-01-01T09:00:00Z)", at))
		} else {
			s.At = &t
		}
	}
	if err := s.Validate(); err != nil {
		var re *bus.RequestError
		if errors.As(err, &re) {
			problems = append(problems, re.Problems...)
		} else {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return fail(e, usagef("schedule %s:\n  %s", name, strings.Join(problems, "\n  ")))
	}
	ctx, cancel := interruptible(ctx, e)
	defer cancel()
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	if _, err := c.CreateSchedule(ctx, s, replace); err != nil {
		return fail(e, fleetError(c, err))
	}
	info, err := c.GetSchedule(ctx, name)
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	fmt.Fprintf(e.stdout, "schedule %s on queue %s: %s, next %s\n", name, s.Queue, specText(&info.Schedule), nextText(info))
	return exitOK
}

func specText(s *bus.Schedule) string {
	p := s.Pattern()
	if s.TimeZone != "" {
		p += " (" + s.TimeZone + ")"
	}
	return p
}

func nextText(info *bus.ScheduleInfo) string {
	switch {
	case info.Paused:
		return "- (paused)"
	case info.Next.IsZero():
		return "-"
	}
	return info.Next.Local().Format(time.RFC3339)
}

func cmdScheduleList(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "schedule list", "submit schedule list [--json]")
	var cf conn
	var asJSON bool
	cf.register(fs.FlagSet, e)
	fs.BoolVar(&asJSON, "json", false, "print a JSON array")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return fail(e, usagef("schedule list takes no arguments"))
	}
	ctx, cancel := interruptible(ctx, e)
	defer cancel()
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	list, err := c.ListSchedules(ctx)
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	if asJSON {
		return writeJSON(e, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(e.stderr, "no schedules")
		return exitOK
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tQUEUE\tSPEC\tNEXT\tLAST RUN\tOUTCOME\tPAUSED")
	for i := range list {
		info := &list[i]
		last, outcome := "-", "-"
		if info.Last != nil {
			last = info.Last.Run
			outcome = runOutcome(ctx, c, info.Last.Run)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%v\n", info.Name, info.Queue, specText(&info.Schedule), nextText(info), last, outcome, info.Paused)
	}
	_ = tw.Flush()
	return exitOK
}

func runOutcome(ctx context.Context, c *bus.Client, id string) string {
	rec, err := c.Status(ctx, id)
	if err != nil {
		return "?"
	}
	if rec.Reason != "" && rec.State != bus.StatusSucceeded {
		return rec.State + "/" + rec.Reason
	}
	return rec.State
}

func cmdScheduleShow(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "schedule show", "submit schedule show NAME [--runs N] [--lateness] [--json]")
	var cf conn
	var asJSON, lateness bool
	var runs int
	cf.register(fs.FlagSet, e)
	fs.BoolVar(&asJSON, "json", false, "print the schedule and its runs as JSON")
	fs.IntVar(&runs, "runs", 10, "show this many recent runs (0: all)")
	fs.BoolVar(&lateness, "lateness", false, "print the p50/p99 lateness (planned time to run start) of the runs shown")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return fail(e, usagef("schedule show takes one NAME"))
	}
	ctx, cancel := interruptible(ctx, e)
	defer cancel()
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	info, err := c.GetSchedule(ctx, pos[0])
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	recs, err := c.List(ctx, bus.ListOptions{Queue: info.Queue, Limit: runs, MaxScan: -1,
		Metadata: map[string]string{bus.MetaSchedule: info.Name}})
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	if asJSON {
		return writeJSON(e, struct {
			Schedule *bus.ScheduleInfo `json:"schedule"`
			Runs     []bus.RunRecord   `json:"runs"`
		}{info, orEmpty(recs)})
	}
	fmt.Fprintf(e.stdout, "schedule %s  queue %s  %s  overlap %s  catch-up %s\nnext %s  paused %v  created %s\n\n",
		info.Name, info.Queue, specText(&info.Schedule), info.OverlapPolicy(), info.CatchUpPolicy(),
		nextText(info), info.Paused, info.CreatedAt.Local().Format(time.RFC3339))
	if len(recs) == 0 {
		fmt.Fprintln(e.stdout, "no runs")
	} else {
		writeList(e, recs)
	}
	if lateness {
		var late []time.Duration
		for _, r := range recs {
			p, err := time.Parse(time.RFC3339Nano, r.Metadata[bus.MetaScheduledFor])
			if err != nil || r.StartedAt.IsZero() {
				continue
			}
			late = append(late, r.StartedAt.Sub(p))
		}
		if len(late) == 0 {
			fmt.Fprintln(e.stdout, "lateness: no started runs")
			return exitOK
		}
		slices.Sort(late)
		q := func(f float64) time.Duration { return late[min(len(late)-1, int(f*float64(len(late))))] }
		fmt.Fprintf(e.stdout, "lateness (planned time to run start) over %d runs: p50 %s  p99 %s  max %s\n",
			len(late), q(0.50).Round(time.Millisecond), q(0.99).Round(time.Millisecond), late[len(late)-1].Round(time.Millisecond))
	}
	return exitOK
}

func cmdScheduleAct(ctx context.Context, e *env, act string, args []string) int {
	fs := newFlagSet(e, "schedule "+act, "submit schedule "+act+" NAME")
	var cf conn
	cf.register(fs.FlagSet, e)
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return fail(e, usagef("schedule %s takes one NAME", act))
	}
	name := pos[0]
	ctx, cancel := interruptible(ctx, e)
	defer cancel()
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	switch act {
	case "pause":
		err = c.PauseSchedule(ctx, name)
	case "resume":
		err = c.ResumeSchedule(ctx, name)
	case "delete":
		err = c.DeleteSchedule(ctx, name)
	case "trigger":
		var id string
		if id, err = c.TriggerSchedule(ctx, name); err == nil {
			fmt.Fprintln(e.stdout, id)
			return exitOK
		}
	}
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	fmt.Fprintf(e.stdout, "schedule %s: %s\n", name, map[string]string{"pause": "paused", "resume": "resumed", "delete": "deleted"}[act])
	return exitOK
}
