package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Listing reads the records stream (KV_agents_runs) backwards from a
// sequence with batched direct gets, in windows that double: with history 1
// every key's record is the only message of its subject, so the stream in
// sequence order is the records in the order they were last written, and a
// page costs the records it skips over, never the whole bucket.

const (
	firstWindow = 128
	maxWindow   = 8192
	// DefaultListScan bounds the records one List call reads when a filter
	// is rare; the page then ends early with Next set.
	DefaultListScan = 100_000
)

// ListOptions filter List.
type ListOptions struct {
	// State: "" for all; queued, running, succeeded, failed, aborted,
	// stale (running records whose heartbeat is too old), or waiting
	// (running records with a "waiting", StateWaiting).
	State string
	// WaitingFor keeps, of the waiting records, those waiting for this
	// (WaitingApproval, WaitingModel); "" for all. Only with StateWaiting.
	WaitingFor string
	Queue      string // "" for all
	Limit      int    // 0 for no limit
	// BeforeSeq lists only records stored below this records-stream
	// sequence (a page's Next, or a record's Revision). Queued runs are
	// listed only on the first page.
	BeforeSeq uint64
	// Cursor is a page's NextCursor: where the next page starts, queued
	// runs included (it overrides BeforeSeq).
	Cursor string
	// Before lists only records last written before this time.
	Before time.Time
	// Since lists only records last written at or after this time.
	Since time.Time
	// MaxScan bounds the records read [DefaultListScan]; -1 for no bound.
	MaxScan int
	// Model, Tenant and Metadata (every key with its value) keep the
	// records with those; Text those whose id or title holds it, in any
	// case. Records before 1.8 have no title or tenant. These filters
	// match few records at times: bound the scan (MaxScan, Since).
	Model    string
	Tenant   string
	Metadata map[string]string
	Text     string
}

// fieldFilters reports whether a filter besides State and Queue is set.
func (o *ListOptions) fieldFilters() bool {
	return o.Model != "" || o.Tenant != "" || len(o.Metadata) > 0 || o.Text != ""
}

// RunPage is one page of List.
type RunPage struct {
	Records []RunRecord
	// Next is the BeforeSeq of the next page; 0 when no older record is left.
	// While queued runs are left it points at the records, skipping them:
	// page with NextCursor to list every run once (except one rewritten
	// between pages of queued runs: protocol §7, Listing runs).
	Next uint64
	// NextCursor is the Cursor of the next page; "" at the end.
	NextCursor string
	// Scanned counts the records read to build the page.
	Scanned int
	// Truncated is set when MaxScan stopped the read before Limit matches,
	// or, on a page of queued runs, before the read of the records written
	// since the listing began reached its start (runs picked up since may
	// then be missing from the page). A truncated page still has a
	// NextCursor unless nothing is left: when the read above top spent the
	// bound, it points at the records.
	Truncated bool
	// Stored is the records stream's message count when the scan began:
	// the records, for "scanned N of M".
	Stored uint64
}

// List returns run records, the newest first: queued runs (requests with no
// record yet), then records by the time they were last written (running
// runs heartbeat, so they stay near the top; a finished run sits where it
// finished). It reads only what the page needs; see ListPage.
func (c *Client) List(ctx context.Context, o ListOptions) ([]RunRecord, error) {
	p, err := c.ListPage(ctx, o)
	if err != nil {
		return nil, err
	}
	return p.Records, nil
}

