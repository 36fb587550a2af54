package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestVendoredFilesAreUnchanged: each vendored file (static/vendor/) is
// the published one, as static/vendor/README.md records it: its SHA-256
// and, for marked, the version its header names. Nobody edits it by hand;
// an update changes the file and the README together.
func TestVendoredFilesAreUnchanged(t *testing.T) {
	t.Parallel()
	vendor, err := fs.Sub(staticFiles, "static/vendor")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := fs.ReadFile(vendor, "README.md")
	if err != nil {
		t.Fatal(err)
	}
	sums := regexp.MustCompile("(?m)^- sha256: `([0-9a-f]{64})  ([^`]+)`$").FindAllStringSubmatch(string(readme), -1)
	if len(sums) == 0 {
		t.Fatal("static/vendor/README.md records no sha256 line (- sha256: `HEX  FILE`)")
	}
	recorded := map[string]bool{"README.md": true}
	for _, m := range sums {
		want, name := m[1], m[2]
		recorded[name] = true
		b, err := fs.ReadFile(vendor, name)
		if err != nil {
			t.Errorf("static/vendor/README.md records %s: %v", name, err)
			continue
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("static/vendor/%s has sha256 %s, README.md records %s: vendored files are not edited by hand (README.md says how to update one)", name, got, want)
		}
	}
	version := regexp.MustCompile("(?m)^- version: (\\S+)$").FindStringSubmatch(string(readme))
	marked, err := fs.ReadFile(vendor, "marked.esm.js")
	if err != nil || version == nil {
		t.Fatalf("marked.esm.js (%v) and its version in README.md (%q)", err, version)
	}
	if head := "marked v" + version[1] + " - a markdown parser"; !bytes.Contains(marked[:min(len(marked), 200)], []byte(head)) {
		t.Errorf("marked.esm.js does not start by naming %q, the version README.md records", head)
	}
	license, err := fs.ReadFile(vendor, "marked.LICENSE")
	if err != nil || !bytes.Contains(license, []byte("Permission is hereby granted, free of charge")) {
		t.Errorf("marked's license (MIT) beside it: %v", err)
	}
	entries, err := fs.ReadDir(vendor, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !recorded[e.Name()] {
			t.Errorf("static/vendor/%s is not recorded in static/vendor/README.md", e.Name())
		}
	}
}

// mdCase is a markdown text and what the console must make of it: the
// exact rendering (domstub.mjs's serialize of the div renderMarkdown
// returns), or texts it contains.
type mdCase struct {
	name, text string
	want       string   // exact, when not ""
	contains   []string // in the rendering
	lacks      []string // not in the rendering
}

const (
	mdLink = ` rel="noopener noreferrer nofollow" target="_blank"`
)