// ListPage is List with paging: pass the page's Next as BeforeSeq to get
// the next one. Its cost is the records between the page's ends (plus the
// queued requests on the first page), not the bucket's size.
func (c *Client) ListPage(ctx context.Context, o ListOptions) (*RunPage, error) {
	var qc *listCursor
	if o.State == StateWaiting && (o.Cursor == "" || strings.HasPrefix(o.Cursor, "w.")) {
		// The waiting index, oldest first (waiting_index.go); the records
		// walk when there is none.
		var after uint64
		if o.Cursor != "" {
			cur, err := parseListCursor(o.Cursor)
			if err != nil {
				return nil, err
			}
			after = cur.seq
		}
		page, ok, err := c.waitingPage(ctx, o, after)
		if err != nil || ok {
			return page, err
		}
		if o.Cursor != "" {
			return nil, fmt.Errorf("page cursor %q: no waiting index (%s)", truncate(o.Cursor, 80), c.names.WaitingStream())
		}
	}
	if o.Cursor != "" {
		cur, err := parseListCursor(o.Cursor)
		if err != nil {
			return nil, err
		}
		if cur.waiting {
			return nil, fmt.Errorf("page cursor %q: only for the waiting runs", truncate(o.Cursor, 80))
		}
		if cur.queued {
			qc = &cur
		} else {
			o.BeforeSeq = cur.seq
		}
	}
	page := &RunPage{}
	first := o.BeforeSeq == 0 && o.Before.IsZero() && qc == nil
	want := func() bool { return o.Limit <= 0 || len(page.Records) < o.Limit }
	stream := "KV_" + c.names.RecordsBucket()
	s, err := c.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	// The records' top is read before the queued runs: a run listed as
	// queued has no record at or below it, so the records below never
	// list it again.
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	lo, hi := info.State.FirstSeq, info.State.LastSeq
	page.Stored = info.State.Msgs
	// top: the last record written when the scan began.
	top := hi
	keyPrefix := "$KV." + c.names.RecordsBucket() + "."
	g := c.directGetter(stream)
	now := time.Now()
	maxScan := o.MaxScan
	if maxScan == 0 {
		maxScan = DefaultListScan
	}
	queuedN := 0 // the page's records from the queued part (catchUp keeps them first)
	if (first || qc != nil) && (o.State == "" || o.State == StateQueued) {
		if h := c.beforeListQueued; h != nil {
			h()
		}
		q, runsTop, err := c.listQueued(ctx, o.Queue)
		if err != nil {
			return nil, err
		}
		cur := listCursor{queued: true, top: top, runsTop: runsTop}
		if qc != nil {
			cur = *qc
		}
		// A run picked up since top was read (on this page, between the
		// stream info and the queued runs, or between pages) has a record
		// above top only: read up to the end as it is now.
		last, err := lastSeq(ctx, s)
		if err != nil {
			return nil, err
		}
		picked, err := c.pickedUp(ctx, g, cur, last, maxScan, page, now)
		if err != nil {
			return nil, err
		}
		q = mergeByID(q, picked)
		for _, r := range q {
			if r.ID <= cur.after {
				continue
			}
			if len(o.Metadata) > 0 && r.State == StateQueued && r.Metadata == nil {
				// A queued run's metadata is in its request (submit list
				// --schedule lists a schedule's queued runs too).
				if err := c.queuedMetadata(ctx, &r); err != nil {
					return nil, err
				}
			}
			if !matches(&r, o) {
				continue
			}
			if !want() { // queued runs are left: the next page goes on after the last listed
				cur.after = page.Records[len(page.Records)-1].ID
				page.NextCursor = cur.String()
				if cur.top > 0 {
					page.Next = cur.top + 1
				}
				return page, nil
			}
			page.Records = append(page.Records, r)
			queuedN++
		}
	}
	if o.State == StateQueued {
		return page, nil
	}
	if qc != nil { // the queued runs are done: the records as they were then
		o.BeforeSeq = qc.top + 1
	}
	if !want() { // queued runs filled the page: the records come next
		if qc != nil {
			hi = min(hi, qc.top)
		}
		if hi > 0 {
			page.Next = hi + 1
			page.NextCursor = strconv.FormatUint(page.Next, 10)
		}
		return page, nil
	}
	if o.BeforeSeq > 0 {
		hi = min(hi, o.BeforeSeq-1)
	}
	if !o.Before.IsZero() {
		seq, err := g.seqAt(ctx, o.Before, keyPrefix+">")
		if err != nil {
			return nil, err
		}
		if seq > 0 {
			hi = min(hi, seq-1)
		}
	}
	if !o.Since.IsZero() {
		seq, err := g.seqAt(ctx, o.Since, keyPrefix+">")
		if err != nil {
			return nil, err
		}
		if seq == 0 {
			return page, nil // nothing written since
		}
		lo = max(lo, seq)
	}
	needles := listNeedles(o)
	window := uint64(firstWindow)
	if o.Limit > 0 && o.State == "" && o.Queue == "" && !o.fieldFilters() {
		window = uint64(2*o.Limit + 8) // with a rewritten record's hole each, one window is the page
	}
	for hi >= lo && hi > 0 && want() {
		if maxScan > 0 && page.Scanned >= maxScan {
			page.Truncated = true
			if page.Next == 0 {
				// The bound was spent before the records (by the read of
				// the records written above a queued cursor's top): the
				// next page starts at them.
				page.Next = hi + 1
			}
			break
		}
		from := lo
		if hi-lo+1 > window {
			from = hi - window + 1
		}
		msgs, err := g.rangeOf(ctx, from, hi)
		if err != nil {
			return nil, err
		}
		if h := c.afterListRange; h != nil {
			h(from)
		}
		for i := len(msgs) - 1; i >= 0 && want(); i-- {
			m := msgs[i]
			page.Next = m.seq
			if len(m.data) == 0 || !strings.HasPrefix(m.subject, keyPrefix) {
				continue // a delete or purge marker
			}
			page.Scanned++
			if r, ok := c.listed(m, o, needles, now); ok {
				page.Records = append(page.Records, r)
			}
		}
		if !want() {
			break
		}
		page.Next = from
		hi = from - 1
		window = min(window*2, maxWindow)
	}
	if hi < lo || hi == 0 || page.Next <= lo {
		page.Next = 0 // nothing older left (a full page may end at the first record)
	}
	if first {
		if err := c.catchUp(ctx, g, s, page, o, top, queuedN, now); err != nil {
			return nil, err
		}
	}
	if page.Next > 0 {
		page.NextCursor = strconv.FormatUint(page.Next, 10)
	}
	return page, nil
}

// listCursor is a parsed ListOptions.Cursor: a records-stream sequence
// (BeforeSeq), or, while queued runs are left, "q.<top>.<runsTop>.<id>":
// the queued runs after id in id order, with those of them picked up since
// (records written above top for a request at or below runsTop, the
// AGENTS_RUNS sequence when the listing began), then the records up to
// top. A run is thus listed once whether it is picked up between pages or
// not: a queued run has no record at or below top.
type listCursor struct {
	seq          uint64
	queued       bool
	top, runsTop uint64
	after        string
	// waiting: "w.<seq>", a page of the waiting index going on after seq.
	waiting bool
}

func parseListCursor(s string) (listCursor, error) {
	if n, err := strconv.ParseUint(s, 10, 64); err == nil && n > 0 {
		return listCursor{seq: n}, nil
	}
	if rest, ok := strings.CutPrefix(s, "w."); ok {
		if n, err := strconv.ParseUint(rest, 10, 64); err == nil {
			return listCursor{seq: n, waiting: true}, nil
		}
	}
	if p := strings.SplitN(s, ".", 4); len(p) == 4 && p[0] == "q" {
		top, err1 := strconv.ParseUint(p[1], 10, 64)
		runsTop, err2 := strconv.ParseUint(p[2], 10, 64)
		if err1 == nil && err2 == nil && ValidID(p[3]) {
			return listCursor{queued: true, top: top, runsTop: runsTop, after: p[3]}, nil
		}
	}
	return listCursor{}, fmt.Errorf("invalid page cursor %q", truncate(s, 80))
}

func (l listCursor) String() string {
	if l.waiting {
		return waitingCursor(l.seq)
	}
	if !l.queued {
		return strconv.FormatUint(l.seq, 10)
	}
	return "q." + strconv.FormatUint(l.top, 10) + "." + strconv.FormatUint(l.runsTop, 10) + "." + l.after
}

// CheckListCursor returns an error for a string that is no page cursor.
func CheckListCursor(s string) error {
	_, err := parseListCursor(s)
	return err
}

// pickedUp returns the records written above the cursor's top (up to
// last) for requests at or below its runsTop, after its id: runs queued
// when the listing began and picked up since, which the records up to
// top do not hold. It reads at most maxScan sequences (less what the page
// has scanned; -1 for no bound), the newest first: when the bound stops
// it short of top, the page is marked truncated (runs picked up in what
// it did not read are missing from it).
func (c *Client) pickedUp(ctx context.Context, g *directGetter, cur listCursor, last uint64, maxScan int, page *RunPage, now time.Time) ([]RunRecord, error) {
	keyPrefix := "$KV." + c.names.RecordsBucket() + "."
	seen := map[string]bool{}
	var out []RunRecord
	for to := last; to > cur.top; { // newest first: a key's last write counts
		n := min(to-cur.top, maxWindow)
		if maxScan > 0 {
			left := maxScan - page.Scanned
			if left <= 0 {
				page.Truncated = true
				break
			}
			n = min(n, uint64(left))
		}
		from := to - n + 1
		msgs, err := g.rangeOf(ctx, from, to)
		if err != nil {
			return nil, err
		}
		page.Scanned += int(n) // sequences read, holes included: the bound is on the reads
		for i := len(msgs) - 1; i >= 0; i-- {
			m := msgs[i]
			id, ok := strings.CutPrefix(m.subject, keyPrefix)
			if !ok || seen[id] {
				continue
			}
			seen[id] = true
			if len(m.data) == 0 || id <= cur.after {
				continue
			}
			var r RunRecord
			if json.Unmarshal(m.data, &r) != nil || r.RequestSeq > cur.runsTop {
				continue // a run submitted since
			}
			r.Revision = m.seq
			c.markStale(&r, now)
			out = append(out, r)
		}
		to = from - 1
	}
	return out, nil
}