// mdRenders renders cases with the console's markdown module as the
// console serves it (the embedded static files, the same handler), in
// node on the DOM stub; the results by case name.
func mdRenders(t *testing.T, cases []mdCase) map[string]string {
	t.Helper()
	node := nodePath(t)
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		mux.ServeHTTP(w, r)
	}))
	defer srv.Close()
	type in struct {
		Name string `json:"name"`
		Text string `json:"text"`
	}
	var input []in
	for _, c := range cases {
		input = append(input, in{c.name, c.text})
	}
	body, _ := json.Marshal(input)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--experimental-vm-modules", "testdata/markdown_cases.mjs", srv.URL)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(body), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node testdata/markdown_cases.mjs: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	var rep struct {
		Sinks  []string `json:"sinks"`
		Errors []string `json:"errors"`
		Cases  []struct {
			Name string `json:"name"`
			HTML string `json:"html"`
			Ms   int    `json:"ms"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, s := range rep.Sinks {
		t.Errorf("the markdown renderer put text into an HTML sink: %s", s)
	}
	for _, e := range rep.Errors {
		t.Errorf("the markdown renderer failed: %s", e)
	}
	out := map[string]string{}
	for _, c := range rep.Cases {
		out[c.Name] = c.HTML
		if c.Ms > 200 {
			t.Logf("%s: rendered in %d ms", c.Name, c.Ms)
		}
	}
	return out
}

// What a rendering may hold: these elements, these attributes, links only
// to http(s) and mailto URLs, a checkbox only disabled.
var (
	mdTags  = regexp.MustCompile(`<([a-zA-Z][a-zA-Z0-9-]*)([^>]*)>`)
	mdAttrs = regexp.MustCompile(`\s([^\s=]+)(?:="([^"]*)")?`)
	mdAllow = map[string]bool{"div": true, "p": true, "h1": true, "h2": true, "h3": true, "h4": true, "h5": true, "h6": true,
		"strong": true, "em": true, "del": true, "code": true, "pre": true, "br": true, "hr": true, "ul": true, "ol": true, "li": true,
		"blockquote": true, "table": true, "thead": true, "tbody": true, "tr": true, "th": true, "td": true, "a": true, "span": true, "input": true}
	mdAllowAttr = map[string]bool{"class": true, "href": true, "rel": true, "target": true, "title": true, "type": true,
		"checked": true, "disabled": true, "start": true, "data-lang": true}
	mdSafeURL = regexp.MustCompile(`^(?i:https?://[^/?#\s]|mailto:[^/\s])[^\x00-\x20\x7f-\x9f]*$`)
)

// checkInert fails unless rendering is made only of the elements and
// attributes markdown needs, with safe links.
func checkInert(t *testing.T, name, rendering string) {
	t.Helper()
	for _, m := range mdTags.FindAllStringSubmatch(rendering, -1) {
		tag, attrs := strings.ToLower(m[1]), m[2]
		if !mdAllow[tag] {
			t.Errorf("%s: an element <%s> %s", name, tag, attrs)
		}
		for _, a := range mdAttrs.FindAllStringSubmatch(attrs, -1) {
			k, v := strings.ToLower(a[1]), html.UnescapeString(a[2])
			switch {
			case !mdAllowAttr[k]:
				t.Errorf("%s: <%s> has the attribute %s=%q", name, tag, k, v)
			case k == "href" && (tag != "a" || !mdSafeURL.MatchString(v)):
				t.Errorf("%s: <%s href=%q>: only http(s) and mailto links", name, tag, v)
			case k == "type" && (tag != "input" || v != "checkbox"):
				t.Errorf("%s: <%s type=%q>", name, tag, v)
			}
		}
		if tag == "a" && (!strings.Contains(attrs, mdLink) || !strings.Contains(attrs, "href=")) {
			t.Errorf("%s: a link <a%s> without an href or %s", name, attrs, mdLink)
		}
		if tag == "input" && !strings.Contains(attrs, " disabled") {
			t.Errorf("%s: a checkbox that is not disabled: <input%s>", name, attrs)
		}
	}
}

func checkCases(t *testing.T, cases []mdCase) {
	t.Helper()
	got := mdRenders(t, cases)
	for _, c := range cases {
		r, ok := got[c.name]
		if !ok {
			t.Errorf("%s: not rendered", c.name)
			continue
		}
		checkInert(t, c.name, r)
		if c.want != "" && r != c.want {
			t.Errorf("%s: markdown %q\nrendered %s\nwant     %s", c.name, mdClip(c.text), mdClip(r), mdClip(c.want))
		}
		for _, s := range c.contains {
			if !strings.Contains(r, s) {
				t.Errorf("%s: rendered %s\nwant it to contain %s", c.name, mdClip(r), s)
			}
		}
		for _, s := range c.lacks {
			if strings.Contains(r, s) {
				t.Errorf("%s: rendered %s\nwant no %s", c.name, mdClip(r), s)
			}
		}
	}
}