// lastSeq returns the stream's last sequence now.
func lastSeq(ctx context.Context, s jetstream.Stream) (uint64, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// mergeByID merges queued runs and records, by id, a record replacing
// the queued run of its id.
func mergeByID(queued, recs []RunRecord) []RunRecord {
	have := make(map[string]bool, len(recs))
	for _, r := range recs {
		have[r.ID] = true
	}
	out := slices.DeleteFunc(queued, func(r RunRecord) bool { return have[r.ID] })
	out = append(out, recs...)
	slices.SortFunc(out, func(a, b RunRecord) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// listed decodes a stored record and reports whether the listing keeps it.
func (c *Client) listed(m storedMsg, o ListOptions, needles [][]byte, now time.Time) (RunRecord, bool) {
	var r RunRecord
	if !mayMatch(m.data, needles) || json.Unmarshal(m.data, &r) != nil {
		return r, false
	}
	r.Revision = m.seq
	c.markStale(&r, now)
	return r, matches(&r, o)
}

// catchUpRounds bounds the rereads of a first page: each reads what was
// written during the one before, so they shrink fast unless the bucket is
// written faster than it is read.
const catchUpRounds = 4

// catchUp completes a first page with the records written while it was
// read. A rewrite moves a record above the sequence the scan started from
// and deletes the copy below, so a scan that reaches the copy's place
// after the rewrite sees neither: a running run (it heartbeats) would
// drop out of a listing now and then. The records written since are the
// newest, so they go after the queued runs and before the rest; an older
// copy of one the page holds is dropped; a page over its limit loses its
// oldest, and Next then points at them.
func (c *Client) catchUp(ctx context.Context, g *directGetter, s jetstream.Stream, page *RunPage, o ListOptions, top uint64, queuedN int, now time.Time) error {
	var msgs []storedMsg // written since the scan began, in order
	for range catchUpRounds {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		last := info.State.LastSeq
		if last <= top {
			break
		}
		for top < last { // in windows, as the scan reads
			to := min(last, top+maxWindow)
			round, err := g.rangeOf(ctx, top+1, to)
			if err != nil {
				return err
			}
			msgs = append(msgs, round...)
			top = to
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	keyPrefix := "$KV." + c.names.RecordsBucket() + "."
	needles := listNeedles(o)
	moved := map[string]bool{}
	var newer []RunRecord
	for i := len(msgs) - 1; i >= 0; i-- { // a key's last write first
		m := msgs[i]
		id, ok := strings.CutPrefix(m.subject, keyPrefix)
		if !ok || moved[id] {
			continue
		}
		moved[id] = true
		if len(m.data) == 0 {
			continue // deleted since
		}
		page.Scanned++
		if r, ok := c.listed(m, o, needles, now); ok {
			newer = append(newer, r)
		}
	}
	out := make([]RunRecord, 0, len(newer)+len(page.Records))
	rest := page.Records
	for _, r := range rest[:queuedN] { // queued runs stay first
		if !moved[r.ID] {
			out = append(out, r)
		}
	}
	rest = rest[queuedN:]
	out = append(out, newer...)
	for _, r := range rest {
		if !moved[r.ID] {
			out = append(out, r)
		}
	}
	if o.Limit > 0 && len(out) > o.Limit {
		// The next page starts below the last record kept (a record, as
		// queued runs that fill a page end it before the scan).
		out = out[:o.Limit]
		page.Next = out[len(out)-1].Revision
	}
	if o.Limit > 0 && len(out) == o.Limit {
		page.Truncated = false // full, whatever the scan's bound
	}
	page.Records = out
	return nil
}

// listNeedles are strings a matching record's JSON must contain: a
// filtered scan decodes only the records that have them (the quoted value
// of a state or queue appears in any encoding but one with \u escapes of
// plain letters, which no writer of records produces).
func listNeedles(o ListOptions) [][]byte {
	var out [][]byte
	switch o.State {
	case "":
	case StateStale:
		out = append(out, []byte(`"`+StateRunning+`"`))
	case StateWaiting:
		out = append(out, []byte(`"`+StateRunning+`"`), []byte(`"waiting"`))
		if o.WaitingFor != "" && plainJSON(o.WaitingFor) {
			out = append(out, []byte(`"`+o.WaitingFor+`"`))
		}
	default:
		out = append(out, []byte(`"`+o.State+`"`))
	}
	if o.Queue != "" {
		out = append(out, []byte(`"`+o.Queue+`"`))
	}
	// Other values only when no encoder escapes them.
	for _, v := range []string{o.Model, o.Tenant} {
		if v != "" && plainJSON(v) {
			out = append(out, []byte(`"`+v+`"`))
		}
	}
	for k, v := range o.Metadata {
		for _, t := range []string{k, v} {
			if plainJSON(t) {
				out = append(out, []byte(`"`+t+`"`))
			}
		}
	}
	return out
}

// plainJSON reports whether s is encoded as itself in a JSON string by the
// record writers: letters, digits and a few punctuation marks.
func plainJSON(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(" .,:;_-=+@#()/", r)) {
			return false
		}
	}
	return true
}

func mayMatch(data []byte, needles [][]byte) bool {
	for _, n := range needles {
		if !bytes.Contains(data, n) {
			return false
		}
	}
	return true
}

func matches(r *RunRecord, o ListOptions) bool {
	state := o.State == "" || r.State == o.State || (o.State == StateStale && r.Stale) ||
		(o.State == StateWaiting && r.State == StateRunning && r.Waiting != nil)
	if state && o.State == StateWaiting && o.WaitingFor != "" {
		state = r.Waiting != nil && r.Waiting.For == o.WaitingFor
	}
	if !state || o.Queue != "" && r.Queue != o.Queue || o.Model != "" && r.Model != o.Model || o.Tenant != "" && r.Tenant != o.Tenant {
		return false
	}
	for k, v := range o.Metadata {
		if got, ok := r.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return o.Text == "" || containsFold(r.ID, o.Text) || containsFold(r.Title, o.Text)
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

// listQueued returns the requests that have no record yet, by id. It costs
// the requests pending in AGENTS_RUNS (the backlog and the running runs,
// whose requests are acked only at the end), never the history.
// Its second result is the stream's last sequence: a request stored later
// is a run submitted since.
// queuedMetadata reads a queued run's metadata from its request (none if
// it was taken since).
func (c *Client) queuedMetadata(ctx context.Context, r *RunRecord) error {
	s, err := c.Stream(ctx, c.names.RunsStream())
	if err != nil {
		return err
	}
	m, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(c.names.Submit(r.Queue, r.ID)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		m, err = s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(c.names.LaneRequest(r.Queue, "*", "*", r.ID)))
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var req struct {
		Metadata map[string]string `json:"metadata"`
	}
	_ = json.Unmarshal(m.Data, &req) // a request that does not decode has none
	r.Metadata = req.Metadata
	return nil
}

func (c *Client) listQueued(ctx context.Context, queue string) ([]RunRecord, uint64, error) {
	s, err := c.Stream(ctx, c.names.RunsStream())
	if err != nil {
		return nil, 0, err
	}
	filters := []string{c.names.SubmitAll(), c.names.LaneAll()}
	if queue != "" {
		filters = []string{c.names.SubmitFilter(queue), c.names.LaneQueueAll(queue)}
	}
	var pending []RunRecord
	var last uint64
	for i, filter := range filters {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			return nil, 0, err
		}
		if i == 0 {
			last = info.State.LastSeq // the first read's: a request stored between the reads is listed or submitted since
		}
		for subj := range info.State.Subjects {
			l, id, err := c.names.ParseRequest(subj)
			if err != nil {
				continue
			}
			pending = append(pending, RunRecord{ID: id, Queue: l.Queue, State: StateQueued, Priority: l.RecordPriority()})
		}
	}
	if len(pending) == 0 {
		return nil, last, nil
	}
	// Drop those with a record: batched last-by-subject gets, 1,024 keys a
	// request (the server's bound).
	stream := "KV_" + c.names.RecordsBucket()
	g := c.directGetter(stream)
	have := map[string]bool{}
	prefix := "$KV." + c.names.RecordsBucket() + "."
	for i := 0; i < len(pending); i += 1024 {
		chunk := pending[i:min(i+1024, len(pending))]
		subjects := make([]string, len(chunk))
		for j, r := range chunk {
			subjects[j] = prefix + r.ID
		}
		msgs, err := g.multiLast(ctx, subjects)
		if err != nil {
			return nil, 0, err
		}
		for _, m := range msgs {
			if len(m.data) > 0 {
				have[strings.TrimPrefix(m.subject, prefix)] = true
			}
		}
	}
	out := pending[:0]
	for _, r := range pending {
		if !have[r.ID] {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, last, nil
}

// directGetter speaks the batched direct get API of a stream (AllowDirect,
// which KV buckets have): nats.go has no call for it.
type directGetter struct {
	nc      *nats.Conn
	subject string
	stream  string
}

type storedMsg struct {
	subject string
	seq     uint64
	time    time.Time
	data    []byte
}

func (c *Client) directGetter(stream string) *directGetter {
	o := c.js.Options()
	prefix := "$JS.API."
	switch {
	case o.Domain != "":
		prefix = "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		prefix = strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return &directGetter{nc: c.nc, subject: prefix + "DIRECT.GET." + stream, stream: stream}
}

var errNoResults = errors.New("no results")

// rangeOf returns the stored messages of sequences from..to, in order: one
// direct get per sequence, all sent before the first answer is read, a
// deleted sequence answered 404. (A batched direct get would step over
// deleted sequences, but the server counts the pending messages of every
// batch, which on a stream keeping one message per subject walks every
// subject: its cost grows with the bucket.)
func (g *directGetter) rangeOf(ctx context.Context, from, to uint64) ([]storedMsg, error) {
	if to < from {
		return nil, nil
	}
	inbox := g.nc.NewInbox()
	sub, err := g.nc.SubscribeSync(inbox + ".*")
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)
	body := make([]byte, 0, 32)
	for seq := from; seq <= to; seq++ {
		body = strconv.AppendUint(append(body[:0], `{"seq":`...), seq, 10)
		body = append(body, '}')
		if err := g.nc.PublishRequest(g.subject, inbox+"."+strconv.FormatUint(seq, 10), body); err != nil {
			return nil, err
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	out := make([]storedMsg, 0, to-from+1)
	for range to - from + 1 {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("direct get on %s: %w", g.stream, err)
		}
		sm, err := g.decode(m)
		if errors.Is(err, errNoResults) {
			continue // a deleted sequence
		}
		if err != nil {
			return nil, err
		}
		out = append(out, sm)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out, nil
}

// decode reads one direct get answer: a stored message, errNoResults, or
// the error its status says.
func (g *directGetter) decode(m *nats.Msg) (storedMsg, error) {
	if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 {
		switch status {
		case "404":
			return storedMsg{}, errNoResults
		case "503":
			return storedMsg{}, fmt.Errorf("direct get on %s: %w (is the stream's allow_direct on?)", g.stream, nats.ErrNoResponders)
		}
		return storedMsg{}, fmt.Errorf("direct get on %s: %s %s", g.stream, status, m.Header.Get("Description"))
	}
	seq, _ := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	ts, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	sm := storedMsg{subject: m.Header.Get(jetstream.SubjectHeader), seq: seq, time: ts, data: m.Data}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		sm.data = nil
	}
	return sm, nil
}

// multiLast returns the last message of each subject that has one.
func (g *directGetter) multiLast(ctx context.Context, subjects []string) ([]storedMsg, error) {
	msgs, err := g.request(ctx, map[string]any{"multi_last": subjects})
	if errors.Is(err, errNoResults) {
		return nil, nil
	}
	return msgs, err
}

// seqAt returns the sequence of the first message stored at or after t, 0
// when there is none.
func (g *directGetter) seqAt(ctx context.Context, t time.Time, filter string) (uint64, error) {
	msgs, err := g.request(ctx, map[string]any{"start_time": t.UTC(), "next_by_subj": filter})
	if errors.Is(err, errNoResults) || (err == nil && len(msgs) == 0) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return msgs[0].seq, nil
}

// request sends one batched direct get and reads its messages up to the
// end-of-batch status.
func (g *directGetter) request(ctx context.Context, req map[string]any) ([]storedMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	inbox := g.nc.NewInbox()
	sub, err := g.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)
	if err := g.nc.PublishRequest(g.subject, inbox, body); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	var out []storedMsg
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("direct get on %s: %w", g.stream, err)
		}
		if m.Header.Get("Status") == "204" && len(m.Data) == 0 {
			return out, nil // end of a multi-message answer
		}
		sm, err := g.decode(m)
		if errors.Is(err, errNoResults) && len(out) > 0 {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, sm)
		if _, batched := req["batch"]; !batched {
			if _, multi := req["multi_last"]; !multi {
				return out, nil
			}
		}
	}
}