func mdClip(s string) string {
	if len(s) > 600 {
		return s[:300] + fmt.Sprintf(" …(%d bytes)… ", len(s)-600) + s[len(s)-300:]
	}
	return s
}

// TestMarkdownRendersElements: ordinary markdown becomes the elements it
// means, with the text it holds (marked's lexer, GFM, built as DOM nodes
// by static/markdown.js), as the console serves it, in node.
func TestMarkdownRendersElements(t *testing.T) {
	t.Parallel()
	checkCases(t, []mdCase{
		{name: "heading, bold, emphasis, line break", text: "## Report\n\nThe answer is **84**, from the *calculator*.\nNext ~~old~~ line.\n",
			want: `<div class="md"><h2 class="md-h">Report</h2><p>The answer is <strong>84</strong>, from the <em>calculator</em>.<br></br>Next <del>old</del> line.</p></div>`},
		{name: "all headings", text: "# a\n## b\n### c\n#### d\n##### e\n###### f\n####### g\n\nSetext\n===\n",
			want: `<div class="md"><h1 class="md-h">a</h1><h2 class="md-h">b</h2><h3 class="md-h">c</h3><h4 class="md-h">d</h4><h5 class="md-h">e</h5><h6 class="md-h">f</h6><p>####### g</p><h1 class="md-h">Setext</h1></div>`},
		{name: "lists", text: "- twelve times seven\n- checked **twice**\n  - nested `x`\n\n3. three\n4. four\n",
			want: `<div class="md"><ul><li>twelve times seven</li><li>checked <strong>twice</strong><ul><li>nested <code>x</code></li></ul></li></ul>` +
				`<ol start="3"><li>three</li><li>four</li></ol></div>`},
		{name: "loose list", text: "1. one\n\n2. two\n",
			want: `<div class="md"><ol><li><p>one</p></li><li><p>two</p></li></ol></div>`},
		{name: "task list", text: "- [ ] todo\n- [x] done\n",
			want: `<div class="md"><ul><li class="md-task"><input class="md-check" type="checkbox" disabled></input> todo</li>` +
				`<li class="md-task"><input class="md-check" type="checkbox" checked disabled></input> done</li></ul></div>`},
		{name: "table", text: "| factor | value | mid |\n|:---|--:|:-:|\n| a | 12 | `x` |\n| b | 7 |\n",
			want: `<div class="md"><table class="md-table"><thead><tr><th>factor</th><th class="align-right">value</th><th class="align-center">mid</th></tr></thead>` +
				`<tbody><tr><td>a</td><td class="align-right">12</td><td class="align-center"><code>x</code></td></tr>` +
				`<tr><td>b</td><td class="align-right">7</td><td class="align-center"></td></tr></tbody></table></div>`},
		{name: "code", text: "See `calc` and ``a ` b``.\n\n```go\nfunc main() { fmt.Println(\"<b>\") }\n```\n\n    indented *code*\n",
			want: `<div class="md"><p>See <code>calc</code> and <code>a ` + "`" + ` b</code>.</p>` +
				`<pre class="md-code"><code data-lang="go">func main() { fmt.Println(&quot;&lt;b&gt;&quot;) }</code></pre>` +
				`<pre class="md-code"><code>indented *code*</code></pre></div>`},
		{name: "quote and rule", text: "> quoted **text**\n> > deeper\n\n---\nafter\n",
			want: `<div class="md"><blockquote><p>quoted <strong>text</strong></p><blockquote><p>deeper</p></blockquote></blockquote><hr></hr><p>after</p></div>`},
		{name: "links", text: "[the docs](https://example.com/docs \"Docs\"), <https://example.com/auto>, https://example.com/bare, www.example.com, " +
			"<mailto:a@example.com>, b@example.com and [ref][r].\n\n[r]: https://example.com/ref\n",
			want: `<div class="md"><p><a href="https://example.com/docs"` + mdLink + ` title="Docs">the docs</a>, ` +
				`<a href="https://example.com/auto"` + mdLink + `>https://example.com/auto</a>, ` +
				`<a href="https://example.com/bare"` + mdLink + `>https://example.com/bare</a>, ` +
				`<a href="http://www.example.com"` + mdLink + `>www.example.com</a>, ` +
				`<a href="mailto:a@example.com"` + mdLink + `>mailto:a@example.com</a>, ` +
				`<a href="mailto:b@example.com"` + mdLink + `>b@example.com</a> and ` +
				`<a href="https://example.com/ref"` + mdLink + `>ref</a>.</p></div>`},
		{name: "images are not loaded", text: "![a chart](https://example.com/a.png) ![](https://example.com/b.png) ![x](javascript:alert(1))\n",
			want: `<div class="md"><p><a class="md-image" href="https://example.com/a.png"` + mdLink + `>image: a chart</a> ` +
				`<a class="md-image" href="https://example.com/b.png"` + mdLink + `>image: https://example.com/b.png</a> ` +
				`<span class="md-image md-badlink">image: x</span></p></div>`},
		{name: "escapes and references", text: "\\*not em\\* &copy; &#169; &#xA9; &amp;lt; &unknown; a & b\n",
			want: `<div class="md"><p>*not em* © © © &amp;lt; &amp;unknown; a &amp; b</p></div>`},
		{name: "empty", text: "", want: `<div class="md"></div>`},
	})
}

// mdBadLink is how a link the console does not follow is shown.
func mdBadLink(label, url string) string {
	return `<span class="md-badlink" title="link not followed: ` + html.EscapeString(url) + `">` + label + `</span>`
}

// mdHostileCases: markdown carrying HTML, scripts and script URLs in every
// place a renderer might let them through, and how each must be shown.
// TestBrowserRunTimeline renders them in Chromium too.
var mdHostileCases = []mdCase{
	{name: "img onerror inline", text: "a <img src=x onerror=alert(1)> b\n",
		want: `<div class="md"><p>a &lt;img src=x onerror=alert(1)&gt; b</p></div>`},
	{name: "img onerror block", text: "<img src=x onerror=\"alert(1)\">\n\nafter\n",
		want: `<div class="md"><p class="md-source">&lt;img src=x onerror=&quot;alert(1)&quot;&gt;</p><p>after</p></div>`},
	{name: "script block", text: "<script>alert(1)</script>\n",
		want: `<div class="md"><p class="md-source">&lt;script&gt;alert(1)&lt;/script&gt;</p></div>`},
	{name: "script inline", text: "**<script>alert(1)</script>**\n",
		want: `<div class="md"><p><strong>&lt;script&gt;alert(1)&lt;/script&gt;</strong></p></div>`},
	{name: "html block with markdown inside", text: "<div onmouseover=\"alert(1)\">\n*x* <b>y</b>\n</div>\n",
		want: `<div class="md"><p class="md-source">&lt;div onmouseover=&quot;alert(1)&quot;&gt;` + "\n" + `*x* &lt;b&gt;y&lt;/b&gt;` + "\n" + `&lt;/div&gt;</p></div>`},
	{name: "heading html", text: "# Title <b>bold</b> <!-- c -->\n",
		want: `<div class="md"><h1 class="md-h">Title &lt;b&gt;bold&lt;/b&gt; &lt;!-- c --&gt;</h1></div>`},
	{name: "javascript link", text: "[x](javascript:alert(1))\n",
		want: `<div class="md"><p>` + mdBadLink("x", "javascript:alert(1)") + `</p></div>`},
	{name: "mixed-case javascript link", text: "[x](JaVaScRiPt:alert(1))\n",
		want: `<div class="md"><p>` + mdBadLink("x", "JaVaScRiPt:alert(1)") + `</p></div>`},
	{name: "javascript link with a leading blank", text: "[x]( javascript:alert(1))\n",
		want: `<div class="md"><p>` + mdBadLink("x", "javascript:alert(1)") + `</p></div>`},
	{name: "javascript link by reference", text: "[x][r]\n\n[r]: javascript:alert(1)\n",
		want: `<div class="md"><p>` + mdBadLink("x", "javascript:alert(1)") + `</p></div>`},
	{name: "javascript link as character references", text: "[x](&#106;avascript&#58;alert(1)) [y](&#x6A;avascript:alert(1))\n",
		want: `<div class="md"><p>` + mdBadLink("x", "&#106;avascript&#58;alert(1)") + ` ` + mdBadLink("y", "&#x6A;avascript:alert(1)") + `</p></div>`},
	{name: "data link", text: "[d](data:text/html,<script>alert(1)</script>)\n",
		want: `<div class="md"><p>` + mdBadLink("d", "data:text/html,<script>alert(1)</script>") + `</p></div>`},
	{name: "other schemes", text: "[a](vbscript:x) [b](file:///etc/passwd) [c](//evil.example/x) [d](/relative) [e](https:evil) [f](<java script:x>)\n",
		want: `<div class="md"><p>` + mdBadLink("a", "vbscript:x") + ` ` + mdBadLink("b", "file:///etc/passwd") + ` ` + mdBadLink("c", "//evil.example/x") + ` ` +
			mdBadLink("d", "/relative") + ` ` + mdBadLink("e", "https:evil") + ` ` + mdBadLink("f", "java script:x") + `</p></div>`},
	{name: "javascript image", text: "![x](javascript:alert(1)) ![y](data:image/svg+xml,<svg/onload=alert(1)>)\n",
		want: `<div class="md"><p><span class="md-image md-badlink">image: x</span> <span class="md-image md-badlink">image: y</span></p></div>`},
	{name: "javascript autolink", text: "<javascript:alert(1)> <JAVASCRIPT:alert(1)>\n",
		want: `<div class="md"><p>` + mdBadLink("javascript:alert(1)", "javascript:alert(1)") + ` ` + mdBadLink("JAVASCRIPT:alert(1)", "JAVASCRIPT:alert(1)") + `</p></div>`},
	{name: "link text with html", text: "[<img src=x onerror=alert(1)>](https://example.com/)\n",
		want: `<div class="md"><p><a href="https://example.com/"` + mdLink + `>&lt;img src=x onerror=alert(1)&gt;</a></p></div>`},
	{name: "link title with quotes", text: "[x](https://example.com/ \"a\\\" onmouseover=alert(1)\")\n",
		want: `<div class="md"><p><a href="https://example.com/"` + mdLink + ` title="a&quot; onmouseover=alert(1)">x</a></p></div>`},
	{name: "entities", text: "&lt;script&gt;alert(1)&lt;/script&gt; &#60;img src=x onerror=alert(1)&#62;\n",
		want: `<div class="md"><p>&lt;script&gt;alert(1)&lt;/script&gt; &lt;img src=x onerror=alert(1)&gt;</p></div>`},
	{name: "code keeps html", text: "`<script>alert(1)</script>`\n\n```html\n<img src=x onerror=alert(1)>\n```\n",
		want: `<div class="md"><p><code>&lt;script&gt;alert(1)&lt;/script&gt;</code></p>` +
			`<pre class="md-code"><code data-lang="html">&lt;img src=x onerror=alert(1)&gt;</code></pre></div>`},
	{name: "fence language", text: "```\" onmouseover=alert(1) x\ncode\n```\n",
		want: `<div class="md"><pre class="md-code"><code data-lang="&quot;">code</code></pre></div>`},
	{name: "nested lists", text: "- a <b>x</b>\n  - <script>alert(1)</script>\n    - [x](javascript:alert(1))\n      1. <img src=x onerror=alert(1)>\n",
		want: `<div class="md"><ul><li>a &lt;b&gt;x&lt;/b&gt;<ul><li><p class="md-source">&lt;script&gt;alert(1)&lt;/script&gt;</p><ul><li>` + mdBadLink("x", "javascript:alert(1)") +
			`<ol><li><p class="md-source">&lt;img src=x onerror=alert(1)&gt;</p></li></ol></li></ul></li></ul></li></ul></div>`},
	{name: "table with html", text: "| <img src=x onerror=alert(1)> | b |\n|---|---|\n| [z](javascript:x) | <script>y</script> |\n",
		want: `<div class="md"><table class="md-table"><thead><tr><th>&lt;img src=x onerror=alert(1)&gt;</th><th>b</th></tr></thead>` +
			`<tbody><tr><td>` + mdBadLink("z", "javascript:x") + `</td><td>&lt;script&gt;y&lt;/script&gt;</td></tr></tbody></table></div>`},
	{name: "table in a list in a quote", text: "> - item\n>\n>   | a |\n>   |---|\n>   | <b>c</b> |\n",
		want: `<div class="md"><blockquote><ul><li><p>item</p><table class="md-table"><thead><tr><th>a</th></tr></thead>` +
			`<tbody><tr><td>&lt;b&gt;c&lt;/b&gt;</td></tr></tbody></table></li></ul></blockquote></div>`},
	{name: "task item with html", text: "- [x] <img src=x onerror=alert(1)>\n",
		want: `<div class="md"><ul><li class="md-task"><input class="md-check" type="checkbox" checked disabled></input> &lt;img src=x onerror=alert(1)&gt;</li></ul></div>`},
}

// TestMarkdownShowsHTMLAsText: markdown carrying HTML, scripts and
// script URLs in every place a renderer might let them through becomes
// text and inert elements: no element of the HTML, links only to http(s)
// and mailto (the rest shown as text with the URL in a title), images
// never loaded, no HTML sink used (TestConsoleShowsHostile and
// TestBrowserRunTimeline check it on the run page, in node and Chromium).
func TestMarkdownShowsHTMLAsText(t *testing.T) {
	t.Parallel()
	checkCases(t, mdHostileCases)
}

// TestMarkdownBoundsHostileText: text built to make the parser slow or
// deep is shown, bounded: past 200,000 characters or 32 containers opened
// on one line, plain; a block whose inline text is over 5,000 characters,
// as its text; inline parsing stops after its time budget (the remaining
// blocks shown as their text); quotes and lists past 12 levels, as their
// source.
func TestMarkdownBoundsHostileText(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("word ", 40001)
	deep := strings.Repeat("- ", 40) + "x\n"
	bigPara := "**b** " + strings.Repeat("x", 5000)
	// Paragraphs of unmatched emphasis delimiters: about 17 ms each for
	// marked on a 2-core machine (markedjs/marked#4099), 190 of them:
	// over 3 s unbounded.
	slow := strings.Repeat(strings.Repeat("*a_", 333)+"\n\n", 190) + "**last**\n"
	quotes := strings.Repeat("> ", 13) + "x\n"
	checkCases(t, []mdCase{
		{name: "over 200,000 characters", text: long + "**b**",
			want: `<div class="md plain">` + long + `**b**</div>`},
		{name: "40 nested list items on a line", text: deep, want: `<div class="md plain">` + deep + `</div>`},
		{name: "a paragraph of 5,006 characters", text: bigPara + "\n\n**c**\n",
			want: `<div class="md"><p><span class="md-source">` + bigPara + `</span></p><p><strong>c</strong></p></div>`},
		{name: "13 nested quotes", text: quotes,
			want: `<div class="md">` + strings.Repeat("<blockquote>", 12) + `<blockquote><span class="md-source">&gt; x</span></blockquote>` + strings.Repeat("</blockquote>", 12) + `</div>`},
		{name: "unmatched emphasis", text: slow, contains: []string{`<span class="md-source">**last**</span>`}, lacks: []string{`<strong>last</strong>`}},
	})
}
